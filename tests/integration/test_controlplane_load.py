"""The control plane under load, bounded: 1,024 simulated worker agents
(bench/controlplane: furnace_bench_controlplane) against a real furnace-controller on loopback,
with mutual TLS, a token file and a join token as a cluster runs it (`furnace certs init`).

They register, open their command streams and beat once a second; a 1,016-rank train job is
placed on them, every rank passes the health-check rendezvous (KvSet of its own key, KvGet of
every rank's), steps report telemetry, 8 idle agents go silent, and the job is cancelled. Only
correctness is asserted (every agent registered, no RPC failed, every rank started, arrived and
stopped, steps aggregated, exactly the silent agents lost); times and CPU are the benchmark's
business (bench/controlplane/REPORT.md), never asserted here."""
import json
import os
import shutil
import subprocess
import tempfile
import time
import unittest

import harness

AGENTS = 1024
SILENT = 8
WORKER_TIMEOUT_S = 5


class ControlPlaneLoadTest(unittest.TestCase):
    def test_1024_agents_register_run_a_job_and_silent_ones_are_lost(self):
        state = tempfile.mkdtemp(prefix="furnace-it-load-")
        port = harness.free_port()
        addr = f"127.0.0.1:{port}"
        tls = os.path.join(state, "tls")
        subprocess.run([os.path.join(harness.BIN_DIR, "furnace"), "certs", "init", tls],
                       check=True, capture_output=True, timeout=60)
        log = open(os.path.join(state, "controller.out"), "ab")
        controller = subprocess.Popen(
            [os.path.join(harness.BIN_DIR, "furnace-controller"), "--listen", addr,
             "--state-dir", os.path.join(state, "state"), "--worker-timeout",
             str(WORKER_TIMEOUT_S), "--metrics-listen", "",
             "--tls-cert", f"{tls}/controller.pem", "--tls-key", f"{tls}/controller.key",
             "--tls-ca", f"{tls}/ca.pem", "--token-file", f"{tls}/tokens",
             "--join-token-file", f"{tls}/join.token"],
            stdout=log, stderr=subprocess.STDOUT)
        try:
            deadline = time.time() + 60
            while time.time() < deadline:  # it binds after loading its job store
                up = subprocess.run([os.path.join(harness.BIN_DIR, "furnace"), "--controller",
                                     addr, "--tls-ca", f"{tls}/ca.pem", "--token-file",
                                     f"{tls}/read.token", "jobs"],
                                    capture_output=True, timeout=30)
                if up.returncode == 0:
                    break
                time.sleep(0.2)
            gen = subprocess.run(
                [os.path.join(harness.BIN_DIR, "furnace_bench_controlplane"),
                 "--controller", addr, "--controller-pid", str(controller.pid),
                 "--agents", str(AGENTS), "--silent", str(SILENT), "--window-s", "5",
                 "--warmup-steps", "1", "--step-s", "1", "--worker-timeout",
                 str(WORKER_TIMEOUT_S), "--start-timeout", "240",
                 "--tls-ca", f"{tls}/ca.pem", "--tls-cert", f"{tls}/worker.pem",
                 "--tls-key", f"{tls}/worker.key", "--join-token-file", f"{tls}/join.token",
                 "--token-file", f"{tls}/admin.token"],
                capture_output=True, text=True, timeout=500)
            self.assertIn("{", gen.stdout, gen.stderr)
            report = json.loads(gen.stdout)
            with open(os.path.join(state, "controller.out"), errors="replace") as f:
                tail = f.read()[-3000:]
            detail = f"problems: {report['problems']}\nstderr: {gen.stderr}\ncontroller: {tail}"
            self.assertEqual(report["problems"], [], detail)
            self.assertEqual(gen.returncode, 0, detail)
            self.assertEqual(report["registered"], AGENTS)
            self.assertEqual(report["ranks_started"], AGENTS - SILENT)
            self.assertEqual(report["ranks_stopped"], AGENTS - SILENT)
            self.assertGreater(report["steps_aggregated"], 0)
            self.assertEqual(report["loss"]["declared_lost"], SILENT)
            self.assertEqual(report["loss"]["others_declared_lost"], 0)
            self.assertEqual(report["reregister_asks"], 0)
            self.assertTrue(report["tls"])
            self.assertTrue(report["tokens"])
            self.assertIsNone(controller.poll(), "the controller died under load\n" + tail)
        finally:
            controller.terminate()
            try:
                controller.wait(timeout=30)
            except subprocess.TimeoutExpired:
                controller.kill()
                controller.wait()
            log.close()
            shutil.rmtree(state, ignore_errors=True)


if __name__ == "__main__":
    harness.parse_args()
    unittest.main()
