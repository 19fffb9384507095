"""Checkpoints through the whole stack. A damaged newest checkpoint (a flipped byte in a shard, a
truncated shard, a deleted manifest) sends the next job on the directory back to the previous
one, and its `checkpoint_restored` event says which step was passed over and why; a missing
LATEST is said too (the newest checkpoint whose manifest and checksums verify is then used). A
checkpoint written by one rank continues under dp 2 x ep 2 (the global batch kept: micro_batches
2 -> 1 per replica), the event naming the layout that wrote it, and ends at the loss the
single-rank continuation reaches. An asynchronous checkpoint that cannot be written is an event
and a metric, and training goes on. A run resubmitted on a checkpoint with other optimizer
settings (a cosine over more steps) is refused, naming the change, unless it says
checkpoint.override_settings; then the resume account says what it overrode."""
import os
import shutil
import urllib.request

import harness


def job(name, ckpt, steps, parallel="micro_batches: 2", schedule="constant", checkpoint=""):
    """A constant learning rate by default: a run continued to more steps keeps its update rule
    (under a cosine, train.steps is its horizon, and a resume that changes it is refused)."""
    return f"""name: {name}
kind: train
model: {{vocab: 64, seq_len: 32, d_model: 32, heads: 4, layers: 2, expert_ffn: 64}}
moe: {{experts: 4, top_k: 2}}
parallel: {{micro_batch: 4, {parallel}}}
train: {{steps: {steps}, lr: 3.0e-3, warmup: 5, seed: 11, schedule: {schedule}}}
data: {{source: markov, seed: 5}}
checkpoint: {{dir: {ckpt}, every: 10, keep: 5{checkpoint}}}
recovery: {{max_restarts: 0}}
"""


def flip_a_byte(path):
    with open(path, "r+b") as f:
        f.seek(os.path.getsize(path) // 2)
        b = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([b[0] ^ 0x20]))


def truncate(path):
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) - 100)


class CheckpointRecoveryTest(harness.ClusterTest):
    WORKERS = 4

    def run_to_end(self, name, text):
        """Submits job file `name`.yaml holding `text` and waits for its end: (job id, details)."""
        c = self.cluster
        j = c.submit(c.write_job(f"{name}.yaml", text))
        return j, c.wait_state(j, ("JOB_SUCCEEDED", "JOB_FAILED"), timeout=240)

    def test_damaged_checkpoints_fall_back_and_other_layouts_continue(self):
        c = self.cluster
        src = os.path.join(c.state, "ckpt-src")
        _, d = self.run_to_end("src", job("source", src, 30))
        self.assertEqual(d["summary"]["state"], "JOB_SUCCEEDED", d["summary"])
        self.assertTrue(os.path.exists(os.path.join(src, "step-00000030", "manifest.json")))

        shard = os.path.join("step-00000030", "shard-00000.bin")
        damage = {
            "flip": (lambda d: flip_a_byte(os.path.join(d, shard)), 20, "checksum mismatch"),
            "truncate": (lambda d: truncate(os.path.join(d, shard)), 20, "truncated"),
            "manifest": (lambda d: os.remove(os.path.join(d, "step-00000030", "manifest.json")),
                         20, "LATEST names step 30, which is not committed"),
            "latest": (lambda d: os.remove(os.path.join(d, "LATEST")), 30, "LATEST is missing"),
        }
        jobs = {}
        for kind, (hurt, _, _) in damage.items():
            dir_ = os.path.join(c.state, f"ckpt-{kind}")
            shutil.copytree(src, dir_)
            hurt(dir_)
            jobs[kind] = c.submit(c.write_job(f"{kind}.yaml", job(kind, dir_, 40)))
        resharded_dir = os.path.join(c.state, "ckpt-reshard")
        shutil.copytree(src, resharded_dir)
        resharded = c.submit(c.write_job("reshard.yaml", job(
            "reshard", resharded_dir, 40, parallel="dp: 2, ep: 2, micro_batches: 1")))

        for kind, (_, step, why) in damage.items():
            d = c.wait_state(jobs[kind], ("JOB_SUCCEEDED", "JOB_FAILED"), timeout=300)
            self.assertEqual(d["summary"]["state"], "JOB_SUCCEEDED", (kind, d["summary"]))
            restored = [e["message"] for e in d["events"] if e["kind"] == "checkpoint_restored"]
            self.assertEqual(len(restored), 1, (kind, d["events"]))
            print(f"\nREPORT {kind}: {restored[0]}")
            self.assertIn(f"resumed from the checkpoint of step {step} ", restored[0])
            self.assertIn(why, restored[0])

        d = c.wait_state(resharded, ("JOB_SUCCEEDED", "JOB_FAILED"), timeout=300)
        self.assertEqual(d["summary"]["state"], "JOB_SUCCEEDED", d["summary"])
        restored = [e["message"] for e in d["events"] if e["kind"] == "checkpoint_restored"]
        self.assertEqual(len(restored), 1, d["events"])
        print(f"\nREPORT reshard: {restored[0]}")
        self.assertIn("resumed from the checkpoint of step 30 ", restored[0])
        self.assertIn("written by 1 rank(s)", restored[0])
        # The same 10 steps from the same checkpoint on one rank ("latest": its step 30 is whole)
        # and on dp 2 x ep 2 end at the same loss, up to the layouts' summation order.
        single = c.job(jobs["latest"])["telemetry"]["loss"]
        parallel = d["telemetry"]["loss"]
        print(f"REPORT loss at step 40: one rank {single}, dp 2 x ep 2 {parallel}")
        self.assertAlmostEqual(parallel, single, delta=1e-4 * abs(single))


    def test_an_unwritable_async_checkpoint_is_an_event_and_a_metric(self):
        """A file stands where step 20's directory would go: its background write fails, the job
        trains on, the event and furnace_checkpoint_failures_total say so, and the checkpoints
        before and after it are committed."""
        c = self.cluster
        ckpt = os.path.join(c.state, "ckpt-full")
        os.makedirs(ckpt)
        with open(os.path.join(ckpt, "step-00000020"), "w") as f:
            f.write("in the way")
        text = job("unwritable", ckpt, 40, checkpoint=", async: true")
        j, d = self.run_to_end("unwritable", text)
        self.assertEqual(d["summary"]["state"], "JOB_SUCCEEDED", d["summary"])
        failed = [e["message"] for e in d["events"] if e["kind"] == "checkpoint_failed"]
        print(f"\nREPORT unwritable: {failed}")
        self.assertEqual(len(failed), 1, d["events"])
        self.assertIn("step 20", failed[0])
        with urllib.request.urlopen(f"http://127.0.0.1:{c.metrics_port}/metrics", timeout=5) as r:
            metrics = r.read().decode()
        self.assertIn(f'furnace_checkpoint_failures_total{{job="{j}"}} 1', metrics)
        for step in (10, 30, 40):
            self.assertTrue(os.path.exists(os.path.join(ckpt, f"step-{step:08d}", "manifest.json")),
                            step)

    def test_a_resume_under_other_optimizer_settings_is_refused_unless_overridden(self):
        c = self.cluster
        ckpt = os.path.join(c.state, "ckpt-cosine")
        _, d = self.run_to_end("cosine", job("cosine", ckpt, 20, schedule="cosine"))
        self.assertEqual(d["summary"]["state"], "JOB_SUCCEEDED", d["summary"])

        _, d = self.run_to_end("longer", job("longer", ckpt, 30, schedule="cosine"))
        print(f"\nREPORT refused: {d['summary'].get('cause')}")
        self.assertEqual(d["summary"]["state"], "JOB_FAILED", d["summary"])
        self.assertIn("train.steps 20 -> 30", d["summary"]["cause"])
        self.assertIn("checkpoint.override_settings", d["summary"]["cause"])
        self.assertIn("not retried", d["summary"]["cause"])
        self.assertEqual(d["summary"]["restarts"], 0)

        _, d = self.run_to_end("overridden", job(
            "overridden", ckpt, 30, schedule="cosine", checkpoint=", override_settings: true"))
        self.assertEqual(d["summary"]["state"], "JOB_SUCCEEDED", d["summary"])
        restored = [e["message"] for e in d["events"] if e["kind"] == "checkpoint_restored"]
        print(f"REPORT overridden: {restored}")
        self.assertEqual(len(restored), 1, d["events"])
        self.assertIn("resumed from the checkpoint of step 20 ", restored[0])
        self.assertIn("settings overridden: train.steps 20 -> 30", restored[0])

    def test_a_diverging_run_never_checkpoints_nan_and_ends_failed(self):
        """A learning rate of 1e38 makes the loss non-finite within a few steps: that step is not
        applied, each attempt restarts from the last checkpoint and meets it again, and the job
        ends FAILED for want of progress, its cause naming the step and the values; every
        committed checkpoint is from before it."""
        c = self.cluster
        ckpt = os.path.join(c.state, "ckpt-diverging")
        text = job("diverging", ckpt, 40).replace("lr: 3.0e-3", "lr: 1.0e+38").replace(
            "every: 10", "every: 1").replace(
            "recovery: {max_restarts: 0}",
            "recovery: {max_restarts: 5, max_attempts_without_progress: 2, "
            "backoff: {initial_s: 0.1}}")
        _, d = self.run_to_end("diverging", text)
        cause = d["summary"].get("cause", "")
        print(f"\nREPORT diverging: restarts {d['summary']['restarts']}: {cause}")
        self.assertEqual(d["summary"]["state"], "JOB_FAILED", d["summary"])
        self.assertIn("the update was not applied", cause)
        self.assertIn("train.lr", cause)
        self.assertGreaterEqual(d["summary"]["restarts"], 1)
        # The newest checkpoint is of the last step applied; the next one failed.
        steps = sorted(int(n[5:]) for n in os.listdir(ckpt) if n.startswith("step-"))
        self.assertTrue(steps, os.listdir(ckpt))
        self.assertIn(f"step {steps[-1] + 1}: the loss is ", cause)
        self.assertIn(f"still those of step {steps[-1]})", cause)


if __name__ == "__main__":
    harness.main()
