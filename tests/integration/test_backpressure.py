"""Telemetry back-pressure: a controller that stops answering (SIGSTOP) must cost telemetry,
never training. The rank keeps stepping, its agent's memory stays bounded (its telemetry queue
drops the oldest records), and once the controller continues the job still succeeds and the
drops are reported.

The agent here is started by the test (the controller runs with --local-workers 0) so that it can
be given a small telemetry queue: at the default 10000 records an 8 s pause (about 200 records at
the demo's ~40 ms per step) would never overflow it. The pause lasts until the rank has made more
steps than the queue holds (one record a step), and a rank too slow to get there within
MAX_PAUSE_S fails the test: without an overflow it would show nothing. Step-time cost of the pause
is measured in bench/telemetry/, not asserted here.
"""
import glob
import os
import re
import signal
import subprocess
import time

import harness

STEPS = 400
PAUSE_S = 8.0
# The longest pause, for a slow machine (a loaded 2-core one can be 10x slower than the demo's
# ~25 steps a second); below HEARTBEAT_TIMEOUT_S, so the paused controller does not call the agent
# lost when it continues.
MAX_PAUSE_S = 120.0
HEARTBEAT_TIMEOUT_S = 180
TELEMETRY_CAPACITY = 50
RSS_LIMIT_KB = 200 * 1024


def train_job(name, steps=STEPS):
    # The demo model (configs/demo.yaml); the pause must not look like a hang or a lost worker.
    return f"""name: {name}
kind: train
model: {{vocab: 64, seq_len: 64, d_model: 64, heads: 4, layers: 4, expert_ffn: 128}}
moe: {{experts: 8, top_k: 2, capacity_factor: 0}}
parallel: {{micro_batch: 8, micro_batches: 2}}
train: {{steps: {steps}, lr: 3.0e-3, warmup: 20, seed: 1}}
data: {{source: markov, seed: 7}}
recovery:
  max_restarts: 0
  heartbeat_timeout_s: {HEARTBEAT_TIMEOUT_S}
  hang_timeout_s: 120
"""


def rss_kb(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def last_logged_step(path):
    """The N of the last "step N/total" line in a rank's local log (0 when none yet)."""
    try:
        with open(path, errors="replace") as f:
            steps = re.findall(r"step (\d+)/\d+", f.read())
    except OSError:
        return 0
    return int(steps[-1]) if steps else 0


class BackpressureTest(harness.unittest.TestCase):
    def setUp(self):
        worker_bin = os.path.join(harness.BIN_DIR, "furnace-worker")
        # The small queue is what makes the pause overflow it (worker/main.cc has the flag).
        # Checked before the cluster starts: a failing setUp gets no tearDown to stop it.
        shown = subprocess.run([worker_bin, "--help"], capture_output=True, text=True)
        self.assertIn("--telemetry-capacity", shown.stdout + shown.stderr,
                      "furnace-worker --help shows no --telemetry-capacity")
        # A long worker timeout: the paused controller must not declare the agent lost on resume.
        self.cluster = harness.Cluster(workers=0, worker_timeout=HEARTBEAT_TIMEOUT_S).start(
            wait_workers=False)
        args = [worker_bin, "--controller", self.cluster.addr, "--slot", "0",
                "--host", "127.0.0.1",
                "--work-dir", os.path.join(self.cluster.state, "workers", "slot-0"),
                "--telemetry-capacity", str(TELEMETRY_CAPACITY)]
        os.makedirs(os.path.join(self.cluster.state, "logs"), exist_ok=True)
        self.worker_log = open(os.path.join(self.cluster.state, "logs", "worker-0.log"), "ab")
        self.worker = subprocess.Popen(args, stdout=self.worker_log, stderr=subprocess.STDOUT)
        self.cluster.wait_workers(1)

    def tearDown(self):
        # Never leave the controller stopped, or close() would wait on it.
        if self.cluster.controller and self.cluster.controller.poll() is None:
            self.cluster.controller.send_signal(signal.SIGCONT)
        if self.worker.poll() is None:
            self.worker.send_signal(signal.SIGTERM)
            try:
                self.worker.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.worker.kill()
                self.worker.wait()
        self.worker_log.close()
        leftover = self.cluster.close()
        self.assertEqual(leftover, [], "processes left behind")

    def test_stopped_controller_costs_telemetry_not_training(self):
        c = self.cluster
        job = c.submit(c.write_job("bp.yaml", train_job("backpressure")))
        c.wait_for(job, lambda d: d["summary"]["state"] == "JOB_RUNNING" and
                   int(d["summary"].get("step", 0)) >= 20, timeout=120,
                   what="the job running with progress")
        logs = glob.glob(os.path.join(c.state, "workers", "slot-*", "logs", "*", "attempt-1",
                                      "rank-0.log"))
        self.assertEqual(len(logs), 1, f"rank log not found under {c.state}")
        rank_log = logs[0]
        start_step = last_logged_step(rank_log)
        rss = [rss_kb(self.worker.pid)]

        c.controller.send_signal(signal.SIGSTOP)
        t_stop = time.time()
        # At least PAUSE_S, and on a slow machine until the rank has made enough steps to
        # overflow the queue (one record per step), up to MAX_PAUSE_S (below the heartbeat
        # timeout).
        overflow_step = start_step + TELEMETRY_CAPACITY + 30
        try:
            while True:
                time.sleep(0.5)
                rss.append(rss_kb(self.worker.pid))
                end_step = last_logged_step(rank_log)
                waited = time.time() - t_stop
                if waited >= MAX_PAUSE_S or (waited >= PAUSE_S and end_step >= overflow_step):
                    break
        finally:
            c.controller.send_signal(signal.SIGCONT)
        paused_s = time.time() - t_stop

        # Ranks log every 10th step: a new line means at least 10 more steps. (The demo does ~200
        # in 8 s; a loaded 2-core machine can be 10x slower, so no rate is asserted.)
        self.assertGreater(end_step, start_step,
                           f"the rank stalled while the controller was stopped "
                           f"({start_step} -> {end_step} in {paused_s:.1f} s)\n" + c.dump_logs())
        self.assertLess(max(rss), RSS_LIMIT_KB, f"agent RSS samples (KiB): {rss}")
        self.assertGreaterEqual(
            end_step, overflow_step,
            f"the rank made only {end_step - start_step} steps in {paused_s:.0f} s (the queue "
            f"holds {TELEMETRY_CAPACITY}): it never overflowed, so the drop report cannot be "
            f"checked\n" + c.dump_logs())

        d = c.wait_state(job, harness.FINAL, timeout=420)
        self.assertEqual(d["summary"]["state"], "JOB_SUCCEEDED", d["summary"])
        self.assertEqual(int(d["summary"]["restarts"]), 0)

        with open(os.path.join(c.state, "controller.out"), errors="replace") as f:
            dropped = sum(int(n) for n in
                          re.findall(r"dropped (\d+) telemetry records", f.read()))
        # More records than the queue holds were made while flushes to a stopped controller
        # timed out: the oldest must have been dropped, and said so.
        self.assertGreater(dropped, 0, "no telemetry drop was reported\n" + c.dump_logs())
        print(f"\nREPORT controller SIGSTOPped {paused_s:.1f} s: rank stepped {start_step} -> "
              f"{end_step}; agent RSS max {max(rss) / 1024:.1f} MiB; "
              f"controller reported {dropped} telemetry records dropped "
              f"(queue {TELEMETRY_CAPACITY})")


if __name__ == "__main__":
    harness.main()
