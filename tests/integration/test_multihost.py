"""Multi-host with a host cut: the "hosts" are network namespaces joined by veth pairs to a bridge
(netns.py): a controller host and 3 worker hosts with 2 worker daemons each. A 4-rank train job
(dp 4, ep 4: its all-reduces and expert all-to-alls cross hosts) runs on two of the worker hosts;
mid-run the link of the host running rank 0 is cut (its bridge port goes down; nothing is killed).

Checked: the controller declares that host's workers lost once their heartbeats have been missing
for recovery.heartbeat_timeout_s, fails the attempt and stops its ranks on the connected host
(blocked in collectives with the cut peers: they end, they do not hang), places the ranks again
on the other hosts' workers and resumes from the last checkpoint. The cut host's own ranks, which
reach nobody, end by themselves (the hang watchdog / Gloo timeout) while the link is still down.
Then the link comes back, the cut host's agents register again, and the job finishes. Nothing is
left running and every namespace (with its veths and the bridge) is deleted, also when the test
fails; namespaces of a killed earlier run are removed at the start.

Skips (and says why) where namespaces cannot be made: not root, no iproute2, no netns support.

Every link is mutual TLS with tokens (MultiHostTest.TLS: the daemons and the CLI use the
certificates and tokens of `furnace certs init`, netns.tls_security); False runs it in plaintext
with --insecure."""
import datetime
import os
import re
import signal
import subprocess
import time
import unittest

import harness
import netns

HOSTS = ("ctl", "h1", "h2", "h3")
STEPS = 200
EVERY = 5
HEARTBEAT_TIMEOUT_S = 3  # recovery.heartbeat_timeout_s: the job's workers
WORKER_TIMEOUT_S = 6  # --worker-timeout: workers without a rank
HANG_TIMEOUT_S = 15


def train_job(name, ckpt_dir):
    return f"""name: {name}
kind: train
model: {{vocab: 64, seq_len: 16, d_model: 32, heads: 2, layers: 2, expert_ffn: 32}}
moe: {{experts: 4, top_k: 2}}
parallel: {{dp: 4, ep: 4, micro_batch: 2, micro_batches: 1}}
train: {{steps: {STEPS}, lr: 3.0e-3, warmup: 2, seed: 3}}
data: {{source: markov, seed: 5}}
checkpoint: {{dir: {ckpt_dir}, every: {EVERY}, keep: 2}}
recovery:
  max_restarts: 3
  backoff: {{initial_s: 0.2, max_s: 1.0, multiplier: 2.0}}
  heartbeat_timeout_s: {HEARTBEAT_TIMEOUT_S}
  hang_timeout_s: {HANG_TIMEOUT_S}
  start_timeout_s: 30
"""


def alive(pid):
    """Whether `pid` runs (a zombie counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def wait_until(predicate, timeout, step=0.1):
    """The time at which `predicate()` first held, or None after `timeout` s."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        if predicate():
            return time.time()
        time.sleep(step)
    return None


def lost_lines(log_text, worker):
    """[(unix time, silent s)] of the controller's "worker W lost: no heartbeat" lines."""
    out = []
    for stamp, silent in re.findall(
            r"^(\S+ \S+) \[controller\] \S+ worker " + re.escape(worker) +
            r" lost: no heartbeat for ([0-9.]+) s", log_text, re.M):
        t = datetime.datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S.%f").timestamp()
        out.append((t, float(silent)))
    return out


class MultiHostTest(unittest.TestCase):
    TLS = True  # mutual TLS and tokens on every daemon and the CLI (netns.tls_security)

    def setUp(self):
        why = netns.unavailable()
        if why:
            self.skipTest(f"network namespaces unavailable: {why}")
        self.net = netns.Network(HOSTS)
        self.addCleanup(self._destroy_network)
        self.net.create()
        self.cluster = netns.NetnsCluster(self.net, HOSTS[1:], per_host=2,
                                          worker_timeout=WORKER_TIMEOUT_S, tls=self.TLS)
        self.cluster.start()

    def _destroy_network(self):
        leftover = self.cluster.close() if hasattr(self, "cluster") else []
        self.net.destroy()
        self.assertEqual(self.net.left(), [], "namespaces left behind")
        self.assertEqual(leftover, [], "processes left behind after the controller stopped")

    def test_host_cut_is_detected_and_the_job_finishes_on_the_other_hosts(self):
        c = self.cluster
        job = c.submit(c.write_job("multihost.yaml",
                                   train_job("multihost", os.path.join(c.state, "ckpt"))))
        d = c.wait_for(job, lambda d: d["summary"]["state"] == "JOB_RUNNING" and
                       all(int(r.get("step", 0)) >= 2 * EVERY + 2
                           for r in d["attempts"][-1]["ranks"]), timeout=180,
                       what="the job past its second checkpoint")
        # The attempt that runs at the cut (1 unless an earlier one failed for another reason).
        n = len(d["attempts"])
        if n > 1:
            print(f"before the cut: {[a.get('cause') for a in d['attempts'][:-1]]}", flush=True)
        first = d["attempts"][-1]
        placed = {int(r["rank"]): r["worker_id"] for r in first["ranks"]}
        self.assertGreater(len({c.worker_host[w] for w in placed.values()}), 1,
                           f"the job does not span hosts: {placed}")
        cut = c.worker_host[placed[0]]
        cut_workers = sorted(w for w, h in c.worker_host.items() if h == cut)
        pids = {int(r["rank"]): int(r["pid"]) for r in first["ranks"]}
        stale = {r: p for r, p in pids.items() if c.worker_host[placed[r]] == cut}
        survivors = {r: p for r, p in pids.items() if r not in stale}
        self.assertTrue(stale and survivors, placed)
        self.assertLessEqual(set(cut_workers), set(placed.values()), placed)

        cut_step = int(d["summary"]["step"])
        cut_at = time.time()
        self.net.cut(cut)
        print(f"cut {cut} ({self.net.address[cut]}) at step {cut_step}: its "
              f"workers {cut_workers} run ranks {sorted(stale)}", flush=True)

        # Lost once silent for the job's heartbeat timeout (not the controller's longer default).
        lost_at = wait_until(lambda: all(c.workers_by_id()[w]["state"] == "WORKER_STATE_LOST"
                                         for w in cut_workers), 60, step=0.05)
        self.assertIsNotNone(lost_at, "the cut host's workers were not declared lost\n" +
                             c.dump_logs())
        with open(os.path.join(c.state, "controller.out"), errors="replace") as f:
            log = f.read()
        for w in cut_workers:
            lines = lost_lines(log, w)
            self.assertEqual(len(lines), 1, f"worker {w}: {lines}")
            at, silent = lines[0]
            print(f"{w} declared lost {at - cut_at:.2f} s after the cut (silent {silent} s; "
                  f"recovery.heartbeat_timeout_s {HEARTBEAT_TIMEOUT_S})", flush=True)
            # Every worker of the cut host runs a rank, so the job's shorter limit applies.
            self.assertLess(silent, WORKER_TIMEOUT_S, f"{w}: the job's heartbeat timeout unused")

        # The ranks on the connected host, in collectives with the cut peers, end: the controller
        # stops the failed attempt.
        ended = wait_until(lambda: not any(alive(p) for p in survivors.values()), 60)
        self.assertTrue(ended, f"ranks {[r for r, p in survivors.items() if alive(p)]} on the "
                        "connected host still run after the loss\n" + c.dump_logs())
        print(f"connected ranks {sorted(survivors)} ended {ended - cut_at:.2f} s after the cut",
              flush=True)

        # Placed again on the other hosts' workers, at the same layout.
        d = c.wait_for(job, lambda d: len(d["attempts"]) > n and
                       d["attempts"][n]["state"] == "ATTEMPT_STATE_RUNNING" and
                       len(d["attempts"][n]["ranks"]) == 4, timeout=120,
                       what=f"attempt {n + 1} running")
        first = d["attempts"][n - 1]
        self.assertEqual(first["failure_kind"], "lost", first)
        self.assertIn("lost (no heartbeat for", first["cause"])
        for r in first["ranks"]:
            self.assertEqual(r["state"], "RANK_STATE_EXITED", r)
        second = d["attempts"][n]
        self.assertFalse({r["worker_id"] for r in second["ranks"]} & set(cut_workers),
                         second["ranks"])
        print(f"attempt {n + 1} running {time.time() - cut_at:.2f} s after the cut on "
              f"{sorted(r['worker_id'] for r in second['ranks'])}", flush=True)

        # The cut host's ranks reach nobody (controller or peers): they end by themselves.
        ended = wait_until(lambda: not any(alive(p) for p in stale.values()),
                           HANG_TIMEOUT_S + 60)
        self.assertTrue(ended, f"ranks {[r for r, p in stale.items() if alive(p)]} of the cut "
                        "host still run\n" + c.dump_logs())
        print(f"cut-off ranks {sorted(stale)} ended {ended - cut_at:.2f} s after the cut "
              f"(recovery.hang_timeout_s {HANG_TIMEOUT_S})", flush=True)

        # The link comes back: the cut host's agents register again.
        restored_at = time.time()
        self.net.restore(cut)
        back = wait_until(lambda: all(c.workers_by_id()[w]["state"] != "WORKER_STATE_LOST"
                                      for w in cut_workers), 60, step=0.2)
        self.assertTrue(back, "the cut host's workers did not register again\n" + c.dump_logs())
        print(f"{cut_workers} registered again {back - restored_at:.2f} s after the link came "
              f"back (cut for {restored_at - cut_at:.1f} s)", flush=True)

        d = c.wait_state(job, harness.FINAL, timeout=300)
        self.assertEqual(d["summary"]["state"], "JOB_SUCCEEDED",
                         [(a["attempt"], a["state"], a.get("cause")) for a in d["attempts"]])
        self.assertEqual(int(d["summary"]["step"]), STEPS)
        self.assertEqual(len(d["attempts"]), n + 1, [a.get("cause") for a in d["attempts"]])
        # Every rank resumed from a checkpoint written before the cut (one every EVERY steps; the
        # cut came after step 2 * EVERY + 2), not from the start.
        logs = c.cli("logs", job, "--attempt", str(n + 1)).stdout
        resumed = [int(s) for s in re.findall(r"resumed from the checkpoint of step (\d+)", logs)]
        self.assertEqual(len(resumed), 4, logs[-3000:])
        self.assertEqual(len(set(resumed)), 1, resumed)
        self.assertGreaterEqual(resumed[0], 2 * EVERY, resumed)
        print(f"job succeeded {time.time() - cut_at:.2f} s after the cut, attempt {n + 1} resumed "
              f"from step {resumed[0]}", flush=True)
        for a in d["attempts"]:
            for r in a["ranks"]:
                self.assertFalse(alive(int(r.get("pid", 0) or 0)), (a["attempt"], r))


class LeftoverTest(unittest.TestCase):
    def test_namespaces_and_processes_of_a_killed_run_are_removed(self):
        why = netns.unavailable()
        if why:
            self.skipTest(f"network namespaces unavailable: {why}")
        dead = subprocess.Popen(["true"])
        dead.wait()  # a pid no test process has any more
        name = f"{netns.PREFIX}{dead.pid}-h1"
        subprocess.run(["ip", "netns", "add", name], check=True)
        try:
            stray = subprocess.Popen(["ip", "netns", "exec", name, "sleep", "600"])
            self.assertTrue(wait_until(lambda: str(stray.pid) in subprocess.run(
                ["ip", "netns", "pids", name], capture_output=True, text=True).stdout.split(), 30))
            self.assertIn(name, netns.remove_leftovers())
            self.assertEqual(stray.wait(timeout=30), -signal.SIGKILL)
            self.assertNotIn(name, subprocess.run(["ip", "netns", "list"], capture_output=True,
                                                  text=True).stdout)
        finally:
            subprocess.run(["ip", "netns", "del", name], capture_output=True)


if __name__ == "__main__":
    harness.main()
