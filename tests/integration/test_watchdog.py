"""Hang detection inside collectives: a `train` rank whose peer is SIGSTOPped mid-training is
found by its own per-phase watchdog (worker/rank_watchdog.h), reported as hung with the phase and
the collective it waits in, and killed by its agent; the controller's event and the attempt's and
job's cause say so. The stopped peer itself is stopped by the recovery."""
import os
import re
import signal
import time

import harness

HANG_S = 8


def train_job(name, ckpt):
    return f"""name: {name}
kind: train
model: {{vocab: 64, seq_len: 16, d_model: 32, heads: 2, layers: 2, expert_ffn: 32}}
moe: {{experts: 2, top_k: 1}}
parallel: {{dp: 2, ep: 2, micro_batch: 2, micro_batches: 1}}
train: {{steps: 100000, lr: 1.0e-3, warmup: 2, seed: 1}}
data: {{source: markov, seed: 3}}
checkpoint: {{dir: {ckpt}, every: 100000, keep: 1}}
recovery:
  max_restarts: 1
  backoff: {{initial_s: 0.2, max_s: 1.0, multiplier: 2.0}}
  heartbeat_timeout_s: 5
  hang_timeout_s: {HANG_S}
  start_timeout_s: 30
"""


class WatchdogTest(harness.ClusterTest):
    WORKERS = 2

    def test_rank_blocked_on_a_stopped_peer_is_reported_hung_in_the_collective(self):
        c = self.cluster
        job = c.submit(c.write_job("hang.yaml", train_job("stall", os.path.join(c.state, "ck"))))
        d = c.wait_for(job, lambda d: d["summary"]["state"] == "JOB_RUNNING" and
                       int(d["summary"].get("step", 0)) >= 3, timeout=60,
                       what="attempt 1 training")
        victim = int(d["attempts"][0]["ranks"][1]["pid"])
        t_stop = time.time()
        os.kill(victim, signal.SIGSTOP)
        try:
            d = c.wait_for(job, lambda d: d["attempts"][0]["state"] == "ATTEMPT_STATE_FAILED",
                           timeout=40, what="attempt 1 failed")
            detected = time.time() - t_stop
        finally:
            r = c.cli("cancel", job)
        cause = d["attempts"][0]["cause"]
        # The rank that was still alive names the phase, the collective and its group. Hung inside
        # a collective, it may be the victim: the controller waits a moment for the report of the
        # rank that hung in its own work, so when the stopped peer's agent finds it frozen (at
        # 1.5 x hang_timeout_s) within that moment, the stopped peer is the cause, rightly.
        frozen = re.search(r"rank 1 on \S+: hung: no sign of life for ([\d.]+) s", cause)
        if frozen is None:
            m = re.search(r"rank 0 on \S+: hung in step (\d+): (\w+) on group (\w+\[0,1\]) "
                          r"\(2 ranks(, peer 1)?\) for ([\d.]+) s", cause)
            self.assertIsNotNone(m, cause)
            self.assertIn(m.group(2), ("all_reduce", "all_to_all", "all_gather",
                                       "reduce_scatter", "broadcast", "recv", "wait_sends",
                                       "barrier"), cause)
            self.assertIn(f"timeout {HANG_S} s (recovery.hang_timeout_s)", cause)
            self.assertIn("hung in step", d["summary"]["cause"])
        self.assertEqual(d["attempts"][0]["failure_kind"], "hang")
        events = [e for e in d["events"] if e["kind"] == "restart"]
        self.assertTrue(events and "hung" in events[-1]["message"], d["events"])
        # Found by the rank's step timeout (with the controller's 3 s wait for a root cause) or
        # the peer's frozen timeout (1.5 x) within it, not Gloo's (30 s): the cause checked above
        # names the watchdog's finding (and the failure kind is a hang, not an error exit), which
        # says so whatever the time it took on a loaded machine.
        self.assertEqual(r.returncode, 0, r.stderr)
        d = c.wait_for(job, lambda d: all(rk["state"] == "RANK_STATE_EXITED"
                                          for rk in d["attempts"][-1]["ranks"]) and
                       d["attempts"][0]["ranks"][1]["state"] == "RANK_STATE_EXITED", timeout=30,
                       what="every rank ended")
        print(f"\nREPORT SIGSTOP of a train rank's peer -> '{cause}' after {detected:.2f} s "
              f"(hang_timeout_s {HANG_S})")


if __name__ == "__main__":
    harness.main()
