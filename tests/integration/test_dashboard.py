"""The dashboard end to end: a controller with its monitoring endpoint, a short train job, then the
page rendered by headless chromium. The page writes what it drew into #furnace-test-summary; the
test checks it and saves a screenshot under <build>/test-artifacts/dashboard.png.

Skips itself (and says so) where chromium is not installed; scripts/setup.sh installs it."""
import json
import os
import re
import shutil
import subprocess
import tempfile
import unittest
import urllib.error
import urllib.request

import harness

STEPS = 40


def train_job(name, steps=STEPS, extra=""):
    return f"""name: {name}
kind: train
model: {{vocab: 64, seq_len: 64, d_model: 64, heads: 4, layers: 4, expert_ffn: 128}}
moe: {{experts: 8, top_k: 2, capacity_factor: 0}}
parallel: {{micro_batch: 8, micro_batches: 2}}
train: {{steps: {steps}, lr: 3.0e-3, warmup: 10, seed: 1}}{extra}
data: {{source: markov, seed: 7}}
checkpoint: {{every: 20, keep: 1}}
recovery:
  max_restarts: 1
  backoff: {{initial_s: 0.2, max_s: 1.0, multiplier: 2.0}}
"""


def chromium():
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    return None


def http_get(url, timeout=5):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.status, r.headers.get("Content-Type"), r.read().decode()


class DashboardTest(unittest.TestCase):
    def setUp(self):
        self.browser = chromium()
        if not self.browser:
            self.skipTest("chromium not installed (scripts/setup.sh installs it): dashboard not "
                          "rendered")
        self.metrics_port = harness.free_port()
        self.base = f"http://127.0.0.1:{self.metrics_port}"
        self.cluster = harness.Cluster(workers=2, metrics_port=self.metrics_port).start()
        self.profile = tempfile.mkdtemp(prefix="furnace-chromium-")

    def tearDown(self):
        if hasattr(self, "cluster"):
            leftover = self.cluster.close()
            shutil.rmtree(self.profile, ignore_errors=True)
            self.assertEqual(leftover, [], "processes left behind after the controller stopped")

    def run_browser(self, *args, timeout=90):
        cmd = [self.browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
               "--no-first-run", "--disable-background-networking", "--disable-component-update",
               "--disable-sync", "--hide-scrollbars", f"--user-data-dir={self.profile}",
               "--virtual-time-budget=8000", *args]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        self.assertEqual(r.returncode, 0, r.stderr[-3000:])
        return r.stdout

    def test_page_draws_the_job(self):
        c = self.cluster
        # The endpoint itself: Prometheus text, the API, the page and its library.
        status, ctype, _ = http_get(self.base + "/metrics")
        self.assertEqual((status, ctype), (200, "text/plain; version=0.0.4; charset=utf-8"))
        for path, want in (("/", "text/html"), ("/app.js", "text/javascript"),
                           ("/uPlot.iife.min.js", "text/javascript"),
                           ("/uPlot.min.css", "text/css")):
            status, ctype, _ = http_get(self.base + path)
            self.assertEqual(status, 200, path)
            self.assertTrue(ctype.startswith(want), f"{path}: {ctype}")
        with self.assertRaises(urllib.error.HTTPError) as e:
            http_get(self.base + "/../CMakeLists.txt")
        self.assertGreaterEqual(e.exception.code, 400)

        job = c.submit(c.write_job("dash.yaml", train_job("dashboard")))
        d = c.wait_state(job, harness.FINAL, timeout=300)
        self.assertEqual(d["summary"]["state"], "JOB_SUCCEEDED", d["summary"])
        _, _, body = http_get(self.base + "/api/jobs")
        self.assertIn(job, [j["job_id"] for j in json.loads(body)["jobs"]])
        _, _, body = http_get(f"{self.base}/api/jobs/{job}/series?max=10")
        steps = json.loads(body)["steps"]
        self.assertTrue(0 < len(steps) <= 10, len(steps))
        _, ctype, body = http_get(self.base + "/api/workers")
        self.assertTrue(ctype.startswith("application/json"), ctype)
        workers = json.loads(body)
        self.assertGreater(workers["now_unix"], 0, workers)
        self.assertEqual(len(workers["workers"]), 2, workers)
        for w in workers["workers"]:
            self.assertEqual(w["state"], "WORKER_STATE_READY", w)
            self.assertGreater(w["last_seen_unix"], workers["now_unix"] - 60, w)

        # A job still running, with a 2-hour time limit: its row says what is left of it.
        limited = c.submit(c.write_job("limited.yaml", train_job(
            "limited", steps=100000, extra="\nresources: {time_limit_s: 7200}")))
        c.wait_state(limited, "JOB_RUNNING", timeout=120)

        dom = self.run_browser("--dump-dom", f"{self.base}/?job={job}")
        m = re.search(r'<pre id="furnace-test-summary"[^>]*>(.*?)</pre>', dom, re.S)
        self.assertIsNotNone(m, dom[-2000:])
        summary = json.loads(m.group(1).replace("&quot;", '"').replace("&amp;", "&"))
        print("dashboard summary:", json.dumps(summary))
        self.assertEqual(summary["job_id"], job)
        points = summary["points"]
        for chart in ("loss", "tokens_per_second", "mfu"):
            self.assertGreater(points.get(chart, 0), 0, f"{chart}: {summary}")
        self.assertEqual(points["loss"], STEPS, summary)
        self.assertGreater(summary["heatmap_cells"], 0, summary)
        self.assertEqual(summary["heatmap_cells"], STEPS * 4, summary)  # 4 MoE layers
        self.assertGreater(summary["last_loss"], 0)
        self.assertGreater(summary["last_tokens_per_second"], 0)
        # The workers panel: both, one free again now the first job is over, one the limited
        # job's.
        self.assertEqual(summary["workers"], 2, summary)
        self.assertEqual(summary["worker_states"], {"ready": 1, "busy": 1}, summary)
        self.assertEqual(list(summary["time_left"]), [limited], summary)
        self.assertRegex(summary["time_left"][limited], r"^1h5\dm left$", summary)

        out_dir = os.path.join(os.path.dirname(os.path.abspath(harness.BIN_DIR)),
                               "test-artifacts")
        os.makedirs(out_dir, exist_ok=True)
        shot = os.path.join(out_dir, "dashboard.png")
        if os.path.exists(shot):
            os.remove(shot)
        self.run_browser(f"--screenshot={shot}", "--window-size=1400,1000",
                         f"{self.base}/?job={job}")
        self.assertTrue(os.path.getsize(shot) > 10000, shot)
        print("dashboard screenshot:", shot)


if __name__ == "__main__":
    harness.main()
