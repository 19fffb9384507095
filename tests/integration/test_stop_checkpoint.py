"""A stop that is no failure keeps the step in progress. `furnace cancel` and an agent stopped to
drain its worker (SIGTERM) give a train job's ranks checkpoint.stop_grace_s: each rank's agent
sends it SIGUSR1, every rank agrees in its next step's all-reduce to stop after that step, and
they write its checkpoint before they exit. The job here checkpoints only at its end
(checkpoint.every 0), so without this a cancel or a drain would lose every step: a job resubmitted
on the cancelled one's directory resumes from the step the cancel reached, and the drained job's
next attempt (or the next attempt after a controller stopped with its local workers) from the
step the stop reached, without spending a restart."""
import os
import signal
import time

import harness


def job(name, ckpt, steps, extra=""):
    return f"""name: {name}
kind: train
model: {{vocab: 64, seq_len: 32, d_model: 32, heads: 4, layers: 2, expert_ffn: 64}}
moe: {{experts: 4, top_k: 2}}
parallel: {{dp: 2, micro_batch: 4, micro_batches: 2}}
train: {{steps: {steps}, lr: 3.0e-3, warmup: 5, seed: 11, schedule: constant}}
data: {{source: markov, seed: 5}}
checkpoint: {{dir: {ckpt}, every: 0, keep: 3{extra}}}
recovery: {{max_restarts: 0}}
"""


def latest_step(ckpt):
    with open(os.path.join(ckpt, "LATEST")) as f:
        return int(f.read().split()[0].split("-")[-1])


class StopCheckpointTest(harness.ClusterTest):
    WORKERS = 3

    def wait_step(self, job_id, at_least, timeout=120):
        return self.cluster.wait_for(job_id, lambda d: int(d["summary"].get("step", 0)) >= at_least,
                                     timeout, f"step {at_least}")

    def ranks_kept_their_step(self, job_id, ckpt, why):
        """Once the ended job's ranks are out: each wrote the checkpoint of the step it stopped
        at, the newest in `ckpt`, and one says it stopped for `why` (a rank may learn of the stop
        from its peer before its own agent's signal comes: it then says it stopped with the peers
        of its attempt). Returns that step."""
        self.cluster.wait_workers(3, timeout=60)
        d = self.cluster.job(job_id)
        step = latest_step(ckpt)
        reasons = [r.get("exit", "") for r in d["attempts"][-1]["ranks"]]
        print(f"\nREPORT {why}: checkpoint of step {step}; rank ends: {reasons}")
        self.assertTrue(any(why in r for r in reasons), reasons)
        for reason in reasons:
            self.assertIn(f"after step {step} of 100000, its checkpoint written", reason)
        return step

    def next_attempt_resumes_at(self, job_id, ckpt, what):
        """The job's next attempt resumes from the newest checkpoint in `ckpt`, of a step at least
        8, without spending a restart (the stop was no failure); then the job is cancelled.
        Returns that step."""
        c = self.cluster
        d = c.wait_for(job_id, lambda d: len(d["attempts"]) >= 2 and self.restored(d), 120,
                       "the next attempt's restore")
        step = latest_step(ckpt)
        self.assertGreaterEqual(step, 8)
        print(f"\nREPORT {what}: {self.restored(d)[0]}")
        self.assertIn(f"resumed from the checkpoint of step {step} ", self.restored(d)[0])
        self.assertEqual(int(d["summary"].get("restarts", 0)), 0, d["summary"])  # no failure
        r = c.cli("cancel", job_id)
        self.assertEqual(r.returncode, 0, r.stderr)
        c.wait_state(job_id, "JOB_CANCELLED")
        c.wait_workers(3, timeout=60)
        return step

    def restored(self, d):
        return [e["message"] for e in d["events"] if e["kind"] == "checkpoint_restored"]

    def test_cancel_writes_the_step_it_stopped_at_and_a_resubmit_resumes_there(self):
        c = self.cluster
        ckpt = os.path.join(c.state, "ckpt-cancel")
        first = c.submit(c.write_job("first.yaml", job("first", ckpt, 100000)))
        self.wait_step(first, 8)
        # --wait returns once both ranks are out, and says how they ended.
        r = c.cli("cancel", "--wait", first)
        self.assertEqual(r.returncode, 0, r.stderr)
        print(f"\nREPORT furnace cancel --wait:\n{r.stdout}")
        self.assertIn(f"job {first} is CANCELLED: its 2 ranks stop after their step and write its "
                      "checkpoint", r.stdout)
        self.assertTrue(all(rank["state"] == "RANK_STATE_EXITED"
                            for rank in c.job(first)["attempts"][-1]["ranks"]))
        step = self.ranks_kept_their_step(first, ckpt, "job cancelled")
        self.assertGreaterEqual(step, 8)
        self.assertIn(f"after step {step} of 100000, its checkpoint written", r.stdout)

        second = c.submit(c.write_job("second.yaml", job("second", ckpt, step + 3)))
        d = c.wait_state(second, harness.FINAL, timeout=180)
        self.assertEqual(d["summary"]["state"], "JOB_SUCCEEDED", d["summary"])
        self.assertEqual(len(self.restored(d)), 1, d["events"])
        self.assertIn(f"resumed from the checkpoint of step {step} ", self.restored(d)[0])

    def test_a_drained_worker_hands_the_job_on_at_the_step_it_reached(self):
        c = self.cluster
        ckpt = os.path.join(c.state, "ckpt-drain")
        j = c.submit(c.write_job("drain.yaml", job("drain", ckpt, 100000)))
        d = self.wait_step(j, 8)
        worker = d["attempts"][-1]["ranks"][0]["worker_id"]
        pid = next(int(w["pid"]) for w in c.cli_json("workers")["workers"]
                   if w["worker_id"] == worker)
        os.kill(pid, signal.SIGTERM)  # the agent drains: it says it leaves, then stops its rank
        self.next_attempt_resumes_at(j, ckpt, "drain")

    def test_a_stopped_controller_lets_its_local_workers_save_the_step(self):
        c = self.cluster
        ckpt = os.path.join(c.state, "ckpt-controller")
        j = c.submit(c.write_job("stop.yaml", job("stop", ckpt, 100000)))
        self.wait_step(j, 8)
        # What a service manager or the demo's cleanup does: the controller records the attempt
        # interrupted, then stops its local workers, whose agents give the ranks the job's
        # checkpoint.stop_grace_s before SIGTERM.
        c.controller.send_signal(signal.SIGTERM)
        c.controller.wait(timeout=120)
        self.assertEqual(harness.processes_under(c.state), [])  # workers and ranks all out
        step = latest_step(ckpt)
        self.assertGreaterEqual(step, 8)
        c.start(wait_workers=False)  # the job takes two of them at once
        self.assertEqual(self.next_attempt_resumes_at(j, ckpt, "controller stop"), step)

    def test_a_job_past_its_time_limit_ends_with_the_step_it_reached(self):
        c = self.cluster
        ckpt = os.path.join(c.state, "ckpt-limit")
        # resources.time_limit_s counts from the first attempt's start (placement and start-up
        # included): 10 s leaves this tiny model hundreds of steps, even on a slow machine.
        j = c.submit(c.write_job("limit.yaml", job("limit", ckpt, 100000).replace(
            "recovery:", "resources: {time_limit_s: 10}\nrecovery:")))
        d = c.wait_state(j, harness.FINAL, timeout=120)
        self.assertEqual(d["summary"]["state"], "JOB_FAILED", d["summary"])
        self.assertRegex(d["summary"]["cause"],
                         r"^time limit reached: 1\d s since its first attempt started "
                         r"\(resources.time_limit_s 10\); its ranks stop after their step and "
                         r"write its checkpoint$")
        self.assertGreater(self.ranks_kept_their_step(j, ckpt, "job time limit reached"), 0)


if __name__ == "__main__":
    harness.main()
