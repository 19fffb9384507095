"""Bad input is refused before anything starts: clear error, non-zero exit, no trace."""
import os
import subprocess

import harness

GOOD_HEAD = "name: bad\nkind: commcheck\n"


class BadInputTest(harness.ClusterTest):
    CONTROLLER_ARGS = ("--max-time-limit", "86400")

    def check_refused(self, text, *needles):
        c = self.cluster
        path = c.write_job("bad.yaml", text)
        r = c.cli("submit", path)
        self.assertEqual(r.returncode, 2, r.stdout + r.stderr)
        for n in needles:
            self.assertIn(n, r.stderr)
        self.assertIn("bad.yaml", r.stderr)
        self.assertEqual(c.cli_json("jobs").get("jobs", []), [])
        ws = c.cli_json("workers")["workers"]
        self.assertTrue(all(w["state"] == "WORKER_STATE_READY" for w in ws))

    def test_malformed_yaml(self):
        self.check_refused(GOOD_HEAD + "parallel: {dp: 4\n", "malformed YAML")

    def test_unknown_field(self):
        self.check_refused(GOOD_HEAD + "parallel:\n  dpp: 4\n", "parallel.dpp", "dp")

    def test_negative_size(self):
        self.check_refused(GOOD_HEAD + "parallel:\n  dp: -2\n", "parallel.dp", "-2")

    def test_more_ranks_than_workers(self):
        self.check_refused(GOOD_HEAD + "parallel:\n  dp: 8\n", "8 ranks", "4")

    def test_a_cuda_commcheck_without_gpu_workers_is_refused(self):
        # A commcheck runs on the device it names (NCCL between GPUs): none here.
        self.check_refused(GOOD_HEAD + "resources:\n  device: cuda\n",
                           "resources.device", "no cuda worker has registered")

    def test_bf16_on_the_cpu_is_refused(self):
        self.check_refused("name: bad\nkind: train\nmodel:\n  precision: bf16\n",
                           "model.precision", "'bf16'", "bf16 runs on a discrete device",
                           "allowed: fp32 with resources.device cpu")

    def test_a_field_of_another_policy_is_refused(self):
        self.check_refused(
            "name: bad\nkind: train\nmemory:\n  policy: selective\n  codec: bf16\n",
            "memory.codec", "applies only to memory.policy adaptive")

    def test_a_time_limit_over_the_clusters_maximum_is_refused(self):
        self.check_refused(GOOD_HEAD + "resources:\n  time_limit_s: 90000\n",
                           "resources.time_limit_s: 90000 s is more than this controller allows",
                           "--max-time-limit 86400 s", "allowed: more than 0 and at most 86400")

    def test_a_job_without_a_time_limit_gets_the_clusters_and_is_told(self):
        c = self.cluster
        r = c.cli("submit", c.write_job("unlimited.yaml", GOOD_HEAD + "parallel: {dp: 1}\n"))
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertRegex(r.stdout, r"^submitted job bad-\d+ \(resources.time_limit_s 86400 s "
                                   r"from the controller's --max-time-limit\)\n$")
        job = r.stdout.split()[2]
        detail = c.cli_json("status", job)
        self.assertEqual(detail["spec"]["resources"]["time_limit_s"], 86400)

    def test_a_server_dry_run_is_checked_by_the_controller_and_stores_nothing(self):
        # --dry-run (here) knows neither the cluster's time limit nor its workers;
        # --dry-run=server asks the controller, which refuses or fills in as a submit would.
        c = self.cluster
        over = c.write_job("over.yaml", GOOD_HEAD + "resources:\n  time_limit_s: 90000\n")
        r = c.cli("submit", "--dry-run", over)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        r = c.cli("submit", "--dry-run=server", over)
        self.assertEqual(r.returncode, 2, r.stdout + r.stderr)
        self.assertIn("over.yaml: resources.time_limit_s: 90000 s is more than this controller "
                      "allows", r.stderr)
        many = c.write_job("many.yaml", GOOD_HEAD + "parallel:\n  dp: 8\n")
        r = c.cli("submit", "--dry-run=server", many)
        self.assertEqual(r.returncode, 2, r.stdout + r.stderr)
        self.assertIn("the job needs 8 ranks", r.stderr)
        good = c.write_job("good.yaml", GOOD_HEAD + "parallel: {dp: 1}\n")
        r = c.cli("submit", "--dry-run=server", good)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertEqual(r.stdout, good + ": the controller would accept job bad (commcheck, 1 "
                         "rank; resources.time_limit_s 86400 s from the controller's "
                         "--max-time-limit); not submitted (--dry-run=server)\n")
        answer = c.cli_json("submit", "--dry-run=server", good)
        self.assertEqual(answer.get("job_id", ""), "")  # no job
        self.assertEqual(answer["spec"]["resources"]["time_limit_s"], 86400)
        r = c.cli("submit", "--dry-run=later", good)
        self.assertEqual(r.returncode, 2, r.stdout + r.stderr)
        self.assertIn("--dry-run: 'later' is not a kind of dry run; allowed: --dry-run (checked "
                      "here) or --dry-run=server", r.stderr)
        r = c.cli("submit", "--dry-run=server", "--watch", good)
        self.assertEqual(r.returncode, 2, r.stdout + r.stderr)
        self.assertIn("--watch excludes --dry-run", r.stderr)
        self.assertEqual(c.cli_json("jobs").get("jobs", []), [])
        self.assertEqual(c.cli_json("events").get("events", []), [])

    def test_a_default_time_limit_over_the_maximum_stops_the_controller(self):
        r = subprocess.run(
            [os.path.join(harness.BIN_DIR, "furnace-controller"), "--state-dir",
             os.path.join(self.cluster.state, "other"), "--listen", "127.0.0.1:0",
             "--metrics-listen", "", "--default-time-limit", "7200", "--max-time-limit", "3600"],
            capture_output=True, text=True, timeout=60)
        self.assertEqual(r.returncode, 2, r.stdout + r.stderr)
        self.assertIn("--default-time-limit: 7200 s is more than --max-time-limit 3600 s; "
                      "allowed: at most 3600", r.stderr)

    def test_missing_file(self):
        r = self.cluster.cli("submit", "/nonexistent/job.yaml")
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("/nonexistent/job.yaml", r.stderr)


if __name__ == "__main__":
    harness.main()
