"""The commcheck job end to end: 4 local workers, every collective verified by value."""
import os
import time

import harness


class CommcheckTest(harness.ClusterTest):
    def test_commcheck_succeeds_and_reports_bandwidth(self):
        c = self.cluster
        t0 = time.time()
        r = c.cli("submit", os.path.join(harness.SRC_DIR, "configs", "commcheck.yaml"), "--watch",
                  timeout=300)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr + c.dump_logs())
        wall = time.time() - t0
        jobs = c.cli_json("jobs")["jobs"]
        self.assertEqual(len(jobs), 1)
        d = c.job(jobs[0]["job_id"])
        s = d["summary"]
        self.assertEqual(s["state"], "JOB_SUCCEEDED")
        self.assertEqual(s["restarts"], 0)
        self.assertEqual(len(d["attempts"]), 1)
        attempt = d["attempts"][0]
        self.assertEqual([r["state"] for r in attempt["ranks"]], ["RANK_STATE_EXITED"] * 4)
        self.assertEqual(len({r["worker_id"] for r in attempt["ranks"]}), 4)
        # 4 collectives x sizes 4KiB..4MiB by 4 = 6 sizes, each verified by value.
        comm = d["comm"]
        self.assertEqual(len(comm), 24, comm)
        self.assertTrue(all(c_["verified"] and int(c_.get("errors", 0)) == 0 for c_ in comm))
        self.assertEqual({c_["collective"] for c_ in comm},
                         {"allreduce", "allgather", "alltoall", "broadcast"})
        self.assertTrue(all(c_["busbw_gbps"] > 0 and c_["world_size"] == 4 for c_ in comm))
        # The human status shows the bandwidth table.
        text = c.cli("status", s["job_id"]).stdout
        self.assertIn("busbw", text.lower())
        self.assertIn("alltoall", text)
        started = attempt["all_running_unix"] - s["submitted_unix"]
        print(f"\nREPORT submit -> all 4 ranks running: {started:.3f} s; whole job {wall:.2f} s")
        print(text)


if __name__ == "__main__":
    harness.main()
