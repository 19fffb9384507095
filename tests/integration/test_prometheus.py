"""The controller's /metrics end to end: a real train job, the exposition checked by promtool, and
a real Prometheus scraping the controller whose stored values match what the job itself reported.

Needs `promtool` and `prometheus` (scripts/setup.sh installs the Debian package). One rank, so the
controller's job-level aggregate of a step equals rank 0's own numbers that `furnace status`
shows. Prometheus's service discovery takes about 5 s before the first scrape, so it starts
before the job is submitted."""
import json
import math
import os
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request

import harness

STEPS = 400  # long enough for Prometheus to scrape the live series while the job runs
SETUP_HINT = "run scripts/setup.sh (it installs the Debian package `prometheus`)"


def train_job(name):
    return f"""name: {name}
kind: train
model: {{vocab: 64, seq_len: 64, d_model: 64, heads: 4, layers: 4, expert_ffn: 128}}
moe: {{experts: 8, top_k: 2, capacity_factor: 0}}
parallel: {{micro_batch: 8, micro_batches: 2}}
train: {{steps: {STEPS}, lr: 3.0e-3, warmup: 10, seed: 1}}
data: {{source: markov, seed: 7}}
checkpoint: {{every: 30, keep: 1}}
recovery: {{max_restarts: 1, hang_timeout_s: 120}}
"""


def http_get(url, timeout=5):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.status, r.headers.get("Content-Type", ""), r.read().decode()


class Prometheus:
    """A throwaway Prometheus server scraping one target every second."""

    def __init__(self, target, log_dir):
        self.port = harness.free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.data = tempfile.mkdtemp(prefix="furnace-prom-")
        self.config = os.path.join(self.data, "prometheus.yml")
        with open(self.config, "w") as f:
            # honor_labels: the controller's `job` label is the furnace job id (as in
            # deploy/prometheus/prometheus.yml).
            f.write(f"""global:
  scrape_interval: 1s
  evaluation_interval: 1s
scrape_configs:
  - job_name: furnace-controller
    honor_labels: true
    static_configs:
      - targets: ["{target}"]
""")
        self.log_path = os.path.join(log_dir, "prometheus.log")
        self.log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            ["prometheus", f"--config.file={self.config}", f"--storage.tsdb.path={self.data}/tsdb",
             f"--web.listen-address=127.0.0.1:{self.port}"],
            stdout=self.log, stderr=subprocess.STDOUT)

    def wait_ready(self, timeout=30):
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.proc.poll() is not None:
                break
            try:
                if http_get(self.url + "/-/ready", timeout=1)[0] == 200:
                    return
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.2)
        raise AssertionError("prometheus did not become ready\n" + self.tail())

    def query(self, promql):
        """The instant vector for `promql`: a list of (labels, value)."""
        url = self.url + "/api/v1/query?" + urllib.parse.urlencode({"query": promql})
        body = json.loads(http_get(url)[2])
        if body.get("status") != "success":
            raise AssertionError(f"query {promql} failed: {body}")
        return [(r["metric"], float(r["value"][1])) for r in body["data"]["result"]]

    def tail(self):
        self.log.flush()
        with open(self.log_path, errors="replace") as f:
            return f.read()[-3000:]

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        shutil.rmtree(self.data, ignore_errors=True)


class PrometheusTest(harness.ClusterTest):
    WORKERS = 1

    def setUp(self):
        for tool in ("promtool", "prometheus"):
            self.assertIsNotNone(shutil.which(tool), f"{tool} not found: {SETUP_HINT}")
        self.metrics_port = harness.free_port()
        self.metrics_url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        self.cluster = harness.Cluster(workers=self.WORKERS,
                                       metrics_port=self.metrics_port).start()

    def scrape(self):
        status, content_type, text = http_get(self.metrics_url)
        self.assertEqual(status, 200)
        self.assertTrue(content_type.startswith("text/plain"), content_type)
        return text

    def promtool_check(self, text):
        r = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True,
                           text=True, timeout=60)
        self.assertEqual(r.returncode, 0,
                         f"promtool check metrics exit {r.returncode} (1 = parse error, "
                         f"3 = lint):\n{r.stdout}{r.stderr}\n--- exposition:\n{text[-3000:]}")
        self.assertEqual(r.stdout + r.stderr, "", "promtool has findings")

    def poll(self, what, fn, timeout):
        """fn() until it returns something truthy; the last value on timeout, in the message."""
        deadline = time.time() + timeout
        last = None
        while time.time() < deadline:
            last = fn()
            if last:
                return last
            time.sleep(0.5)
        raise AssertionError(f"timed out after {timeout} s waiting for {what}; last: {last}\n"
                             + self.prom.tail())

    def test_prometheus_scrapes_the_jobs_own_numbers(self):
        c = self.cluster
        self.prom = Prometheus(f"127.0.0.1:{self.metrics_port}", c.state)
        self.addCleanup(self.prom.stop)
        self.prom.wait_ready()

        job = c.submit(c.write_job("train.yaml", train_job("prom")))
        sel = f'{{job="{job}"}}'
        c.wait_for(job, lambda d: int(d["summary"].get("step", 0)) >= 3, timeout=120,
                   what="the first training steps")

        # The live exposition: training series for the job, no parse errors, no lint findings.
        text = self.scrape()
        self.assertIn(f'furnace_job_mfu_ratio{sel} ', text)
        self.assertIn(f'furnace_moe_routing_imbalance_ratio{{job="{job}",layer="0"}} ', text)
        self.promtool_check(text)

        # A real Prometheus sees the controller and the job's series.
        self.poll("up == 1", lambda: [v for _, v in self.prom.query(
            'up{job="furnace-controller"}') if v == 1], timeout=20)
        self.poll("furnace_job_mfu_ratio", lambda: self.prom.query(
            f"furnace_job_mfu_ratio{sel}"), timeout=20)
        self.poll("furnace_moe_routing_imbalance_ratio", lambda: self.prom.query(
            f"furnace_moe_routing_imbalance_ratio{sel}"), timeout=20)

        # Once the job has ended its last step is stable; Prometheus must hold the values the
        # job reported for it (its step, state and losses), and the live gauges (MFU, routing)
        # end with the job: a finished job adds nothing to the running ones' sums.
        d = c.wait_state(job, harness.FINAL, timeout=300)
        self.assertEqual(d["summary"]["state"], "JOB_SUCCEEDED", d["summary"])
        m = d["telemetry"]
        self.assertEqual(sorted(int(l["layer"]) for l in m["moe_layers"]), [0, 1, 2, 3], m)
        text = self.scrape()
        self.promtool_check(text)
        self.assertNotIn(f'furnace_job_mfu_ratio{sel} ', text)
        self.assertNotIn(f'furnace_moe_routing_imbalance_ratio{{job="{job}"', text)
        self.assertIn(f'furnace_job_loss{sel} ', text)

        def matches():
            loss = self.prom.query(f"furnace_job_loss{sel}")
            mfu = self.prom.query(f"furnace_job_mfu_ratio{sel}")
            step = self.prom.query(f"furnace_job_step{sel}")
            state = self.prom.query(f'furnace_job_state{{job="{job}",state="succeeded"}}')
            got = {"loss": [v for _, v in loss], "mfu": [v for _, v in mfu],
                   "step": [v for _, v in step], "succeeded": [v for _, v in state]}
            ok = (len(loss) == 1 and math.isclose(loss[0][1], m["loss"], rel_tol=1e-6)
                  and not mfu and got["step"] == [STEPS] and got["succeeded"] == [1])
            seen.append(got)
            return ok

        seen = []
        try:
            self.poll("Prometheus to hold the job's final loss and step, and no live MFU",
                      matches, timeout=20)
        except AssertionError as e:
            want = {"loss": m["loss"], "step": STEPS}
            raise AssertionError(f"{e}\nPrometheus has: {seen[-1:]}\n"
                                 f"furnace status has: {want}") from None


if __name__ == "__main__":
    harness.main()
