"""The benchmarks that drive a whole cluster (bench/*/*.py through harness.Cluster) still run: each
in its smallest configuration (about a minute for the six), exit 0 and its table printed. They read the controller's HTTP
API, the CLI's JSON and the ranks' log lines, any of which can change under them; before this
test a bound on /api/jobs/JOB/series?max= and the resume-settings check had broken four of them
without a failing test. The numbers are not checked: the benchmarks are for that."""
import os
import subprocess
import sys
import tempfile
import unittest

import harness

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class BenchScriptsTest(unittest.TestCase):
    def run_bench(self, script, *args, timeout=400):
        env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")
        r = subprocess.run([sys.executable, os.path.join(ROOT, "bench", script), "--bin",
                            harness.BIN_DIR, *args], capture_output=True, text=True,
                           timeout=timeout, env=env)
        self.assertEqual(r.returncode, 0, f"{script} {' '.join(args)}:\n{r.stdout}\n{r.stderr}")
        return r.stdout

    def test_memory_headline(self):
        # Warm-up, calibration, then two policies from the warm-up's checkpoint under the budget.
        out = self.run_bench("memory/headline.py", "--steps", "14", "--policies",
                             "none,adaptive")
        self.assertIn("| adaptive |", out)
        self.assertIn("| none |", out)

    def test_recovery_goodput(self):
        out = self.run_bench("recovery/goodput.py", "--steps", "40", "--mean-steps", "15",
                             "--every", "10")
        self.assertIn("auto", out)

    def test_recovery_checkpoint_stall(self):
        out = self.run_bench("recovery/checkpoint_stall.py", "--steps", "12", "--every", "4",
                             "--rounds", "1")
        self.assertIn("async", out)

    def test_recovery_time(self):
        out = self.run_bench("recovery/recovery_time.py", "--reps", "1")
        self.assertIn("median kill -> first step", out)

    def test_telemetry_pause(self):
        with tempfile.TemporaryDirectory() as d:
            out = self.run_bench("telemetry/pause_bench.py", "--window", "2", "--pairs", "1",
                                 "--out", os.path.join(d, "REPORT.md"))
        self.assertIn("SIGSTOPped / running", out)

    def test_parm_whole_job(self):
        out = self.run_bench("parm/whole_job.py", "--steps", "6", "--skip", "2", "--rounds", "1")
        self.assertIn("deepspeed", out)
        self.assertIn("auto", out)


if __name__ == "__main__":
    harness.main()
