"""deploy/ checked with the validators Debian has: every Kubernetes manifest parsed and checked
for the fields we rely on (deploy_checks.py), the systemd units by `systemd-analyze verify` and
for their flags, credentials and hardening, the Slurm script by `bash -n`, shellcheck and a dry
run under a fake `srun`, the daemons' example configs against their flags. Flags are compared
with the real binaries' --help, so a renamed flag breaks this test, not a deployment.

    test_deploy.py --bin BUILD/bin --src REPO [unittest args]
"""
import argparse
import copy
import os
import pathlib
import re
import shutil
import stat
import subprocess
import sys
import tempfile
import time
import unittest
import urllib.error
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import deploy_checks as dc  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "integration"))
from harness import free_port  # noqa: E402  (ports never handed out twice in this process)

ARGS = None
SETUP_HINT = "scripts/setup.sh installs it"


def src(*parts):
    return pathlib.Path(ARGS.src, *parts)


def flags_of():
    return {b: dc.help_flags(os.path.join(ARGS.bin, b)) for b in dc.BINARIES}


def tool(name, package):
    path = shutil.which(name)
    if path is None:
        raise AssertionError(f"{name} not found (Debian package {package}; {SETUP_HINT})")
    return path


class KubernetesTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.flags = flags_of()
        cls.k8s = src("deploy", "k8s")
        cls.files = sorted(p for p in cls.k8s.glob("*.yaml") if p.name != "kustomization.yaml")
        cls.docs = dc.load_manifests(cls.files)

    def assertClean(self, problems):
        self.assertEqual(problems, [], "\n" + "\n".join(problems))

    def test_every_manifest_is_a_known_object_in_the_namespace(self):
        self.assertGreaterEqual(len(self.docs), 10)
        self.assertClean(dc.check_objects(self.docs))

    def test_workloads_selectors_volumes_flags_and_gpus(self):
        kinds = {d["kind"] for _, d in self.docs}
        self.assertIn("Deployment", kinds)
        self.assertTrue(kinds & {"StatefulSet", "DaemonSet"}, "no worker StatefulSet/DaemonSet")
        self.assertClean(dc.check_workloads(copy.deepcopy(self.docs), self.flags))

    def test_services_select_pods_and_their_ports(self):
        self.assertClean(dc.check_services(self.docs))

    def test_prometheus_annotations_point_at_the_metrics_port(self):
        self.assertClean(dc.check_prometheus_annotations(self.docs))

    def test_metrics_proxy_forwards_to_the_loopback_listener(self):
        self.assertClean(dc.check_metrics_proxy(self.docs))

    def test_secrets_are_a_template_of_placeholders(self):
        kinds = {d["kind"] for p, d in self.docs if p.endswith(".template.yaml")}
        self.assertEqual(kinds, {"Secret"})
        self.assertClean(dc.check_secret_template(self.docs))

    def test_kustomization_applies_every_manifest_but_the_template(self):
        with open(self.k8s / "kustomization.yaml") as f:
            k = dc.yaml.safe_load(f)
        self.assertEqual(k.get("apiVersion"), "kustomize.config.k8s.io/v1beta1")
        self.assertEqual(k.get("kind"), "Kustomization")
        want = sorted(p.name for p in self.files if not p.name.endswith(".template.yaml"))
        self.assertEqual(sorted(k.get("resources", [])), want)

    def test_job_configmap_matches_configs(self):
        r = subprocess.run([sys.executable, str(self.k8s / "make_job_configs.py"), "--check"],
                           capture_output=True, text=True)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        cm = [d for _, d in self.docs if d["kind"] == "ConfigMap" and
              d["metadata"]["name"] == "furnace-jobs"]
        self.assertEqual(len(cm), 1)
        self.assertEqual(cm[0]["data"]["demo.yaml"], src("configs", "demo.yaml").read_text())

    def test_checks_catch_broken_manifests(self):
        """Each check fails on a manifest broken in the way it looks for."""
        def broken(mutate):
            docs = copy.deepcopy(self.docs)
            for _, d in docs:
                mutate(d)
            return docs

        def pod(d):
            return d["spec"]["template"]["spec"] if d.get("kind") in dc.WORKLOADS else None

        def unknown_flag(d):
            if pod(d):
                pod(d)["containers"][0]["args"].append("--no-such-flag=1")

        def bad_selector(d):
            if pod(d):
                d["spec"]["selector"]["matchLabels"] = {"app.kubernetes.io/name": "other"}

        def lost_volume(d):
            if pod(d):
                pod(d)["volumes"] = [v for v in pod(d)["volumes"] if v["name"] != "tls"]

        def wrong_key(d):
            if pod(d):
                for v in pod(d)["volumes"]:
                    for item in v.get("secret", {}).get("items", []):
                        item["key"] = item["key"] + ".old"

        def no_gpu(d):
            if d.get("kind") == "StatefulSet":
                pod(d)["containers"][0]["resources"]["limits"].pop("nvidia.com/gpu")

        def wrong_port(d):
            if d.get("kind") == "Service":
                d["spec"]["ports"] = [{"name": "x", "port": 1, "targetPort": "nope"}]

        def wrong_api(d):
            if d.get("kind") == "Deployment":
                d["apiVersion"] = "extensions/v1beta1"

        def real_secret(d):
            if d.get("kind") == "Secret":
                d["stringData"]["ca.pem"] = "-----BEGIN CERTIFICATE-----"

        def insecure(d):
            if pod(d):
                pod(d)["containers"][0]["args"].append("--insecure")

        def private_secret(d):
            if pod(d):
                for v in pod(d)["volumes"]:
                    if "secret" in v:
                        v["secret"]["defaultMode"] = 0o400

        def open_metrics(d):
            if d.get("kind") == "Deployment":
                args = pod(d)["containers"][0]["args"]
                args[:] = [a.replace("127.0.0.1:9464", "0.0.0.0:9464") for a in args]

        def no_advertise(d):
            if d.get("kind") == "Deployment":
                args = pod(d)["containers"][0]["args"]
                args[:] = [a for a in args if not a.startswith("--advertise")]

        def mount_point_work_dir(d):
            if d.get("kind") == "StatefulSet":
                args = pod(d)["containers"][0]["args"]
                args[:] = [re.sub(r"^--work-dir=.*", "--work-dir=/var/lib/furnace-worker", a)
                           for a in args]

        cases = [
            (mount_point_work_dir, lambda ds: dc.check_workloads(ds, self.flags), "mount point"),
            (no_advertise, lambda ds: dc.check_workloads(ds, self.flags), "--advertise"),
            (insecure, lambda ds: dc.check_workloads(ds, self.flags), "--insecure"),
            (private_secret, lambda ds: dc.check_workloads(ds, self.flags), "unreadable"),
            (open_metrics, lambda ds: dc.check_workloads(ds, self.flags), "127.0.0.1"),
            (open_metrics, dc.check_metrics_proxy, "forwards to"),
            (unknown_flag, lambda ds: dc.check_workloads(ds, self.flags), "--no-such-flag"),
            (bad_selector, lambda ds: dc.check_workloads(ds, self.flags), "selector"),
            (lost_volume, lambda ds: dc.check_workloads(ds, self.flags), "no volume"),
            (wrong_key, lambda ds: dc.check_workloads(ds, self.flags), "not in Secret"),
            (no_gpu, lambda ds: dc.check_workloads(ds, self.flags), "nvidia.com/gpu"),
            (wrong_port, dc.check_services, "targetPort"),
            (wrong_api, dc.check_objects, "apiVersion"),
            (real_secret, dc.check_secret_template, "placeholder"),
        ]
        for mutate, check, needle in cases:
            with self.subTest(mutate.__name__):
                problems = check(broken(mutate))
                self.assertTrue(any(needle in p for p in problems),
                                f"{mutate.__name__}: no problem mentions {needle!r}: {problems}")


class SystemdTest(unittest.TestCase):
    UNITS = ("furnace-controller.service", "furnace-worker@.service")

    @classmethod
    def setUpClass(cls):
        cls.flags = flags_of()
        cls.texts = {u: src("deploy", "systemd", u).read_text() for u in cls.UNITS}

    def verify(self, texts):
        """systemd-analyze verify on copies whose ExecStart runs the binaries of this build (verify
        checks that the program exists); the template as instance @0. Returns its output."""
        analyze = tool("systemd-analyze", "systemd")
        with tempfile.TemporaryDirectory() as tmp:
            paths = []
            for unit, text in texts.items():
                text = text.replace("/usr/local/bin/", os.path.abspath(ARGS.bin) + "/")
                pathlib.Path(tmp, unit).write_text(text)
                paths.append(os.path.join(tmp, unit.replace("@.", "@0.")))
            r = subprocess.run([analyze, "verify", *paths], capture_output=True, text=True,
                               timeout=120, cwd=tmp)
            return r.returncode, (r.stdout + r.stderr).replace(tmp + "/", "")

    def test_units_pass_systemd_analyze_verify(self):
        rc, out = self.verify(self.texts)
        self.assertEqual((rc, out), (0, ""), out)

    def test_verify_reports_a_misspelt_option(self):
        texts = dict(self.texts)
        texts["furnace-worker@.service"] = texts["furnace-worker@.service"].replace(
            "NoNewPrivileges=yes", "NoNewPrivilege=yes")
        _, out = self.verify(texts)
        self.assertIn("NoNewPrivilege", out)

    def test_flags_credentials_and_hardening(self):
        for unit, text in self.texts.items():
            with self.subTest(unit):
                problems = dc.check_systemd_unit(unit, text, self.flags)
                self.assertEqual(problems, [], "\n" + "\n".join(problems))

    def test_checks_catch_broken_units(self):
        text = self.texts["furnace-worker@.service"]
        cases = [
            (text.replace("--tls-key", "--tls-private-key"), "--tls-private-key"),
            (text.replace("NoNewPrivileges=yes", "NoNewPrivileges=no"), "NoNewPrivileges"),
            (text.replace("LoadCredential=worker.key:", "LoadCredential=other.key:"),
             "LoadCredential=worker.key"),
            (text.replace("ReadWritePaths=/var/lib/furnace-worker /srv/furnace/checkpoints",
                          "ReadWritePaths=/var/lib/furnace-worker"), "--checkpoint-root"),
            (text.replace("LimitNOFILE=1048576\n", ""), "LimitNOFILE"),
        ]
        for broken, needle in cases:
            with self.subTest(needle):
                problems = dc.check_systemd_unit("unit", broken, self.flags)
                self.assertTrue(any(needle in p for p in problems), problems)


def certs_init(directory):
    """Runs `furnace certs init DIRECTORY` (the development CA, certificates and tokens); returns
    the names of the files it wrote (again over the ones a former call wrote)."""
    directory = pathlib.Path(directory)
    r = subprocess.run([os.path.join(ARGS.bin, "furnace"), "certs", "init", str(directory),
                        "--host", "furnace-controller.furnace.svc", "--force"],
                       capture_output=True, text=True, timeout=120)
    if r.returncode != 0:
        raise AssertionError(f"furnace certs init: {r.stdout}{r.stderr}")
    return {p.name for p in directory.iterdir()}


class CertsLayoutTest(unittest.TestCase):
    """Every TLS file and token the deployments read is one `furnace certs init` writes, by the
    name it writes it under (README "Security", "Deployment"): a user who makes them with it and
    puts them where the units, the manifests and the example configs say finds them read."""

    @classmethod
    def setUpClass(cls):
        with tempfile.TemporaryDirectory() as tmp:
            cls.written = certs_init(pathlib.Path(tmp, "tls"))

    def assertWritten(self, where, names):
        self.assertTrue(names, f"{where}: no TLS file or token found (did the pattern change?)")
        missing = sorted(set(names) - self.written)
        self.assertEqual(missing, [], f"{where} reads files `furnace certs init` does not write "
                                      f"(it writes {sorted(self.written)})")

    def test_systemd_units_load_the_files_certs_init_writes(self):
        for unit in ("furnace-controller.service", "furnace-worker@.service"):
            text = src("deploy", "systemd", unit).read_text()
            creds = re.findall(r"^LoadCredential=([^:\s]+):(\S+)$", text, re.M)
            with self.subTest(unit):
                self.assertWritten(unit, [name for name, _ in creds])
                for name, path in creds:
                    self.assertEqual(path, f"/etc/furnace/tls/{name}", unit)

    def test_kubernetes_secrets_and_flags_use_the_names_certs_init_writes(self):
        docs = dc.load_manifests(sorted(src("deploy", "k8s").glob("*.yaml")))
        for path, d in docs:
            if d.get("kind") == "Secret":
                self.assertWritten(f"{path}: Secret {d['metadata']['name']}",
                                   list(d.get("stringData", {})))
        texts = "".join(p.read_text() for p in src("deploy", "k8s").glob("*.yaml"))
        read = re.findall(r"--(?:tls-ca|tls-cert|tls-key|token-file|join-token-file)="
                          r"/etc/furnace/\w+/(\S+)", texts)
        read += re.findall(r"ssl_\w+ /etc/furnace/tls/([^;\s]+);", texts)
        self.assertWritten("deploy/k8s (flags, metrics proxy)", read)
        scrape = src("deploy", "prometheus", "prometheus-k8s.yml").read_text()
        self.assertWritten("deploy/prometheus/prometheus-k8s.yml",
                           re.findall(r"_file: /etc/prometheus/furnace/(\S+)", scrape))

    def test_example_configs_name_the_files_certs_init_writes(self):
        text = src("deploy", "controller.example.yaml").read_text()
        read = re.findall(r"^# (?:tls-ca|tls-cert|tls-key|token-file|join-token-file): "
                          r"/etc/furnace/tls/(\S+)$", text, re.M)
        self.assertEqual(len(read), 5, text)
        self.assertWritten("deploy/controller.example.yaml", read)

    def test_the_slurm_script_defaults_to_the_files_certs_init_writes(self):
        text = src("deploy", "slurm", "furnace-workers.sbatch").read_text()
        default = re.search(r'FURNACE_JOIN_TOKEN:-/etc/furnace/tls/([^}"]+)\}', text)
        self.assertIsNotNone(default, "the join token's default is not under /etc/furnace/tls")
        self.assertWritten("furnace-workers.sbatch", [default.group(1)])


class ConfigExamplesTest(unittest.TestCase):
    def test_example_config_keys_are_flags(self):
        flags = flags_of()
        for name, binary in (("controller.example.yaml", "furnace-controller"),
                             ("worker.example.yaml", "furnace-worker")):
            problems = dc.check_config_keys(name, src("deploy", name).read_text(), binary, flags)
            self.assertEqual(problems, [], "\n".join(problems))


FAKE_SRUN = """#!/usr/bin/env bash
# Runs the step's command once per task of one node, as srun would, with SLURM_LOCALID set.
set -euo pipefail
n=1
while [ $# -gt 0 ] && [ "${1#-}" != "$1" ]; do
  case "$1" in --ntasks-per-node=*) n="${1#*=}" ;; esac
  shift
done
pids=()
for ((i = 0; i < n; i++)); do SLURM_LOCALID=$i SLURM_PROCID=$i "$@" & pids+=($!); done
for p in "${pids[@]}"; do wait "$p"; done
"""

RECORDER = """#!/usr/bin/env bash
# Stands in for furnace-worker: records its arguments, one a line.
printf '%s\\n' "$@" > "$FAKE_CALLS/$SLURM_LOCALID"
"""


class SlurmTest(unittest.TestCase):
    SCRIPT = None

    @classmethod
    def setUpClass(cls):
        cls.SCRIPT = str(src("deploy", "slurm", "furnace-workers.sbatch"))

    def test_bash_syntax(self):
        r = subprocess.run(["bash", "-n", self.SCRIPT], capture_output=True, text=True)
        self.assertEqual(r.returncode, 0, r.stderr)

    def test_shellcheck(self):
        r = subprocess.run([tool("shellcheck", "shellcheck"), self.SCRIPT], capture_output=True,
                           text=True, timeout=120)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)

    def run_script(self, tmp, args, **env_over):
        tmp = pathlib.Path(tmp)
        for name, text in (("srun", FAKE_SRUN), ("recorder", RECORDER)):
            p = tmp / name
            p.write_text(text)
            p.chmod(p.stat().st_mode | stat.S_IXUSR)
        (tmp / "calls").mkdir(exist_ok=True)
        certs_init(tmp / "tls")  # the files the script reads, as `furnace certs init` names them
        env = dict(os.environ, PATH=f"{tmp}:{os.environ['PATH']}", SLURM_JOB_ID="42",
                   SLURM_NTASKS_PER_NODE="3(x2)", SLURM_JOB_NUM_NODES="2",
                   FURNACE_TLS_DIR=str(tmp / "tls"), FURNACE_JOIN_TOKEN=str(tmp / "tls/join.token"),
                   FURNACE_BIN=str(tmp / "recorder"), FURNACE_WORK_DIR=str(tmp / "work"),
                   FAKE_CALLS=str(tmp / "calls"))
        env.pop("FURNACE_CONTROLLER", None)
        env.update(env_over)
        for name in [k for k, v in env.items() if v is None]:  # None: unset it
            del env[name]
        return subprocess.run(["bash", self.SCRIPT, *args], capture_output=True, text=True,
                              env=env, timeout=60)

    def test_dry_run_starts_one_worker_per_gpu_with_tls(self):
        worker_flags = flags_of()["furnace-worker"]
        with tempfile.TemporaryDirectory() as tmp:
            r = self.run_script(tmp, ["head:7070"])
            self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
            calls = sorted(pathlib.Path(tmp, "calls").iterdir())
            self.assertEqual([c.name for c in calls], ["0", "1", "2"])
            for c in calls:
                argv = c.read_text().splitlines()
                problems = dc.unknown_flags(f"task {c.name}", "furnace-worker", argv,
                                            {"furnace-worker": worker_flags})
                self.assertEqual(problems, [], "\n".join(problems))
                given = dict(dc.parse_args(argv))
                self.assertEqual(given["--controller"], "head:7070")
                self.assertEqual(given["--slot"], c.name)
                self.assertEqual(given["--tls-key"], f"{tmp}/tls/worker.key")
                self.assertEqual(given["--join-token-file"], f"{tmp}/tls/join.token")
                for flag in ("--tls-ca", "--tls-cert", "--tls-key", "--join-token-file"):
                    self.assertTrue(os.path.isfile(given[flag]), f"{flag} {given[flag]}")
                self.assertTrue(os.path.isdir(given["--work-dir"]), given["--work-dir"])

    def test_controller_from_the_environment(self):
        with tempfile.TemporaryDirectory() as tmp:
            r = self.run_script(tmp, [], FURNACE_CONTROLLER="envhost:7071")
            self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
            argv = pathlib.Path(tmp, "calls", "0").read_text().splitlines()
            self.assertEqual(dict(dc.parse_args(argv))["--controller"], "envhost:7071")

    def test_the_default_work_dir_is_private_and_not_guessable(self):
        """/tmp/furnace-$SLURM_JOB_ID was a name anyone on the node could create first (and own):
        each agent gets a new directory from mktemp -d instead, mode 0700."""
        with tempfile.TemporaryDirectory() as tmp:
            squatted = pathlib.Path(tmp, "furnace-42")
            squatted.mkdir()
            squatted.chmod(0o777)
            r = self.run_script(tmp, ["head:7070"], FURNACE_WORK_DIR=None, TMPDIR=tmp)
            self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
            dirs = set()
            for c in sorted(pathlib.Path(tmp, "calls").iterdir()):
                work = dict(dc.parse_args(c.read_text().splitlines()))["--work-dir"]
                self.assertTrue(work.startswith(f"{tmp}/furnace-42-{c.name}."), work)
                self.assertEqual(stat.S_IMODE(os.stat(work).st_mode), 0o700, work)
                dirs.add(work)
            self.assertEqual(len(dirs), 3)
            self.assertEqual(list(squatted.iterdir()), [])

    def test_a_work_dir_others_may_write_is_refused(self):
        with tempfile.TemporaryDirectory() as tmp:
            shared = pathlib.Path(tmp, "shared")
            (shared / "0").mkdir(parents=True)
            (shared / "0").chmod(0o777)
            r = self.run_script(tmp, ["head:7070"], FURNACE_WORK_DIR=str(shared))
            self.assertNotEqual(r.returncode, 0, r.stdout + r.stderr)
            self.assertIn(f"{shared}/0 is not a directory of this user that no one else may write",
                          r.stderr)
            self.assertIn("mode 777", r.stderr)
            self.assertFalse(pathlib.Path(tmp, "calls", "0").exists())  # no agent started there
            self.assertEqual(stat.S_IMODE(os.stat(shared / "1").st_mode), 0o700)

    def test_refusals_say_what_is_missing(self):
        with tempfile.TemporaryDirectory() as tmp:
            r = self.run_script(tmp, [])
            self.assertEqual(r.returncode, 2)
            self.assertIn("CONTROLLER_HOST:PORT", r.stderr)
            r = self.run_script(tmp, ["head:7070"], FURNACE_TLS_DIR=f"{tmp}/nowhere")
            self.assertEqual(r.returncode, 2)
            self.assertIn(f"{tmp}/nowhere/ca.pem", r.stderr)
            self.assertEqual(list(pathlib.Path(tmp, "calls").iterdir()), [])


class InstallTest(unittest.TestCase):
    """`cmake --install` (README "Deployment") puts what the units and the image run where they
    run it from: the installed programs start (their CUDA and NCCL libraries found), and the
    installed controller serves the dashboard from its default web root, with no --web-root."""

    def test_installed_controller_serves_the_dashboard(self):
        build = os.path.dirname(os.path.abspath(ARGS.bin))
        cmake = tool("cmake", "cmake")
        with tempfile.TemporaryDirectory(prefix="furnace-install-") as prefix:
            r = subprocess.run([cmake, "--install", build, "--prefix", prefix],
                               capture_output=True, text=True, timeout=120)
            self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
            for name in ("furnace", *dc.BINARIES):
                r = subprocess.run([os.path.join(prefix, "bin", name), "--help"],
                                   capture_output=True, text=True, timeout=60)
                self.assertEqual(r.returncode, 0, f"{name}: {r.stderr[-2000:]}")
            self.assertTrue(list(pathlib.Path(prefix, "lib").glob("*sentencepiece*")))
            state = os.path.join(prefix, "state")
            port, metrics = free_port(), free_port()
            log = open(os.path.join(prefix, "controller.out"), "wb")
            controller = subprocess.Popen(
                [os.path.join(prefix, "bin", "furnace-controller"), "--listen",
                 f"127.0.0.1:{port}", "--metrics-listen", f"127.0.0.1:{metrics}",
                 "--state-dir", state, "--local-workers", "0"],
                stdout=log, stderr=subprocess.STDOUT)
            try:
                pages = {}
                deadline = time.time() + 60
                while time.time() < deadline and len(pages) < 2:
                    for path in ("/", "/uPlot.iife.min.js"):
                        try:
                            with urllib.request.urlopen(f"http://127.0.0.1:{metrics}{path}",
                                                        timeout=5) as resp:
                                pages[path] = (resp.status, resp.read())
                        except (urllib.error.URLError, ConnectionError):
                            time.sleep(0.2)
                self.assertEqual(pages.get("/", (0,))[0], 200,
                                 pathlib.Path(prefix, "controller.out").read_text()[-3000:])
                self.assertIn(b"app.js", pages["/"][1])
                self.assertEqual(pages.get("/uPlot.iife.min.js", (0,))[0], 200)
            finally:
                controller.terminate()
                controller.wait(timeout=60)
                log.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--bin", required=True)
    parser.add_argument("--src", required=True)
    ARGS, rest = parser.parse_known_args()
    unittest.main(argv=[sys.argv[0], *rest])
