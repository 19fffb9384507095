"""Hosts for the integration tests as Linux network namespaces (needs root and iproute2).

A Network is one namespace per host plus a "switch" namespace holding a bridge; each host has an
`eth0` veth whose peer is a port of that bridge, and an address in a private /24 that exists only
inside these namespaces (the root namespace gets no interface, route or address). Cutting a
host's link sets its bridge port down: the host's `eth0` loses carrier, nothing is killed and no
socket is closed, as when a cable or a top-of-rack port fails.

A NetnsCluster is harness.Cluster with its controller on one host and its worker daemons on the
others, each started with `ip netns exec` and `--host <its address>`; the CLI runs on the
controller's host. Namespace names carry the test process's pid (`fmh<pid>-<host>`), so a run
never touches another's, and `remove_leftovers()` deletes those of runs that were killed (their
processes first), which `Network.create` calls before it makes its own.
"""
import os
import re
import shutil
import signal
import subprocess
import time

import harness

PREFIX = "fmh"
SUBNET = "10.213.0"  # only inside the namespaces


def _ip(*args, check=True):
    r = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if check and r.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {r.stderr.strip()}")
    return r


def unavailable():
    """Why namespaces cannot be made here, or None when they can."""
    if os.geteuid() != 0:
        return "network namespaces need root (this test runs as uid %d)" % os.geteuid()
    if shutil.which("ip") is None:
        return "`ip` (iproute2) is not installed"
    probe = f"{PREFIX}{os.getpid()}-probe"
    r = _ip("netns", "add", probe, check=False)
    if r.returncode != 0:
        return f"`ip netns add` failed: {r.stderr.strip()}"
    try:
        r = _ip("-n", probe, "link", "add", "probe0", "type", "veth", "peer", "name", "probe1",
                check=False)
        if r.returncode != 0:
            return f"cannot make a veth pair in a namespace: {r.stderr.strip()}"
        r = _ip("-n", probe, "link", "add", "probe-br", "type", "bridge", check=False)
        if r.returncode != 0:
            return f"cannot make a bridge in a namespace: {r.stderr.strip()}"
    finally:
        _ip("netns", "del", probe, check=False)
    return None


def _kill_pids_in(ns):
    """SIGKILLs every process in namespace `ns`; waits until they are gone."""
    deadline = time.time() + 10
    while time.time() < deadline:
        pids = [int(p) for p in _ip("netns", "pids", ns, check=False).stdout.split()]
        pids = [p for p in pids if p != os.getpid()]
        if not pids:
            return
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        time.sleep(0.1)


def _names():
    out = _ip("netns", "list", check=False).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def remove_leftovers():
    """Deletes the namespaces (and kills the processes in them) of earlier runs whose test process
    is gone; returns their names."""
    removed = []
    for name in _names():
        m = re.fullmatch(PREFIX + r"(\d+)-.*", name)
        if not m or int(m.group(1)) == os.getpid() or os.path.exists(f"/proc/{m.group(1)}"):
            continue
        _kill_pids_in(name)
        _ip("netns", "del", name, check=False)
        removed.append(name)
    return removed


class Network:
    """A bridge and one namespace per host: `hosts` names them; host i gets SUBNET.(10 + i)."""

    def __init__(self, hosts):
        self.tag = f"{PREFIX}{os.getpid()}-"
        self.switch = self.tag + "sw"
        self.hosts = list(hosts)
        self.address = {h: f"{SUBNET}.{10 + i}" for i, h in enumerate(self.hosts)}

    def ns(self, host):
        return self.tag + host

    def port(self, host):
        return f"p-{host}"[:15]

    def create(self):
        remove_leftovers()
        self.destroy()  # a pid reused from a killed run
        _ip("netns", "add", self.switch)
        _ip("-n", self.switch, "link", "add", "br0", "type", "bridge")
        _ip("-n", self.switch, "link", "set", "br0", "up")
        for h in self.hosts:
            ns = self.ns(h)
            _ip("netns", "add", ns)
            _ip("-n", ns, "link", "set", "lo", "up")
            _ip("link", "add", "eth0", "netns", ns, "type", "veth", "peer", "name",
                self.port(h), "netns", self.switch)
            _ip("-n", self.switch, "link", "set", self.port(h), "master", "br0", "up")
            _ip("-n", ns, "addr", "add", f"{self.address[h]}/24", "dev", "eth0")
            _ip("-n", ns, "link", "set", "eth0", "up")
        return self

    def exec_argv(self, host, argv):
        """`argv` run on `host` (in its namespace)."""
        return ["ip", "netns", "exec", self.ns(host), *argv]

    def cut(self, host):
        """Takes the host's bridge port down: a link cut, its processes keep running."""
        _ip("-n", self.switch, "link", "set", self.port(host), "down")

    def restore(self, host):
        _ip("-n", self.switch, "link", "set", self.port(host), "up")

    def destroy(self):
        """Kills what runs in the namespaces and deletes them (and with them every veth and the
        bridge). Safe to call more than once."""
        mine = [n for n in _names() if n.startswith(self.tag)]
        for name in mine:
            _kill_pids_in(name)
        for name in mine:
            _ip("netns", "del", name, check=False)

    def left(self):
        """Namespaces of this network that still exist."""
        return [n for n in _names() if n.startswith(self.tag)]


def _insecure(binary):
    """["--insecure"] when `binary` has that flag (a build that refuses a plain non-loopback
    listen or connection without it), else []."""
    help_text = subprocess.run([binary, "--help"], capture_output=True, text=True,
                               timeout=30).stdout
    return ["--insecure"] if "--insecure" in help_text else []


def tls_security(cli_binary, certs_dir, controller_host):
    """Flags for mutual TLS and tokens: `furnace certs init` makes a CA, the controller's
    certificate (also valid for `controller_host`), the workers' and the tokens."""
    r = subprocess.run([cli_binary, "certs", "init", certs_dir, "--host", controller_host],
                       capture_output=True, text=True, timeout=60)
    if r.returncode != 0:
        raise AssertionError(f"furnace certs init failed ({r.returncode}): {r.stderr}")
    d = certs_dir
    return {
        "controller": ["--tls-cert", f"{d}/controller.pem", "--tls-key", f"{d}/controller.key",
                       "--tls-ca", f"{d}/ca.pem", "--token-file", f"{d}/tokens",
                       "--join-token-file", f"{d}/join.token"],
        "worker": ["--tls-cert", f"{d}/worker.pem", "--tls-key", f"{d}/worker.key",
                   "--tls-ca", f"{d}/ca.pem", "--join-token-file", f"{d}/join.token"],
        "cli": ["--tls-ca", f"{d}/ca.pem", "--token-file", f"{d}/admin.token"],
    }


class NetnsCluster(harness.Cluster):
    """A controller on host `ctl` and `per_host` worker daemons on each of `worker_hosts`.

    tls: run the daemons and the CLI with TLS and tokens (tls_security). Without, each binary gets
    `--insecure` where the build has that flag (the namespace addresses are not loopback)."""

    PORT = 7070

    def __init__(self, network, worker_hosts, per_host=2, worker_timeout=5.0, tls=False):
        super().__init__(workers=len(worker_hosts) * per_host, worker_timeout=worker_timeout,
                         metrics_port=9464)
        self.net = network
        self.worker_hosts = list(worker_hosts)
        self.per_host = per_host
        self.addr = f"{network.address['ctl']}:{self.PORT}"
        self.bin = {role: os.path.join(harness.BIN_DIR, name) for role, name in (
            ("controller", "furnace-controller"), ("worker", "furnace-worker"), ("cli", "furnace"))}
        if tls:
            self.security = tls_security(self.bin["cli"], os.path.join(self.state, "certs"),
                                         network.address["ctl"])
        else:
            self.security = {role: _insecure(b) for role, b in self.bin.items()}
        self.worker_procs = {}  # worker id -> Popen
        self.worker_host = {}  # worker id -> host name

    def start(self, wait_workers=True):
        ctl_bin = self.bin["controller"]
        sec = self.security["controller"]
        self.controller = subprocess.Popen(
            self.net.exec_argv("ctl", [
                ctl_bin, "--listen", self.addr, "--state-dir", self.state,
                "--heartbeat-interval", "0.5", "--worker-timeout", str(self.worker_timeout),
                "--metrics-listen", f"127.0.0.1:{self.metrics_port}", *sec]),
            stdout=self.log, stderr=subprocess.STDOUT)
        self.wait_up()
        worker_bin = self.bin["worker"]
        wsec = self.security["worker"]
        for host in self.worker_hosts:
            for slot in range(self.per_host):
                wid = f"{host}/{slot}"
                work = os.path.join(self.state, f"{host}-{slot}")
                os.makedirs(work, exist_ok=True)
                out = open(os.path.join(work, "agent.out"), "ab")
                self.worker_procs[wid] = subprocess.Popen(
                    self.net.exec_argv(host, [
                        worker_bin, "--controller", self.addr, "--slot", str(slot),
                        "--host", self.net.address[host], "--id", wid, "--work-dir", work,
                        "--shutdown-grace", "3", *wsec]),
                    stdout=out, stderr=subprocess.STDOUT)
                out.close()
                self.worker_host[wid] = host
        if wait_workers:
            self.wait_workers(self.workers)
        return self

    def cli(self, *args, timeout=120):
        argv = [self.bin["cli"], "--controller", self.addr, *self.security["cli"], *args]
        return subprocess.run(self.net.exec_argv("ctl", argv), capture_output=True, text=True,
                              timeout=timeout)

    def workers_by_id(self):
        return {w["worker_id"]: w for w in self.cli_json("workers").get("workers", [])}

    def close(self):
        # Agents first (they stop their ranks), then the controller and the harness's sweep.
        for p in self.worker_procs.values():
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        deadline = time.time() + 20
        for p in self.worker_procs.values():
            try:
                p.wait(timeout=max(0.1, deadline - time.time()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        return super().close()
