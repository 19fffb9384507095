"""Kill the controller during a job and start it again on the same state dir: the job and its
history are still known, the running workers re-register, their ranks are re-attached, and the job
finishes; killed while it merged the ranks' records of a step, it gets them back from the agents
and stores every step whole."""
import json
import os
import signal
import subprocess
import time
import urllib.request

import harness


class ControllerRestartTest(harness.ClusterTest):
    def test_controller_killed_mid_job(self):
        c = self.cluster
        job = c.submit(c.write_job("long.yaml", harness.commcheck_job("survivor", rounds=60)))
        c.wait_for(job, lambda d: d["summary"]["state"] == "JOB_RUNNING" and
                   int(d["summary"].get("step", 0)) >= 1, what="running with progress")
        # A watch rides out the restart (an outage under 10 s: poll_outage.h), the controller
        # down 6 s of it.
        watch = subprocess.Popen([os.path.join(harness.BIN_DIR, "furnace"), "--controller",
                                  c.addr, "watch", job], stdout=subprocess.PIPE,
                                 stderr=subprocess.STDOUT, text=True)
        time.sleep(0.5)
        c.kill_controller()
        time.sleep(6.0)
        c.start(wait_workers=False)
        d = c.job(job)  # known right after the restart, with its history
        self.assertEqual(d["summary"]["job_id"], job)
        self.assertTrue(any(e["kind"] == "submitted" for e in d["events"]))
        d = c.wait_state(job, ("JOB_SUCCEEDED", "JOB_FAILED"), timeout=180)
        self.assertEqual(d["summary"]["state"], "JOB_SUCCEEDED", d)
        watched, _ = watch.communicate(timeout=60)
        self.assertEqual(watch.returncode, 0, watched)
        self.assertIn("SUCCEEDED", watched)
        # The workers are the same processes (adopted, not started twice).
        ws = c.cli_json("workers")["workers"]
        self.assertEqual(len(ws), 4)
        kinds = [e["kind"] for e in d["events"]]
        print("\nREPORT events across the controller restart:",
              "\n  ".join([""] + [f'{e["kind"]}: {e.get("message", "")}' for e in d["events"]]))
        # The ranks kept running while the controller was away and were re-attached: no restart.
        self.assertEqual(int(d["summary"].get("restarts", 0)), 0, kinds)
        self.assertEqual(kinds.count("reattached"), 4, kinds)

    def test_no_step_is_lost_when_the_controller_is_killed_while_merging(self):
        # Four ranks, each on its own agent: a step is stored once all four records are in, and
        # the agents push at independent times, so a kill mid-run finds steps half merged. The
        # agents give them back (and their backlog) once they have registered again.
        c = self.cluster
        steps, kills = 360, (40, 140, 240)
        job = c.submit(c.write_job("merge.yaml", f"""name: merging
kind: train
model: {{vocab: 64, seq_len: 32, d_model: 32, heads: 2, layers: 2, expert_ffn: 64}}
moe: {{experts: 4, top_k: 2}}
parallel: {{dp: 4, micro_batch: 4, micro_batches: 1}}
train: {{steps: {steps}, lr: 3.0e-3, warmup: 10, seed: 11}}
data: {{source: markov, seed: 5}}
checkpoint: {{every: 0}}
recovery:
  max_restarts: 0
"""))
        killed_at = []
        for at in kills:
            d = c.wait_for(job, lambda d: int(d["summary"].get("step", 0)) >= at or
                           d["summary"]["state"] in harness.FINAL, timeout=180,
                           what=f"step {at}")
            if d["summary"]["state"] in harness.FINAL:
                break
            c.kill_controller()
            killed_at.append(int(d["summary"].get("step", 0)))
            time.sleep(0.5)
            c.start(wait_workers=False)
        d = c.wait_state(job, harness.FINAL, timeout=300)
        self.assertEqual(d["summary"]["state"], "JOB_SUCCEEDED", d["summary"])
        self.assertEqual(int(d["summary"].get("restarts", 0)), 0)
        url = f"http://127.0.0.1:{c.metrics_port}/api/jobs/{job}/series?max=1000"
        with urllib.request.urlopen(url, timeout=10) as r:
            series = json.loads(r.read().decode())["steps"]
        got = [int(s["step"]) for s in series]
        partial = [int(s["step"]) for s in series if int(s["ranks"]) != 4]
        # Each rank's record counted once: the exported total is the series' sum (a record pushed
        # again and counted twice would show here; the series' rows are unique by their key).
        with urllib.request.urlopen(f"http://127.0.0.1:{c.metrics_port}/metrics",
                                    timeout=10) as r:
            metrics = r.read().decode()
        total = [float(line.split()[-1]) for line in metrics.splitlines()
                 if line.startswith(f'furnace_job_tokens_total{{job="{job}"}}')]
        print(f"\nREPORT controller killed {len(killed_at)} time(s) (at steps >= {killed_at}); "
              f"series: {len(got)} of {steps} steps, {len(partial)} without every rank")
        self.assertEqual(len(killed_at), len(kills), "the run ended before every kill")
        self.assertEqual(got, list(range(1, steps + 1)))
        self.assertEqual(partial, [])
        self.assertEqual(total, [sum(float(s["tokens"]) for s in series)])

    def test_graceful_stop_interrupts_only_the_jobs_on_its_own_workers(self):
        # Four local workers busy with one job, a fifth agent started by hand running another.
        # SIGTERM stops the controller and its local workers: their job is interrupted (no restart
        # spent) and resumes; the job on the hand-started agent trains on and is re-attached.
        c = self.cluster
        hand_dir = os.path.join(c.state, "hand")
        hand_log = open(os.path.join(c.state, "hand-worker.log"), "ab")
        hand = subprocess.Popen([os.path.join(harness.BIN_DIR, "furnace-worker"), "--controller",
                                 c.addr, "--slot", "9", "--host", "127.0.0.1", "--work-dir",
                                 hand_dir], stdout=hand_log, stderr=subprocess.STDOUT)
        try:
            c.wait_workers(5)
            local = c.submit(c.write_job("local.yaml",
                                         harness.commcheck_job("local", ranks=4, rounds=40)))
            c.wait_state(local, ("JOB_RUNNING",))
            # A train job long enough to outlive the test (cancelled at the end).
            other = c.submit(c.write_job("other.yaml", """name: other
kind: train
model: {vocab: 32, seq_len: 16, d_model: 16, heads: 2, layers: 1, expert_ffn: 32}
moe: {experts: 2, top_k: 1}
parallel: {dp: 1, micro_batch: 2, micro_batches: 1}
train: {steps: 1000000, lr: 3.0e-3, warmup: 5, seed: 1}
data: {source: markov, seed: 7}
checkpoint: {every: 0}
"""))
            for job in (local, other):
                c.wait_for(job, lambda d: d["summary"]["state"] == "JOB_RUNNING" and
                           int(d["summary"].get("step", 0)) >= 1, what="running with progress")
            placed = c.job(other)["attempts"][0]["ranks"][0]["worker_id"]
            self.assertTrue(placed.endswith("/9"), placed)
            c.controller.send_signal(signal.SIGTERM)
            c.controller.wait(timeout=30)
            self.assertIsNone(hand.poll(), "the hand-started agent stopped with the controller")
            c.start(wait_workers=False)
            step = int(c.job(other)["summary"].get("step", 0))
            d = c.wait_for(other, lambda d: any(e["kind"] == "reattached" for e in d["events"])
                           and int(d["summary"].get("step", 0)) > step + 10,
                           what="re-attached and training on")
            kinds = [e["kind"] for e in d["events"]]
            self.assertEqual(d["summary"]["state"], "JOB_RUNNING", kinds)
            self.assertEqual(len(d["attempts"]), 1, kinds)
            self.assertEqual(c.cli("cancel", other).returncode, 0)
            d = c.wait_state(local, harness.FINAL, timeout=240)
            self.assertEqual(d["summary"]["state"], "JOB_SUCCEEDED", d["summary"])
            self.assertEqual(d["attempts"][0]["state"], "ATTEMPT_STATE_INTERRUPTED")
            self.assertEqual(int(d["summary"].get("restarts", 0)), 0)
            print(f"\nREPORT graceful stop: {local} interrupted and resumed (attempts "
                  f"{len(d['attempts'])}), {other} on {placed} re-attached (events {kinds})")
        finally:
            hand.send_signal(signal.SIGTERM)
            hand.wait(timeout=30)
            hand_log.close()


if __name__ == "__main__":
    harness.main()
