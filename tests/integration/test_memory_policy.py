"""memory.policy through the control plane: a tiny job trained with `selective` (norm and GELU
outputs dropped after forward, rebuilt in backward) ends with exactly the parameters of the same
job under `none`, reports a smaller activation peak, and its rank says which policy it ran."""
import json
import os
import struct

import harness


def job(name, policy):
    return f"""name: {name}
kind: train
model: {{vocab: 64, seq_len: 32, d_model: 32, heads: 4, layers: 4, expert_ffn: 64}}
moe: {{experts: 4, top_k: 2}}
parallel: {{micro_batch: 4, micro_batches: 2}}
memory: {{policy: {policy}}}
train: {{steps: 12, lr: 3.0e-3, warmup: 2, seed: 11}}
data: {{source: markov, seed: 5}}
checkpoint: {{every: 6, keep: 1}}
"""


def read_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    return {name: data[t["data_offsets"][0]:t["data_offsets"][1]]
            for name, t in header.items() if name != "__metadata__"}


def activation_peak(d):
    memory = d["telemetry"]["memory"]
    return int(memory.get("activation_peak_bytes", memory.get("activationPeakBytes", 0)))


class MemoryPolicyTest(harness.ClusterTest):
    WORKERS = 2

    def export(self, job_id, name):
        path = os.path.join(self.cluster.state, name)
        r = self.cluster.cli("export", job_id, "--format", "safetensors", "-o", path)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        return read_safetensors(path)

    def test_selective_trains_bit_identical_to_none(self):
        c = self.cluster
        none = c.submit(c.write_job("none.yaml", job("none", "none")))
        selective = c.submit(c.write_job("selective.yaml", job("selective", "selective")))
        d_none = c.wait_state(none, harness.FINAL, timeout=300)
        d_sel = c.wait_state(selective, harness.FINAL, timeout=300)
        self.assertEqual(d_none["summary"]["state"], "JOB_SUCCEEDED", d_none["summary"])
        self.assertEqual(d_sel["summary"]["state"], "JOB_SUCCEEDED", d_sel["summary"])
        self.assertIn("memory policy selective", c.cli("logs", selective).stdout)
        self.assertIn("memory policy none", c.cli("logs", none).stdout)
        self.assertLess(activation_peak(d_sel), activation_peak(d_none))
        self.assertGreater(activation_peak(d_sel), 0)
        a, b = self.export(none, "none.safetensors"), self.export(selective, "sel.safetensors")
        self.assertEqual(sorted(a), sorted(b))
        self.assertIn("layers.3.moe.experts.3.w2", a)
        for name in a:
            self.assertTrue(a[name] == b[name], f"{name} differs between none and selective")


if __name__ == "__main__":
    harness.main()
