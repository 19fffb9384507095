"""Routing spikes (moe.spikes) through the control plane: a train job on an expert-parallel layout
with spikes reaches the ranks (their log says so), the steps its series marks as spike steps are
exactly those runtime/model/spikes.cc draws from the seed, and a max_ratio above
moe.experts / moe.top_k is refused at submit naming the field."""
import json
import urllib.request

import harness

STEPS = 16
SEED = 3
PROBABILITY = 0.5

_MASK = (1 << 64) - 1
_STEP_DOMAIN = 0x5350494B45535445  # "SPIKESTE", as in runtime/model/spikes.cc


def _splitmix64(z):
    z = (z + 0x9E3779B97F4A7C15) & _MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
    return z ^ (z >> 31)


def _hash_key(words):  # runtime/data/counter_rng.h HashKey
    h = 0x243F6A8885A308D3
    for w in words:
        h = _splitmix64(h ^ _splitmix64(w))
    return h


def is_spike_step(step):
    """model::IsSpikeStep: the first draw of the counter stream keyed by (domain, seed, step)."""
    draw = (_splitmix64(_hash_key([_STEP_DOMAIN, SEED, step])) >> 11) * 2.0 ** -53
    return draw < PROBABILITY


def train_job(name, max_ratio):
    return f"""name: {name}
kind: train
model: {{vocab: 32, seq_len: 16, d_model: 32, heads: 4, layers: 2, expert_ffn: 64}}
moe:
  experts: 8
  top_k: 2
  spikes: {{probability: {PROBABILITY}, max_ratio: {max_ratio}, seed: {SEED}}}
parallel: {{dp: 2, ep: 2, micro_batch: 4, micro_batches: 2}}
train: {{steps: {STEPS}, lr: 3.0e-3, warmup: 4, seed: 5}}
data: {{source: markov, seed: 7}}
recovery:
  max_restarts: 0
"""


class SpikesTest(harness.ClusterTest):
    WORKERS = 2

    def setUp(self):
        self.metrics_port = harness.free_port()
        self.cluster = harness.Cluster(workers=self.WORKERS,
                                       metrics_port=self.metrics_port).start()

    def test_spike_steps_follow_the_seed_on_every_rank(self):
        c = self.cluster
        job = c.submit(c.write_job("spikes.yaml", train_job("spikes", 4)))
        d = c.wait_state(job, harness.FINAL, timeout=300)
        self.assertEqual(d["summary"]["state"], "JOB_SUCCEEDED", d["summary"])
        for rank in (0, 1):
            logs = c.cli("logs", job, "--rank", str(rank)).stdout
            self.assertIn("routing spikes: 50.0% of the steps, busiest expert up to 4.00x the "
                          "mean, seed 3", logs)
        url = f"http://127.0.0.1:{self.metrics_port}/api/jobs/{job}/series?max=1000"
        with urllib.request.urlopen(url, timeout=5) as r:
            steps = json.loads(r.read().decode())["steps"]
        self.assertEqual(len(steps), STEPS)
        got = {int(s["step"]) - 1: bool(s.get("routing_spike", False)) for s in steps}
        want = {s: is_spike_step(s) for s in range(STEPS)}
        self.assertEqual(got, want)
        self.assertTrue(0 < sum(want.values()) < STEPS, want)
        # A spike pushes the busiest expert of every MoE layer to r times the mean, r up to 4:
        # spike steps are more imbalanced than the others on average.
        def mean_imbalance(spike):
            values = [max(s["imbalance"]) for s in steps if got[int(s["step"]) - 1] == spike]
            return sum(values) / len(values)
        print(f"mean worst-layer imbalance: spike steps {mean_imbalance(True):.3f}, "
              f"other steps {mean_imbalance(False):.3f}")
        self.assertGreater(mean_imbalance(True), mean_imbalance(False))

    def test_ratio_above_experts_over_top_k_is_refused_at_submit(self):
        c = self.cluster
        r = c.cli("submit", c.write_job("bad.yaml", train_job("badspikes", 4.5)))
        self.assertEqual(r.returncode, 2, r.stdout + r.stderr)
        self.assertIn("moe.spikes.max_ratio: must be <= moe.experts / moe.top_k (= 8 / 2 = 4)",
                      r.stderr)
        self.assertEqual(c.cli_json("jobs").get("jobs", []), [])


if __name__ == "__main__":
    harness.main()
