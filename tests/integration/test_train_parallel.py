"""Parallel train jobs through the control plane: a 4-rank layout (pipeline x tensor x expert
parallel) trains, reports per-rank communication bytes, survives a SIGKILLed rank by resuming
every rank from the last committed checkpoint (per-rank shards + manifest) and ends with shards
byte-identical to an uninterrupted twin; a layout that does not fit is refused at submit."""
import glob
import os
import signal
import urllib.request

import harness


def layout_job(name, ckpt_dir, steps=60, every=20):
    return f"""name: {name}
kind: train
model: {{vocab: 64, seq_len: 32, d_model: 64, heads: 4, layers: 4, moe_every: 2, dense_ffn: 128,
         expert_ffn: 64}}
moe: {{experts: 4, top_k: 2}}
parallel: {{pp: 2, tp: 2, ep: 2, micro_batch: 4, micro_batches: 2}}
train: {{steps: {steps}, lr: 3.0e-3, warmup: 5, seed: 3}}
data: {{source: markov, seed: 5}}
checkpoint: {{dir: {ckpt_dir}, every: {every}, keep: 2}}
recovery:
  max_restarts: 2
  backoff: {{initial_s: 0.2, max_s: 1.0, multiplier: 2.0}}
"""


def final_shards(ckpt_dir):
    with open(os.path.join(ckpt_dir, "LATEST")) as f:
        step = int(f.read())
    step_dir = os.path.join(ckpt_dir, "step-%08d" % step)
    shards = {}
    for path in sorted(glob.glob(os.path.join(step_dir, "shard-*.bin"))):
        with open(path, "rb") as f:
            shards[os.path.basename(path)] = f.read()
    return step, shards


class TrainParallelTest(harness.ClusterTest):
    WORKERS = 4

    def test_sigkill_of_one_rank_resumes_all_ranks_bit_exact(self):
        c = self.cluster
        ref_dir = os.path.join(c.state, "ckpt-ref")
        victim_dir = os.path.join(c.state, "ckpt-victim")
        ref = c.submit(c.write_job("ref.yaml", layout_job("reference", ref_dir)))
        r = c.wait_state(ref, ("JOB_SUCCEEDED", "JOB_FAILED"), timeout=300)
        self.assertEqual(r["summary"]["state"], "JOB_SUCCEEDED", r["summary"])
        self.assertEqual(int(r["summary"].get("restarts", 0)), 0)
        self.assertEqual(len(r["attempts"][0]["ranks"]), 4)
        # Per-collective bytes from the ranks reach the controller's /metrics.
        with urllib.request.urlopen(f"http://127.0.0.1:{c.metrics_port}/metrics") as resp:
            text = resp.read().decode()
        for op in ("all_reduce", "all_to_all", "send", "recv"):
            line = [x for x in text.splitlines()
                    if x.startswith("furnace_comm_bytes_total{") and f'job="{ref}"' in x and
                    f'op="{op}"' in x]
            self.assertEqual(len(line), 1, op)
            self.assertGreater(float(line[0].split()[-1]), 0, line[0])
        # Rank 0's last step has bytes, time and calls per (collective, group): the first stage
        # sends activations over its pipeline group, the experts' tokens go over ep, and the
        # tensor-parallel sums over tp.
        comm = {(x["op"], x["group"]): x for x in r["telemetry"]["comm"]}
        for key in (("COLLECTIVE_OP_SEND", "PARALLEL_GROUP_PP"),
                    ("COLLECTIVE_OP_ALL_TO_ALL", "PARALLEL_GROUP_EP"),
                    ("COLLECTIVE_OP_ALL_REDUCE", "PARALLEL_GROUP_TP")):
            self.assertIn(key, comm, sorted(comm))
            self.assertGreater(int(comm[key]["bytes"]), 0, comm[key])
            self.assertGreater(comm[key]["seconds"], 0, comm[key])
            self.assertGreater(int(comm[key]["calls"]), 0, comm[key])
        self.assertNotIn("PARALLEL_GROUP_UNSPECIFIED", {g for _, g in comm}, sorted(comm))

        victim = c.submit(c.write_job("victim.yaml", layout_job("victim", victim_dir)))
        d = c.wait_for(victim, lambda d: d["summary"]["state"] == "JOB_RUNNING" and
                       int(d["summary"].get("step", 0)) >= 30, timeout=240,
                       what="victim past its first checkpoint")
        # Kill the rank of the last pipeline stage, tensor-parallel rank 1.
        pid = [x for x in d["attempts"][0]["ranks"] if int(x.get("rank", 0)) == 3][0]["pid"]
        os.kill(int(pid), signal.SIGKILL)
        d = c.wait_state(victim, ("JOB_SUCCEEDED", "JOB_FAILED"), timeout=300)
        self.assertEqual(d["summary"]["state"], "JOB_SUCCEEDED", d["summary"])
        self.assertEqual(int(d["summary"]["restarts"]), 1)
        self.assertIn("signal 9", d["attempts"][0]["cause"])
        logs = c.cli("logs", victim, "--attempt", "2").stdout
        self.assertEqual(logs.count("resumed from the checkpoint of step"), 4, logs[-2000:])

        ref_step, ref_shards = final_shards(ref_dir)
        victim_step, victim_shards = final_shards(victim_dir)
        self.assertEqual(ref_step, 60)
        self.assertEqual(victim_step, 60)
        self.assertEqual(sorted(ref_shards), ["shard-%05d.bin" % r for r in range(4)])
        self.assertEqual(sorted(ref_shards), sorted(victim_shards))
        for name in ref_shards:
            self.assertTrue(ref_shards[name] == victim_shards[name],
                            f"{name} differs after the resume")

    def test_layout_that_does_not_fit_is_refused_at_submit(self):
        c = self.cluster
        spec = layout_job("badlayout", os.path.join(c.state, "x")).replace(
            "ep: 2,", "ep: 4,")  # ep 4 does not divide dp * tp = 2
        r = c.cli("submit", c.write_job("bad.yaml", spec))
        self.assertEqual(r.returncode, 2, r.stdout + r.stderr)
        self.assertIn("parallel.ep", r.stderr)
        self.assertEqual(c.cli_json("jobs").get("jobs", []), [])


if __name__ == "__main__":
    harness.main()
