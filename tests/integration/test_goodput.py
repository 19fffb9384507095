"""Goodput end to end: a rank killed after its attempt passed a checkpoint costs a restart and the
steps redone since that checkpoint, and `furnace status`, its JSON and /metrics say so; under
`checkpoint.every: auto` the ranks pick the Young/Daly interval, say it in the log and the
telemetry, and the next attempt is told the failure the controller saw."""
import re
import urllib.request

import harness


def train_job(name, every, extra=""):
    return f"""name: {name}
kind: train
model: {{vocab: 64, seq_len: 32, d_model: 32, heads: 2, layers: 2, expert_ffn: 64}}
moe: {{experts: 4, top_k: 2}}
parallel: {{micro_batch: 4, micro_batches: 1}}
train: {{steps: 40, lr: 3.0e-3, warmup: 5, seed: 3}}
data: {{source: markov, seed: 5}}
checkpoint: {{every: {every}, keep: 2}}
recovery:
  max_restarts: 2
  backoff: {{initial_s: 0.2, max_s: 1.0, multiplier: 2.0}}
fault: {{mode: crash, rank: 0, at_step: 25}}
{extra}"""


def metric(text, name, **labels):
    """The value of the sample of `name` whose labels include `labels`."""
    for line in text.splitlines():
        if line.startswith("#") or not line.startswith(name + "{"):
            continue
        if all(f'{k}="{v}"' in line for k, v in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"no sample {name}{labels} in\n{text}")


class GoodputTest(harness.ClusterTest):
    WORKERS = 1

    def test_a_killed_rank_shows_restart_and_redone_time_lost(self):
        c = self.cluster
        # Checkpoints after steps 10 and 20; the rank crashes after step 25 in attempt 1, so
        # attempt 2 resumes from step 20 and computes steps 21..25 again.
        job = c.submit(c.write_job("goodput.yaml", train_job("goodput", 10)))
        d = c.wait_state(job, ("JOB_SUCCEEDED", "JOB_FAILED"), timeout=240)
        self.assertEqual(d["summary"]["state"], "JOB_SUCCEEDED", d["summary"])
        self.assertEqual(int(d["summary"]["restarts"]), 1)
        # The ranks' last step records may come after their exit reports (agents push every
        # telemetry_flush_s; attempt 2's 20 steps take tens of ms): wait until all 40 are in.
        d = c.wait_for(job, lambda d: int(d["goodput"].get("productive_steps", 0)) >= 40,
                       timeout=30, what="every step's telemetry")
        g = d["goodput"]
        self.assertEqual(int(g["redone_steps"]), 5, g)
        self.assertEqual(int(g["productive_steps"]), 40, g)
        self.assertGreater(g["redone_seconds"], 0, g)
        self.assertGreater(g["restart_seconds"], 0, g)
        self.assertGreater(g["startup_seconds"], 0, g)
        self.assertGreater(g["checkpoint_stall_seconds"], 0, g)
        self.assertGreater(g["ratio"], 0, g)
        self.assertLess(g["ratio"], 1, g)
        self.assertEqual(g["failures"], 1, g)
        lost = (g["restart_seconds"] + g["redone_seconds"] + g["checkpoint_stall_seconds"] +
                g["startup_seconds"])
        self.assertAlmostEqual(g["ratio"], g["productive_seconds"] / (g["productive_seconds"] + lost),
                               places=9)

        text = c.cli("status", job).stdout
        self.assertIn("\ngoodput\n", text)
        self.assertRegex(text, r"redone [0-9.]+ m?s \(5 steps\)")
        self.assertRegex(text, r"failures +1, MTBF")

        with urllib.request.urlopen(f"http://127.0.0.1:{c.metrics_port}/metrics", timeout=5) as r:
            exposition = r.read().decode()
        self.assertLess(metric(exposition, "furnace_job_goodput_ratio", job=job), 1)
        self.assertGreater(metric(exposition, "furnace_job_lost_seconds_total", job=job,
                                  cause="restart"), 0)
        self.assertGreater(metric(exposition, "furnace_job_lost_seconds_total", job=job,
                                  cause="redone"), 0)
        self.assertEqual(metric(exposition, "furnace_job_redone_steps_total", job=job), 5)
        self.assertAlmostEqual(
            metric(exposition, "furnace_job_productive_seconds_total", job=job),
            g["productive_seconds"], places=3)
        print(f"\nREPORT goodput {g['ratio']:.3f}: productive {g['productive_seconds']:.2f} s, "
              f"restart {g['restart_seconds']:.2f} s, redone {g['redone_seconds']:.2f} s, "
              f"stall {g['checkpoint_stall_seconds']:.3f} s, start-up {g['startup_seconds']:.2f} s")

    def test_auto_interval_is_chosen_logged_and_told_the_failures(self):
        c = self.cluster
        job = c.submit(c.write_job("auto.yaml", train_job("auto", "auto")))
        d = c.wait_state(job, ("JOB_SUCCEEDED", "JOB_FAILED"), timeout=240)
        self.assertEqual(d["summary"]["state"], "JOB_SUCCEEDED", d["summary"])
        first = c.cli("logs", job, "--attempt", "1").stdout
        self.assertIn("checkpoint.every auto: MTBF 86400.0 s (the prior: no failure yet)", first)
        # The probe after the first step, then the Young/Daly interval once the stall is known.
        self.assertRegex(first, r"checkpoint\.every auto: interval \d+ steps")
        second = c.cli("logs", job, "--attempt", "2").stdout
        self.assertIn("1 failure(s) observed", second)
        m = re.search(r"checkpoint\.every auto: interval (\d+) steps", second)
        self.assertIsNotNone(m, second)
        self.assertGreater(int(d["telemetry"]["checkpoint_interval_steps"]), 0, d["telemetry"])
        self.assertGreater(int(d["goodput"]["checkpoint_interval_steps"]), 0, d["goodput"])
        self.assertIn("checkpoint.every auto:", c.cli("status", job).stdout)


if __name__ == "__main__":
    harness.main()
