"""Kill the controller during a job and start it again on the same state dir: the job and its
history are still known, the running workers re-register, their ranks are re-attached, and the job
finishes."""
import time

import harness


class ControllerRestartTest(harness.ClusterTest):
    def test_controller_killed_mid_job(self):
        c = self.cluster
        job = c.submit(c.write_job("long.yaml", harness.commcheck_job("survivor", rounds=60)))
        c.wait_for(job, lambda d: d["summary"]["state"] == "JOB_RUNNING" and
                   int(d["summary"].get("step", 0)) >= 1, what="running with progress")
        c.kill_controller()
        time.sleep(1.0)
        c.start(wait_workers=False)
        d = c.job(job)  # known right after the restart, with its history
        self.assertEqual(d["summary"]["job_id"], job)
        self.assertTrue(any(e["kind"] == "submitted" for e in d["events"]))
        d = c.wait_state(job, ("JOB_SUCCEEDED", "JOB_FAILED"), timeout=180)
        self.assertEqual(d["summary"]["state"], "JOB_SUCCEEDED", d)
        # The workers are the same processes (adopted, not started twice).
        ws = c.cli_json("workers")["workers"]
        self.assertEqual(len(ws), 4)
        kinds = [e["kind"] for e in d["events"]]
        print("\nREPORT events across the controller restart:",
              "\n  ".join([""] + [f'{e["kind"]}: {e.get("message", "")}' for e in d["events"]]))
        # The ranks kept running while the controller was away and were re-attached: no restart.
        self.assertEqual(int(d["summary"].get("restarts", 0)), 0, kinds)
        self.assertEqual(kinds.count("reattached"), 4, kinds)


if __name__ == "__main__":
    harness.main()
