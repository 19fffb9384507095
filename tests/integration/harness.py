"""Test harness: a real furnace-controller with local furnace-worker daemons on loopback.

Everything here goes through the same binaries and CLI a user runs; nothing is faked. Each
Cluster gets its own state dir and port, and on close makes sure no process it started (the
controller, its workers, their ranks) is left behind.
"""
import json
import os
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
import unittest

BIN_DIR = os.environ.get("FURNACE_TEST_BIN_DIR", "")
SRC_DIR = os.environ.get("FURNACE_TEST_SRC_DIR", "")

FINAL = ("JOB_SUCCEEDED", "JOB_FAILED", "JOB_CANCELLED")


def parse_args():
    """ctest passes --bin DIR --src DIR; everything else goes to unittest."""
    global BIN_DIR, SRC_DIR
    rest = [sys.argv[0]]
    args = iter(sys.argv[1:])
    for a in args:
        if a == "--bin":
            BIN_DIR = next(args)
        elif a == "--src":
            SRC_DIR = next(args)
        else:
            rest.append(a)
    sys.argv = rest


_HANDED_OUT = set()


def free_port():
    """A port nothing listens on now, and never one this process handed out before: two taken one
    after the other could otherwise be the same (the kernel may give a port again once its probe
    socket is closed), and a controller's gRPC and metrics servers would then collide."""
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port not in _HANDED_OUT:
            _HANDED_OUT.add(port)
            return port


def processes_under(path):
    """Pids of processes whose command line mentions `path` (our workers and ranks)."""
    pids = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
            with open(f"/proc/{pid}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if path in cmd and state != "Z":
            pids.append(int(pid))
    return pids


class Cluster:
    """`tls=True`: `furnace certs init` makes a CA, certificates and tokens in <state>/certs; the
    controller listens with mutual TLS, a token file and a join token (its local workers dial it
    with its certificate and the join token), and cli() sends the admin token unless told
    `token="read"` or `token=None`."""

    def __init__(self, workers=4, worker_timeout=5.0, metrics_port=None, tls=False,
                 extra_args=()):
        self.state = tempfile.mkdtemp(prefix="furnace-it-")
        self.port = free_port()
        self.addr = f"127.0.0.1:{self.port}"
        self.workers = workers
        self.worker_timeout = worker_timeout
        # Every cluster serves /metrics and the dashboard on its own free port (never the default
        # 9464: tests run in parallel).
        self.metrics_port = metrics_port or free_port()
        self.controller = None
        self.extra_args = list(extra_args)  # more furnace-controller flags
        self.log = open(os.path.join(self.state, "controller.out"), "ab")
        self.tls = tls
        self.certs = os.path.join(self.state, "certs") if tls else None
        if tls:
            subprocess.run([os.path.join(BIN_DIR, "furnace"), "certs", "init", self.certs],
                           check=True, capture_output=True, timeout=60)

    def security_flags(self):
        """The controller's TLS and token flags (none without tls)."""
        if not self.tls:
            return []
        c = self.certs
        return ["--tls-ca", f"{c}/ca.pem", "--tls-cert", f"{c}/controller.pem",
                "--tls-key", f"{c}/controller.key", "--token-file", f"{c}/tokens",
                "--join-token-file", f"{c}/join.token"]

    # -- processes -------------------------------------------------------------------------
    def start(self, wait_workers=True):
        self.controller = subprocess.Popen(
            [os.path.join(BIN_DIR, "furnace-controller"), "--listen", self.addr,
             "--state-dir", self.state, "--local-workers", str(self.workers),
             "--heartbeat-interval", "0.5", "--worker-timeout", str(self.worker_timeout),
             "--metrics-listen", f"127.0.0.1:{self.metrics_port}", *self.security_flags(),
             *self.extra_args],
            stdout=self.log, stderr=subprocess.STDOUT)
        self.wait_up()
        if wait_workers:
            self.wait_workers(self.workers)
        return self

    def wait_up(self, timeout=30):
        """Until the controller answers (it binds after loading its job store)."""
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.cli("jobs").returncode == 0:
                return
            if self.controller.poll() is not None:
                break
            time.sleep(0.1)
        raise AssertionError("the controller did not come up\n" + self.dump_logs())

    def kill_controller(self):
        self.controller.send_signal(signal.SIGKILL)
        self.controller.wait()

    def close(self):
        if self.controller and self.controller.poll() is None:
            self.controller.send_signal(signal.SIGTERM)
            try:
                self.controller.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.controller.kill()
                self.controller.wait()
        # Workers adopted by a restarted controller, or left by a killed one.
        deadline = time.time() + 10
        while processes_under(self.state) and time.time() < deadline:
            time.sleep(0.2)
        leftover = processes_under(self.state)
        for pid in leftover:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        self.log.close()
        return leftover

    def dump_logs(self):
        """Controller and worker logs, for a failing test's output."""
        out = []
        for root, _, files in os.walk(self.state):
            for name in sorted(files):
                if name.endswith((".log", ".out")):
                    p = os.path.join(root, name)
                    with open(p, errors="replace") as f:
                        out.append(f"===== {p}\n" + f.read()[-4000:])
        return "\n".join(out)

    # -- CLI -------------------------------------------------------------------------------
    def cli(self, *args, timeout=120, token="admin"):
        """`furnace --controller ADDR ARGS`; with tls, over TLS with <certs>/<token>.token."""
        flags = []
        if self.tls:
            flags = ["--tls-ca", f"{self.certs}/ca.pem"]
            if token:
                flags += ["--token-file", f"{self.certs}/{token}.token"]
        env = {k: v for k, v in os.environ.items() if not k.startswith("FURNACE_TOKEN")}
        return subprocess.run([os.path.join(BIN_DIR, "furnace"), "--controller", self.addr,
                               *flags, *args], capture_output=True, text=True, timeout=timeout,
                              env=env)

    def cli_json(self, *args):
        r = self.cli("--json", *args)
        if r.returncode != 0:
            raise AssertionError(f"furnace {' '.join(args)} failed ({r.returncode}): {r.stderr}")
        return json.loads(r.stdout)

    def wait_workers(self, n, timeout=30):
        deadline = time.time() + timeout
        while time.time() < deadline:
            r = self.cli("--json", "workers")
            if r.returncode == 0:
                ws = json.loads(r.stdout).get("workers", [])
                if sum(1 for w in ws if w.get("state") == "WORKER_STATE_READY") >= n:
                    return ws
            time.sleep(0.2)
        raise AssertionError(f"{n} workers not ready after {timeout} s\n" + self.dump_logs())

    def export(self, job_id, name):
        """`furnace export JOB --format safetensors` into the state dir; {tensor: (dtype, shape,
        raw bytes)}."""
        path = os.path.join(self.state, name)
        r = self.cli("export", job_id, "--format", "safetensors", "-o", path)
        if r.returncode != 0:
            raise AssertionError(f"furnace export {job_id} failed ({r.returncode}): "
                                 f"{r.stdout}{r.stderr}")
        return read_safetensors(path)

    def write_job(self, name, text):
        path = os.path.join(self.state, name)
        with open(path, "w") as f:
            f.write(text)
        return path

    def submit(self, path):
        r = self.cli("--json", "submit", path)
        if r.returncode != 0:
            raise AssertionError(f"submit failed ({r.returncode}): {r.stderr}")
        return json.loads(r.stdout)["job_id"]

    def job(self, job_id):
        return self.cli_json("status", job_id)

    def wait_for(self, job_id, predicate, timeout=90, what="condition"):
        deadline = time.time() + timeout
        detail = None
        while time.time() < deadline:
            r = self.cli("--json", "status", job_id)
            if r.returncode == 0:
                detail = json.loads(r.stdout)
                if predicate(detail):
                    return detail
            time.sleep(0.1)
        raise AssertionError(f"timed out waiting for {what}; last status:\n"
                             f"{json.dumps(detail, indent=1)[-3000:]}\n{self.dump_logs()}")

    def wait_state(self, job_id, states, timeout=90):
        if isinstance(states, str):
            states = (states,)
        return self.wait_for(job_id, lambda d: d["summary"]["state"] in states, timeout,
                             f"state in {states}")


def read_safetensors(path):
    """{tensor: (dtype, shape, raw bytes)} of a safetensors file (metadata left out)."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    return {name: (t["dtype"], tuple(t["shape"]), data[t["data_offsets"][0]:t["data_offsets"][1]])
            for name, t in header.items() if name != "__metadata__"}


def commcheck_job(name, ranks=4, rounds=1, extra="", start_timeout_s=30):
    """A small, quick commcheck job spec (YAML text)."""
    return f"""name: {name}
kind: commcheck
parallel: {{dp: {ranks}}}
commcheck:
  min_bytes: 4KiB
  max_bytes: 64KiB
  step_factor: 4
  iters: 3
  rounds: {rounds}
  timeout_s: 20
recovery:
  max_restarts: 3
  backoff: {{initial_s: 0.2, max_s: 1.0, multiplier: 2.0}}
  heartbeat_timeout_s: 5
  hang_timeout_s: 8
  start_timeout_s: {start_timeout_s}
{extra}"""


class ClusterTest(unittest.TestCase):
    """Starts a cluster per test; checks nothing is left running afterwards."""
    WORKERS = 4
    CONTROLLER_ARGS = ()  # more furnace-controller flags

    def setUp(self):
        self.cluster = Cluster(workers=self.WORKERS, extra_args=self.CONTROLLER_ARGS).start()

    def tearDown(self):
        leftover = self.cluster.close()
        self.assertEqual(leftover, [], "processes left behind after the controller stopped")


def main():
    parse_args()
    unittest.main(verbosity=2)
