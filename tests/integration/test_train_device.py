"""resources.device through the control plane: two `furnace-worker --device-kind emulated` agents
register beside two CPU workers; a 2-rank train job (dp 2, ep 2) with resources.device: emulated is
placed on the emulated workers, its ranks train on emulated discrete devices (device memory the
host cannot read, asynchronous streams, collectives staged through the host), and every step's
loss and aux loss, and the exported parameters, equal the same job's on the CPU workers bit for
bit; so does a third with model.attention_probs: recomputed (each attention layer keeps two numbers
per query row and rebuilds its probabilities in backward), which reports a lower activation peak. A commcheck with resources.device: emulated runs its collectives (and its health check's) on
the emulated devices. A cuda job where no worker has a GPU is refused at submit, naming the device
kind."""
import json
import os
import subprocess
import urllib.request

import harness


def device_job(name, device, steps=8, attention_probs="stored"):
    return f"""name: {name}
kind: train
model: {{vocab: 64, seq_len: 32, d_model: 32, heads: 4, layers: 2, expert_ffn: 64,
        attention_probs: {attention_probs}}}
moe: {{experts: 4, top_k: 2, capacity_factor: 1.25, spikes: {{probability: 0.5, max_ratio: 2}}}}
parallel: {{dp: 2, ep: 2, micro_batch: 4, micro_batches: 2}}
train: {{steps: {steps}, lr: 3.0e-3, warmup: 2, seed: 11}}
data: {{source: markov, seed: 5}}
checkpoint: {{every: 4, keep: 2}}
resources: {{device: {device}}}
recovery:
  max_restarts: 0
"""


class TrainDeviceTest(harness.unittest.TestCase):
    def setUp(self):
        self.cluster = harness.Cluster(workers=2).start()  # two local CPU workers
        worker_bin = os.path.join(harness.BIN_DIR, "furnace-worker")
        self.workers, self.logs = [], []
        for slot in (0, 1):
            log = open(os.path.join(self.cluster.state, f"emulated-{slot}.log"), "ab")
            self.logs.append(log)
            self.workers.append(subprocess.Popen(
                [worker_bin, "--controller", self.cluster.addr, "--slot", str(slot),
                 "--id", f"emulated/{slot}", "--host", "127.0.0.1", "--device-kind", "emulated",
                 "--device-memory", str(256 << 20),
                 "--work-dir", os.path.join(self.cluster.state, "emulated", f"slot-{slot}")],
                stdout=log, stderr=subprocess.STDOUT))
        self.cluster.wait_workers(4)

    def tearDown(self):
        for w in self.workers:
            if w.poll() is None:
                w.terminate()
                try:
                    w.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    w.kill()
                    w.wait()
        for log in self.logs:
            log.close()
        leftover = self.cluster.close()
        self.assertEqual(leftover, [], "processes left behind after the controller stopped")

    def series(self, job):
        url = f"http://127.0.0.1:{self.cluster.metrics_port}/api/jobs/{job}/series"
        with urllib.request.urlopen(url) as resp:
            steps = json.loads(resp.read().decode()).get("steps", [])
        return [(int(s["step"]), s.get("loss"), s.get("auxLoss", s.get("aux_loss")))
                for s in steps]

    def max_peak(self, job):
        """The largest activation peak of any step on any rank (the stored steps)."""
        url = f"http://127.0.0.1:{self.cluster.metrics_port}/api/jobs/{job}/series?max=1000"
        with urllib.request.urlopen(url, timeout=5) as resp:
            steps = json.loads(resp.read().decode())["steps"]
        return max(int(s["activation_peak_bytes"]) for s in steps)

    def test_emulated_workers_train_as_cpu_workers(self):
        c = self.cluster
        kinds = {w["worker_id"]: w.get("device_kind") for w in c.cli_json("workers")["workers"]}
        self.assertEqual(kinds.get("emulated/0"), "emulated", kinds)
        self.assertEqual(kinds.get("emulated/1"), "emulated", kinds)

        cpu = c.submit(c.write_job("cpu.yaml", device_job("on-cpu", "cpu")))
        emu = c.submit(c.write_job("emulated.yaml", device_job("on-emulated", "emulated")))
        rec = c.submit(c.write_job("recomputed.yaml", device_job(
            "recomputed-probs", "emulated", attention_probs="recomputed")))
        for job in (cpu, emu, rec):
            d = c.wait_state(job, ("JOB_SUCCEEDED", "JOB_FAILED"), timeout=300)
            self.assertEqual(d["summary"]["state"], "JOB_SUCCEEDED", d["summary"])
        placed = {r.get("worker_id") for r in c.job(emu)["attempts"][0]["ranks"]}
        self.assertEqual(placed, {"emulated/0", "emulated/1"})

        logs = c.cli("logs", emu).stdout
        self.assertRegex(logs, r"device emulated:[01] \(emulated\): training on the emulated "
                               r"backend, precision fp32")
        self.assertIn("training on the cpu backend", c.cli("logs", cpu).stdout)

        want, got = self.series(cpu), self.series(emu)
        self.assertEqual([s for s, _, _ in want], list(range(1, 9)), want)
        self.assertTrue(all(loss is not None and aux is not None for _, loss, aux in want), want)
        self.assertEqual(got, want)  # every step's loss and aux loss, bit for bit (JSON doubles)
        self.assertEqual(self.series(rec), want)
        rec_logs = c.cli("logs", rec).stdout
        # 4 sequences x 32 positions x 4 heads: 2 floats per row against 32.
        self.assertIn("attention probabilities recomputed in backward (model.attention_probs "
                      "recomputed): each layer keeps 4096 bytes of row statistics per micro-batch "
                      "instead of 65536 bytes of probabilities", rec_logs)
        self.assertNotIn("attention probabilities recomputed", logs)
        self.assertLess(self.max_peak(rec), self.max_peak(emu))

        a = c.export(cpu, "cpu.safetensors")
        b = c.export(emu, "emulated.safetensors")
        r = c.export(rec, "recomputed.safetensors")
        self.assertEqual(sorted(a), sorted(b))
        self.assertEqual(sorted(a), sorted(r))
        for name in a:
            self.assertTrue(a[name] == b[name], f"{name} differs on the emulated device")
            self.assertTrue(a[name] == r[name], f"{name} differs with the probabilities recomputed")

    def test_a_commcheck_runs_on_the_emulated_devices(self):
        # A commcheck takes a device too: its collectives (and its health check's) run on the
        # ranks' device memory through the stream-ordered communicators, as NCCL runs on GPUs.
        c = self.cluster
        job = c.submit(c.write_job("commcheck.yaml", """name: device-commcheck
kind: commcheck
parallel: {dp: 2}
resources: {device: emulated}
recovery: {health_check_s: 20, max_restarts: 0}
commcheck: {min_bytes: 4KiB, max_bytes: 256KiB, step_factor: 8, iters: 2, warmup_iters: 1,
            rounds: 1, timeout_s: 20}
"""))
        d = c.wait_state(job, ("JOB_SUCCEEDED", "JOB_FAILED"), timeout=120)
        self.assertEqual(d["summary"]["state"], "JOB_SUCCEEDED", d["summary"])
        placed = {r.get("worker_id") for r in d["attempts"][0]["ranks"]}
        self.assertEqual(placed, {"emulated/0", "emulated/1"})
        comm = d["comm"]
        # 4 collectives x sizes 4 KiB, 32 KiB, 256 KiB, each verified by value.
        self.assertEqual(len(comm), 12, comm)
        self.assertTrue(all(r["verified"] and int(r.get("errors", 0)) == 0 for r in comm), comm)
        self.assertTrue(all(r["world_size"] == 2 and r["busbw_gbps"] > 0 for r in comm), comm)
        logs = c.cli("logs", job).stdout
        self.assertRegex(logs, r"commcheck: 1 round\(s\) on emulated:[01]")
        self.assertRegex(logs, r"health check passed: 2 ranks arrived, commcheck collectives "
                               r"verified on emulated:[01]")

    def test_a_cuda_job_without_gpu_workers_is_refused_at_submit(self):
        c = self.cluster
        r = c.cli("submit", c.write_job("cuda.yaml", device_job("on-cuda", "cuda")))
        self.assertNotEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertIn("resources.device: no cuda worker has registered", r.stderr)
        self.assertIn("furnace-worker --device-kind cuda", r.stderr)
        # A commcheck on GPUs is placed the same way.
        r = c.cli("submit", c.write_job("cuda-commcheck.yaml",
                                        "name: cc\nkind: commcheck\nparallel: {dp: 2}\n"
                                        "resources: {device: cuda}\n"))
        self.assertNotEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertIn("no cuda worker has registered", r.stderr)


if __name__ == "__main__":
    harness.main()
