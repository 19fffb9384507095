"""The restart ladder with real processes: a worker that fails the pre-training health check (its
rank never arrives) is named, excluded, and the job finishes on a spare; a worker made unavailable
(its agent SIGSTOPped, its rank SIGKILLed) leaves too few workers for the job's layout, so the next
attempt runs under the recovery.shrink layout with the global batch kept."""
import os
import signal

import harness


def worker_ids(c):
    """{slot: worker id} of the cluster's workers."""
    return {int(w.get("slot", 0)): w["worker_id"] for w in c.cli_json("workers")["workers"]}


def event_messages(detail, kind):
    return [e["message"] for e in detail.get("events", []) if e.get("kind") == kind]


class HealthCheckTest(harness.ClusterTest):
    WORKERS = 5  # a 4-rank job and one spare

    def test_worker_failing_the_health_check_is_excluded_and_the_job_finishes_on_a_spare(self):
        c = self.cluster
        bad = worker_ids(c)[1]
        # A rank that never arrives is found once the start timeout has passed (reaching the check
        # is start-up); a short one keeps the test quick.
        spec = harness.commcheck_job("healthcheck", rounds=3, start_timeout_s=12,
                                     extra=f"""  health_check_s: 5
  exclude_s: 600
fault:
  mode: health_check
  worker: {bad}
  every_attempt: true
""")
        job = c.submit(c.write_job("health.yaml", spec))
        d = c.wait_state(job, ("JOB_SUCCEEDED", "JOB_FAILED"), timeout=120)
        self.assertEqual(d["summary"]["state"], "JOB_SUCCEEDED", d["summary"])
        first = d["attempts"][0]
        self.assertEqual(first["failure_kind"], "health_check", first)
        self.assertIn(f"on {bad} never arrived at the health check within 12 s "
                      "(recovery.start_timeout_s)", first["cause"])
        # Not a training failure: the restart budget is untouched.
        self.assertEqual(int(d["summary"].get("restarts", 0)), 0)
        last = d["attempts"][-1]
        self.assertEqual(last["state"], "ATTEMPT_STATE_SUCCEEDED")
        self.assertNotIn(bad, [r["worker_id"] for r in last["ranks"]])
        self.assertTrue(any(bad in x for x in last.get("excluded", [])), last)
        excluded = event_messages(d, "exclude")
        self.assertTrue(any(f"worker {bad} excluded" in m and "usable again when its agent "
                            "restarts" in m for m in excluded), excluded)
        logs = c.cli("logs", job).stdout
        self.assertIn("health check passed", logs)
        self.assertIn("drops out of its health check", logs)


def shrink_train_job(name, ckpt_dir):
    return f"""name: {name}
kind: train
model: {{vocab: 64, seq_len: 16, d_model: 32, heads: 2, layers: 2, expert_ffn: 32}}
moe: {{experts: 4, top_k: 2}}
parallel: {{dp: 4, ep: 4, micro_batch: 2, micro_batches: 1}}
train: {{steps: 150, lr: 3.0e-3, warmup: 2, seed: 3}}
data: {{source: markov, seed: 5}}
checkpoint: {{dir: {ckpt_dir}, every: 5, keep: 2}}
recovery:
  max_restarts: 3
  backoff: {{initial_s: 0.2, max_s: 1.0, multiplier: 2.0}}
  heartbeat_timeout_s: 2
  hang_timeout_s: 20
  shrink:
    - {{dp: 2, ep: 2}}
"""


class ShrinkTest(harness.ClusterTest):
    WORKERS = 4

    def _make_slot_unavailable(self, d, slot):
        """SIGSTOPs the agent on `slot` (it stops heart-beating and never re-registers) and
        SIGKILLs the rank it runs; returns the agent's pid (to SIGCONT at the end)."""
        c = self.cluster
        workers = c.cli_json("workers")["workers"]
        ranks = {r["worker_id"]: r for r in d["attempts"][-1]["ranks"] if r.get("pid")}
        # The worker on `slot` when it runs a rank of this attempt, else the last that does.
        on_slot = [w["worker_id"] for w in workers if int(w.get("slot", 0)) == slot]
        wid = on_slot[0] if on_slot and on_slot[0] in ranks else sorted(ranks)[-1]
        agent = next(int(w["pid"]) for w in workers if w["worker_id"] == wid)
        rank = ranks[wid]
        os.kill(agent, signal.SIGSTOP)
        os.kill(int(rank["pid"]), signal.SIGKILL)
        return wid, agent

    def _shrinks(self, job, ep, shrink_check):
        """Makes slot 3 unavailable once attempt 1 is past step 7; checks that the next attempt
        runs dp 2 (ep `ep` -> ep / 2) on two workers and says so; returns the final detail."""
        c = self.cluster
        d = c.wait_for(job, lambda d: d["summary"]["state"] == "JOB_RUNNING" and
                       int(d["summary"].get("step", 0)) >= 7, timeout=180,
                       what="attempt 1 past its first checkpoint")
        wid, agent = self._make_slot_unavailable(d, 3)
        try:
            d = c.wait_for(job, lambda d: len(d["attempts"]) >= 2 and
                           len(d["attempts"][-1]["ranks"]) == 2, timeout=60,
                           what="an attempt under the shrink layout")
            shrunk = event_messages(d, "shrink")
            self.assertTrue(any(f"shrunk from pp 1 dp 4 tp 1 ep {ep} esp 1 (4 ranks) to pp 1 "
                                f"dp 2 tp 1 ep {max(1, ep // 2)} esp 1 (2 ranks)" in m and
                                f"{wid} excluded (lost: no heartbeat" in m for m in shrunk),
                            shrunk)
            layout = d["attempts"][-1]["parallel"]
            self.assertEqual(int(layout["dp"]), 2)
            shrink_check(d)
            return c.wait_state(job, ("JOB_SUCCEEDED", "JOB_FAILED"), timeout=240)
        finally:
            os.kill(agent, signal.SIGCONT)

    def test_commcheck_shrinks_when_a_worker_is_lost(self):
        c = self.cluster
        spec = harness.commcheck_job("shrinkcc", rounds=150).replace(
            "heartbeat_timeout_s: 5", "heartbeat_timeout_s: 2") + \
            "  shrink:\n    - {dp: 2}\n"
        job = c.submit(c.write_job("shrinkcc.yaml", spec))
        d = self._shrinks(job, 1, lambda d: None)
        self.assertEqual(d["summary"]["state"], "JOB_SUCCEEDED", d["summary"])

    def test_train_dp4_finishes_under_dp2_when_a_worker_is_lost(self):
        """Needs the runtime to load a checkpoint into another layout (issue 12, item 2): until
        then attempt 2 fails at restore with a FailedPrecondition."""
        c = self.cluster
        ckpt = os.path.join(c.state, "ckpt-shrink")
        job = c.submit(c.write_job("shrink.yaml", shrink_train_job("shrinktrain", ckpt)))

        def global_batch_kept(d):
            layout = d["attempts"][-1]["parallel"]
            self.assertEqual(int(layout["micro_batches"]), 2)  # 2 * 1 * 4 = 2 * 2 * 2
            self.assertIn("keeps the global batch at 8 sequences",
                          " ".join(event_messages(d, "shrink")))

        d = self._shrinks(job, 4, global_batch_kept)
        self.assertEqual(d["summary"]["state"], "JOB_SUCCEEDED",
                         [(a["attempt"], a["state"], a.get("cause")) for a in d["attempts"]])
        self.assertEqual(int(d["summary"]["step"]), 150)


if __name__ == "__main__":
    harness.main()
