"""Held-out evaluation and text generation through the whole stack: a Markov job on two ranks
(dp 2, ep 2) with eval.every evaluates at the steps asked for, the held-out loss reaches the job's
status, /metrics (furnace_job_eval_loss) and the report; then `furnace sample` continues a prompt
from the job's committed checkpoint (reassembled from both ranks' shards): greedy twice gives the
same ids, a fixed seed repeats, and every id is a symbol of the chain."""
import json
import os
import urllib.request

import harness

JOB = """name: evalsample
kind: train
model: {vocab: 32, seq_len: 32, d_model: 32, heads: 4, layers: 2, expert_ffn: 64}
moe: {experts: 4, top_k: 2}
parallel: {dp: 2, ep: 2, micro_batch: 4, micro_batches: 2}
train: {steps: 30, lr: 3.0e-3, warmup: 5, seed: 3}
data: {source: markov, seed: 9}
eval: {every: 10, batches: 3}
checkpoint: {every: 10, keep: 2}
"""


class EvalSampleTest(harness.ClusterTest):
    WORKERS = 2

    def test_eval_reported_everywhere_and_sample_from_the_checkpoint(self):
        c = self.cluster
        job = c.submit(c.write_job("job.yaml", JOB))
        d = c.wait_state(job, ("JOB_SUCCEEDED", "JOB_FAILED"), timeout=300)
        self.assertEqual(d["summary"]["state"], "JOB_SUCCEEDED", d["summary"])
        ev = d["last_eval"]
        self.assertEqual(int(ev["step"]), 30)
        self.assertEqual(int(ev["batches"]), 3)
        self.assertEqual(int(ev["tokens"]), 3 * 4 * 32)
        self.assertGreater(ev["loss"], 0)
        self.assertIn("eval after step 10: held-out loss", c.cli("logs", job).stdout)

        series = c.cli_json("report", job, "-o", os.path.join(c.state, "report"))
        self.assertTrue(os.path.exists(os.path.join(c.state, "report", "eval_loss.svg")), series)
        with open(os.path.join(c.state, "report", "summary.txt")) as f:
            self.assertIn("3 evaluations", f.read())

        with urllib.request.urlopen(f"http://127.0.0.1:{c.metrics_port}/metrics", timeout=10) as r:
            text = r.read().decode()
        self.assertIn(f'furnace_job_eval_loss{{job="{job}"}}', text)

        greedy = c.cli("sample", job, "--prompt", "1 2 3", "-n", "12", "--temperature", "0")
        self.assertEqual(greedy.returncode, 0, greedy.stderr)
        ids = [int(x) for x in greedy.stdout.split()]
        self.assertEqual(len(ids), 12)
        self.assertTrue(all(0 <= i < 32 for i in ids), ids)
        self.assertIn(f"from job {job} step 30", greedy.stderr)
        again = c.cli("sample", job, "--prompt", "1 2 3", "-n", "12", "--temperature", "0")
        self.assertEqual(again.stdout, greedy.stdout)

        a = c.cli_json("sample", job, "--prompt", "1 2 3", "-n", "12", "--seed", "4",
                       "--step", "20")
        b = c.cli_json("sample", job, "--prompt", "1 2 3", "-n", "12", "--seed", "4",
                       "--step", "20")
        self.assertEqual(a["tokens"], b["tokens"])
        self.assertEqual(int(a["step"]), 20)

        bad = c.cli("sample", job, "--prompt", "1 99", "-n", "3")
        self.assertNotEqual(bad.returncode, 0)
        self.assertIn("token 99", bad.stderr)


if __name__ == "__main__":
    harness.main()
