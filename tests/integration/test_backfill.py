"""Backfill beside a reservation, with real processes: a job pending past --reserve-after holds
the next workers to free up; a later job whose resources.time_limit_s ends it before the time
limits of the jobs on those workers free them starts anyway (a `backfill` event says why), and
one whose limit ends later waits, told by when its limit would have to end it."""
import time

import harness


def job(name, ranks, limit=0):
    """A commcheck job that runs until it is stopped, at a slow pace (a round of 1 MiB
    all-reduces, so its ranks report a few rounds a second, not hundreds)."""
    extra = f"resources: {{time_limit_s: {limit}}}\n" if limit else ""
    return f"""name: {name}
kind: commcheck
parallel: {{dp: {ranks}}}
commcheck: {{min_bytes: 1MiB, max_bytes: 1MiB, iters: 20, rounds: 100000, timeout_s: 20,
             collectives: [allreduce]}}
{extra}"""


class BackfillTest(harness.ClusterTest):
    WORKERS = 3

    def setUp(self):
        self.cluster = harness.Cluster(workers=self.WORKERS,
                                       extra_args=["--reserve-after", "1"]).start()

    def test_a_short_job_backfills_beside_a_reservation_and_a_long_one_waits(self):
        c = self.cluster
        run = c.submit(c.write_job("run.yaml", job("run", 2, limit=120)))
        c.wait_state(run, "JOB_RUNNING", timeout=60)
        big = c.submit(c.write_job("big.yaml", job("big", 3)))
        time.sleep(2)  # past --reserve-after: big holds the next 3 workers to free up
        self.assertEqual(c.job(big)["summary"]["state"], "JOB_PENDING")

        # Ends by its start + 200 + 20: after run's workers are free (its start + 120 + 20).
        late = c.submit(c.write_job("late.yaml", job("late", 1, limit=200)))
        d = c.wait_for(late, lambda d: "backfill" in d["summary"].get("waiting", ""), 30,
                       "the backfill hint")
        print(f"\nREPORT waiting: {d['summary']['waiting']}")
        self.assertIn(f"waits behind job {big}, pending over 1 s", d["summary"]["waiting"])
        self.assertIn(f"it could start beside job {big} as a backfill if resources.time_limit_s "
                      "ended it by ", d["summary"]["waiting"])

        brief = c.submit(c.write_job("brief.yaml", job("brief", 1, limit=30)))
        d = c.wait_state(brief, "JOB_RUNNING", timeout=60)
        backfill = [e["message"] for e in d["events"] if e["kind"] == "backfill"]
        print(f"REPORT backfill: {backfill}")
        self.assertEqual(len(backfill), 1, d["events"])
        self.assertIn(f"backfilled beside job {big}'s reservation: resources.time_limit_s 30 "
                      "ends it by ", backfill[0])
        self.assertEqual(c.job(big)["summary"]["state"], "JOB_PENDING")
        self.assertEqual(c.job(late)["summary"]["state"], "JOB_PENDING")
        r = c.cli("cancel", "--wait", run, brief, late, big)
        self.assertEqual(r.returncode, 0, r.stderr)


if __name__ == "__main__":
    harness.main()
