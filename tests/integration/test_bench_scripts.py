"""The benchmarks still run. Those that drive a whole cluster (bench/*/*.py through
harness.Cluster), each in its smallest configuration (about a minute for the six): exit 0 and its
table printed. They read the controller's HTTP API, the CLI's JSON and the ranks' log lines, any
of which can change under them; before this test a bound on /api/jobs/JOB/series?max= and the
resume-settings check had broken four of them without a failing test. And the C++ benchmarks CI
builds but never ran, at toy sizes (a few seconds). The numbers are not checked: the benchmarks
are for that."""
import os
import signal
import subprocess
import sys
import tempfile
import unittest

import harness

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class BenchScriptsTest(unittest.TestCase):
    def run_bench(self, script, *args, timeout=150):
        """The script's stdout. Its clusters' state (checkpoints included) goes to a temporary
        directory removed after it; one that runs past `timeout` gets SIGINT, so that its own
        `finally: cluster.close()` stops the controller, workers and ranks, then SIGKILL."""
        with tempfile.TemporaryDirectory(prefix="furnace-bench-test-") as tmp:
            env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1", TMPDIR=tmp)
            p = subprocess.Popen([sys.executable, os.path.join(ROOT, "bench", script), "--bin",
                                  harness.BIN_DIR, *args], stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True, env=env,
                                 start_new_session=True)
            try:
                out, err = p.communicate(timeout=timeout)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGINT)
                try:
                    out, err = p.communicate(timeout=30)
                except subprocess.TimeoutExpired:
                    os.killpg(p.pid, signal.SIGKILL)
                    out, err = p.communicate()
                self.fail(f"{script} {' '.join(args)}: still running after {timeout} s\n"
                          f"{out}\n{err}")
        self.assertEqual(p.returncode, 0, f"{script} {' '.join(args)}:\n{out}\n{err}")
        return out

    def test_memory_headline(self):
        # Warm-up, calibration, then two policies from the warm-up's checkpoint under the budget.
        out = self.run_bench("memory/headline.py", "--steps", "14", "--policies",
                             "none,adaptive")
        self.assertIn("| none | succeeded", out)
        self.assertIn("| adaptive | succeeded", out)

    def test_recovery_goodput(self):
        out = self.run_bench("recovery/goodput.py", "--steps", "40", "--mean-steps", "15",
                             "--every", "10")
        self.assertIn("goodput auto / fixed:", out)

    def test_recovery_checkpoint_stall(self):
        out = self.run_bench("recovery/checkpoint_stall.py", "--steps", "12", "--every", "4",
                             "--rounds", "1")
        self.assertIn("async", out)

    def test_recovery_time(self):
        out = self.run_bench("recovery/recovery_time.py", "--reps", "1")
        self.assertIn("median kill -> first step", out)

    def test_telemetry_pause(self):
        with tempfile.TemporaryDirectory() as d:
            out = self.run_bench("telemetry/pause_bench.py", "--window", "5", "--pairs", "1",
                                 "--out", os.path.join(d, "REPORT.md"))
        self.assertIn("SIGSTOPped / running", out)

    def test_parm_whole_job(self):
        out = self.run_bench("parm/whole_job.py", "--steps", "6", "--skip", "2", "--rounds", "1")
        # Each round's line names the schedule its MoE layers ran (auto: the one it chose).
        self.assertRegex(out, r"round 0 deepspeed +ran deepspeed ")
        self.assertRegex(out, r"round 0 auto +ran (deepspeed|s1|s2)")


class BenchBinariesTest(unittest.TestCase):
    """The C++ benchmarks CI builds, each run once at a toy size: exit 0 and their output."""

    def run_bin(self, name, *args, timeout=300):
        env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")
        r = subprocess.run([os.path.join(harness.BIN_DIR, name), *args], capture_output=True,
                           text=True, timeout=timeout, env=env)
        self.assertEqual(r.returncode, 0, f"{name} {' '.join(args)}:\n{r.stdout}\n{r.stderr}")
        return r.stdout

    def refused(self, name, *args):
        # A bad option: exit code 2 and no run; returns what it said on stderr.
        r = subprocess.run([os.path.join(harness.BIN_DIR, name), *args], capture_output=True,
                           text=True, timeout=60)
        self.assertEqual(r.returncode, 2, r.stdout + r.stderr)
        return r.stderr

    def test_parm_quick(self):
        out = self.run_bin("bench_parm", "--quick")
        self.assertIn("auto within 5% of the measured best", out)
        self.assertIn("the cost model alone (auto before its trial)", out)

    def test_moe_layer(self):
        out = self.run_bin("bench_moe_layer", "--ep", "2", "--reps", "2", "--warmup", "1",
                           "--d_model", "64", "--expert_ffn", "128", "--seq_len", "32",
                           "--batch", "2")
        self.assertIn('"fwd_bwd_s"', out)

    def test_train(self):
        out = self.run_bin("furnace_bench_train", "--steps", "2", "--warmup", "1",
                           "--breakdown_reps", "0", "--peak_gflops", "50", "--d_model", "64",
                           "--seq_len", "32")
        self.assertIn("tokens_per_s", out)

    def test_data(self):
        with tempfile.TemporaryDirectory() as d:
            # A directory that does not exist yet is made (it was a NOT_FOUND from the open).
            out = self.run_bin("furnace_bench_data", "--dir", os.path.join(d, "corpus"), "--gib",
                               "0.01", "--rounds", "1")
        self.assertIn('"open_s"', out)

    def test_memory_policies(self):
        out = self.run_bin("furnace_bench_memory_policies", "--threads", "1", "--rounds", "1",
                           "--steps-per-round", "1", "--micro-batch", "1")
        self.assertIn("final losses identical across variants: yes", out)
        self.assertIn("adaptive_floor_h200", out)
        # With the attention's probabilities recomputed the floor also rebuilds its output.
        out = self.run_bin("furnace_bench_memory_policies", "--threads", "1", "--rounds", "1",
                           "--steps-per-round", "1", "--micro-batch", "1",
                           "--attention-probs", "recomputed")
        self.assertIn("final losses identical across variants: yes", out)
        self.assertIn('"attention_probs":"recomputed"', out)
        self.assertIn("--attention-probs stored|recomputed",
                      self.refused("furnace_bench_memory_policies", "--attention-probs", "flash"))

    def test_train_step_on_the_emulated_device(self):
        # Built where the CUDA toolkit is (bench/gpu); both attention_probs rows, the same losses.
        if not os.path.exists(os.path.join(harness.BIN_DIR, "furnace_train_step_bench")):
            self.skipTest("furnace_train_step_bench not built (no CUDA toolkit)")
        out = self.run_bin("furnace_train_step_bench", "--device", "emulated", "--precision", "fp32",
                           "--vocab", "128", "--seq", "64", "--d", "32", "--heads", "4",
                           "--layers", "2", "--experts", "4", "--ffn", "64", "--micro-batch", "2",
                           "--micro-batches", "1", "--warmup", "1", "--steps", "2")
        rows = [line for line in out.splitlines() if line.startswith("| stored |")
                or line.startswith("| recomputed |")]
        self.assertEqual(len(rows), 2, out)
        self.assertIn("losses of the two rows: identical", out)  # every step's, bit for bit
        self.assertIn("GOAL training-step MFU (attention probs stored):", out)
        self.assertIn("GOAL training-step MFU (attention probs recomputed):", out)
        self.assertIn("--attention-probs: unknown value 'flash' (allowed: stored, recomputed, both)",
                      self.refused("furnace_train_step_bench", "--attention-probs", "flash"))

    def test_telemetry(self):
        self.assertIn("decoded by the drain", self.run_bin("furnace_bench_telemetry"))


if __name__ == "__main__":
    harness.main()
