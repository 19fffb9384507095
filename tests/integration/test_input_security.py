"""Job inputs confined to the daemons' roots, the submission rate limit and the audit log, on a
real controller with local workers (issue 14, item 2; the CLI's job-file checks of item 5)."""
import json
import os
import shutil
import tempfile

import harness


def train_job(name, data="data: {source: markov, seed: 5}", checkpoint="", steps=4):
    return f"""name: {name}
kind: train
model: {{vocab: 64, seq_len: 32, d_model: 32, heads: 2, layers: 2, expert_ffn: 64}}
moe: {{experts: 4, top_k: 2}}
parallel: {{micro_batch: 4, micro_batches: 1}}
train: {{steps: {steps}, lr: 3.0e-3, warmup: 1, seed: 11}}
{data}
{checkpoint}
recovery:
  max_restarts: 2
  backoff: {{initial_s: 0.2, max_s: 1.0, multiplier: 2.0}}
"""


class RootsTest(harness.ClusterTest):
    """--data-root and --checkpoint-root on the controller (and, through the embedded launcher,
    on its workers)."""
    WORKERS = 1

    def setUp(self):
        self.base = tempfile.mkdtemp(prefix="furnace-roots-")
        self.data = os.path.realpath(os.path.join(self.base, "data"))
        self.ckpt = os.path.realpath(os.path.join(self.base, "ckpt"))
        self.outside = os.path.realpath(os.path.join(self.base, "outside"))
        for d in (self.data, self.ckpt, self.outside):
            os.makedirs(d)
        self.cluster = harness.Cluster(
            workers=self.WORKERS,
            extra_args=["--data-root", self.data, "--checkpoint-root", self.ckpt]).start()

    def tearDown(self):
        try:
            super().tearDown()
        finally:
            shutil.rmtree(self.base, ignore_errors=True)

    def refused(self, text, *needles):
        c = self.cluster
        path = c.write_job("escape.yaml", text)
        r = c.cli("submit", path)
        self.assertEqual(r.returncode, 2, r.stdout + r.stderr)
        for n in needles:
            self.assertIn(n, r.stderr)
        return r.stderr

    def test_escapes_are_refused_at_submit_naming_field_and_root(self):
        c = self.cluster
        self.refused(train_job("dots", checkpoint="checkpoint: {dir: ../outside/run}"),
                     "checkpoint.dir: ../outside/run is outside --checkpoint-root " + self.ckpt,
                     "allowed: paths under " + self.ckpt)
        self.refused(train_job("abs", data="data: {source: tokens, path: /etc/passwd}"),
                     "data.path: /etc/passwd is outside --data-root " + self.data)
        os.symlink(self.outside, os.path.join(self.data, "link"))
        self.refused(train_job("sym", data="data: {source: tokens, path: link/x.tok}"),
                     "data.path: link/x.tok is outside --data-root", "a symlink")
        self.assertEqual(c.cli_json("jobs").get("jobs", []), [])

        # A relative checkpoint.dir lands under the root: the spec the workers get says so.
        job = c.submit(c.write_job("ok.yaml", train_job("ok", checkpoint="checkpoint: {dir: run1}")))
        d = c.wait_state(job, ("JOB_SUCCEEDED", "JOB_FAILED"), timeout=180)
        self.assertEqual(d["summary"]["state"], "JOB_SUCCEEDED", d["summary"])
        self.assertEqual(d["spec"]["checkpoint"]["dir"], os.path.join(self.ckpt, "run1"))
        self.assertTrue(os.path.isdir(os.path.join(self.ckpt, "run1")))

        # The audit log has every call, refused and accepted, with who made it.
        events = c.cli_json("events")["events"]
        self.assertEqual([e["action"] for e in events], ["submit"] * 4)
        self.assertEqual([e["accepted"] for e in events], [False, False, False, True])
        self.assertEqual(events[0]["code"], "INVALID_ARGUMENT")
        self.assertIn("checkpoint.dir", events[0]["detail"])
        self.assertEqual(events[3]["job_id"], job)
        self.assertTrue(events[3]["identity"])
        text = c.cli("events", "--job", job)
        self.assertEqual(text.returncode, 0, text.stderr)
        self.assertIn("accepted", text.stdout)
        self.assertEqual(len(text.stdout.strip().splitlines()), 2, text.stdout)  # header + 1

    def test_a_symlink_planted_after_submit_is_caught_by_the_worker(self):
        """The controller accepted the path (nothing was there yet); by the time the rank opens
        it, it is a symlink out of the root: the rank refuses it (bad input, not retried)."""
        c = self.cluster
        # Holds the only worker, so the train job waits (pending) while the link is planted.
        blocker = c.submit(c.write_job("block.yaml", train_job("block", steps=1000000)))
        c.wait_state(blocker, "JOB_RUNNING", timeout=120)
        with open(os.path.join(self.outside, "secret.tok"), "wb") as f:
            f.write(b"not yours")
        job = c.submit(c.write_job("later.yaml", train_job(
            "later", data="data: {source: tokens, path: corpus/train.tok}")))
        os.symlink(self.outside, os.path.join(self.data, "corpus"))
        self.assertEqual(c.cli("cancel", blocker).returncode, 0)
        d = c.wait_state(job, ("JOB_SUCCEEDED", "JOB_FAILED"), timeout=180)
        self.assertEqual(d["summary"]["state"], "JOB_FAILED", d["summary"])
        self.assertEqual(int(d["summary"].get("restarts", 0)), 0)
        self.assertIn("not retried", d["summary"]["cause"])
        logs = c.cli("logs", job).stdout
        self.assertIn("data.path: " + os.path.join(self.data, "corpus/train.tok") +
                      " is outside --data-root " + self.data, logs)
        # Without checkpoint.dir, the job's default directory is under the root too, in jobs/,
        # which no job may name (it would fill a later job's directory ahead of it), as the root
        # itself.
        self.assertEqual(d["spec"]["checkpoint"]["dir"], os.path.join(self.ckpt, "jobs", job))
        for bad, why in ((f"jobs/later-{int(job.rsplit('-', 1)[1]) + 5}",
                          "where the controller puts the checkpoints of jobs that name none"),
                         (".", "is --checkpoint-root itself")):
            r = c.cli("submit", c.write_job("squat.yaml", train_job(
                "squat", checkpoint=f"checkpoint: {{dir: {bad}}}")))
            self.assertNotEqual(r.returncode, 0, r.stdout)
            self.assertIn(why, r.stdout + r.stderr)
        # The cancel is in the audit log too.
        events = c.cli_json("events", "--job", blocker)["events"]
        self.assertEqual([e["action"] for e in events], ["submit", "cancel"])


class LimitsTest(harness.ClusterTest):
    WORKERS = 1

    def setUp(self):
        self.cluster = harness.Cluster(
            workers=self.WORKERS,
            extra_args=["--submit-burst", "2", "--submit-rate", "0.01"]).start()

    def test_rate_limit_checks_and_audit_log_survive_a_restart(self):
        c = self.cluster
        path = c.write_job("cc.yaml", harness.commcheck_job("cc", ranks=1))
        for _ in range(2):
            self.assertEqual(c.cli("submit", path).returncode, 0)
        r = c.cli("submit", path)
        self.assertEqual(r.returncode, 3, r.stdout + r.stderr)
        self.assertIn("submission rate limit", r.stderr)
        self.assertIn("2 at once, then 0.01 per second", r.stderr)
        self.assertIn("retry in", r.stderr)

        # Not UTF-8, or too big: refused by the CLI before sending (exit 2, file and offset), so
        # the controller never sees them and the audit log does not either.
        bad = os.path.join(c.state, "bad.yaml")
        with open(bad, "wb") as f:
            f.write(b"name: bad\nkind: \xff\n")
        r = c.cli("submit", bad)
        self.assertEqual(r.returncode, 2, r.stdout + r.stderr)
        self.assertIn(bad + ": byte 16 (0xff): not valid UTF-8", r.stderr)
        huge = os.path.join(c.state, "huge.yaml")
        with open(huge, "w") as f:
            f.write("#" * (1 << 20) + "\nname: huge\nkind: commcheck\n")
        r = c.cli("submit", huge)
        self.assertEqual(r.returncode, 2, r.stdout + r.stderr)
        self.assertIn(huge + ": the job file is", r.stderr)
        self.assertIn("the limit is 1048576 bytes", r.stderr)

        before = c.cli_json("events")["events"]
        self.assertEqual([e["accepted"] for e in before], [True, True, False])
        self.assertEqual(before[2]["code"], "RESOURCE_EXHAUSTED")

        c.controller.terminate()
        c.controller.wait(timeout=30)
        c.start(wait_workers=False)
        after = c.cli_json("events")["events"]
        self.assertEqual(after, before)
        r = c.cli("events", "--limit", "1")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("refused (RESOURCE_EXHAUSTED)", r.stdout)


if __name__ == "__main__":
    harness.main()
