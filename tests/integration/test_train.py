"""The `train` job kind through the control plane: a run that learns, a rank SIGKILLed mid-run
that resumes from its checkpoint and ends with exactly the parameters of an uninterrupted run,
and bad input refused before training starts."""
import os
import random
import signal
import struct
import subprocess
import sys
import time

import harness


def train_job(name, steps=120, every=20, extra="", async_checkpoints=False):
    return f"""name: {name}
kind: train
model: {{vocab: 64, seq_len: 64, d_model: 64, heads: 4, layers: 4, expert_ffn: 128}}
moe: {{experts: 8, top_k: 2}}
parallel: {{micro_batch: 8, micro_batches: 2}}
train: {{steps: {steps}, lr: 3.0e-3, warmup: 10, seed: 11}}
data: {{source: markov, seed: 5}}
checkpoint: {{every: {every}, keep: 2, async: {str(async_checkpoints).lower()}}}
recovery:
  max_restarts: 2
  backoff: {{initial_s: 0.2, max_s: 1.0, multiplier: 2.0}}
{extra}"""


def write_token_file(path, tokens, vocab):
    """A Furnace token file (runtime/data/token_file.h): magic, version 1, 2-byte tokens."""
    with open(path, "wb") as f:
        f.write(b"FURNTOK1" + struct.pack("<IIQI", 1, 2, len(tokens), vocab))
        f.write(struct.pack(f"<{len(tokens)}H", *tokens))


def numpy_python():
    """An interpreter that imports numpy (the indexed-dataset writer needs it)."""
    for exe in (sys.executable, "/usr/bin/python3"):
        if subprocess.run([exe, "-c", "import numpy"], capture_output=True).returncode == 0:
            return exe
    raise RuntimeError("no python3 with numpy (apt-get install python3-numpy)")


def write_indexed(prefix, seed, documents):
    """A Megatron indexed dataset written by the independent writer in tests/reference."""
    writer = os.path.join(harness.SRC_DIR, "tests", "reference", "megatron_indexed.py")
    subprocess.run([numpy_python(), writer, "--prefix", prefix, "--seed", str(seed),
                    "--documents", str(documents), "--vocab", "64", "--max-sequence", "60",
                    "--sequences-per-document", "2"], check=True)


class TrainTest(harness.ClusterTest):
    WORKERS = 2

    def sigkill_resume_bit_exact(self, data=None, steps=120, every=20, kill_at=30,
                                 async_checkpoints=False):
        """Two identical runs side by side, one of them SIGKILLed once past step `kill_at`: the
        victim resumes from its newest committed checkpoint and ends with exactly the reference's
        parameters. Returns (reference job details, reference export, victim job id)."""
        c = self.cluster

        def spec(name, **kw):
            text = train_job(name, steps=steps, every=every, **kw)
            return text if data is None else text.replace("data: {source: markov, seed: 5}", data)

        ref = c.submit(c.write_job("ref.yaml", spec("reference")))
        victim = c.submit(c.write_job("victim.yaml", spec("victim",
                                                          async_checkpoints=async_checkpoints)))
        d = c.wait_for(victim, lambda d: d["summary"]["state"] == "JOB_RUNNING" and
                       int(d["summary"].get("step", 0)) >= kill_at, timeout=120,
                       what="victim past its first committed checkpoint")
        os.kill(int(d["attempts"][0]["ranks"][0]["pid"]), signal.SIGKILL)
        d = c.wait_state(victim, ("JOB_SUCCEEDED", "JOB_FAILED"), timeout=300)
        self.assertEqual(d["summary"]["state"], "JOB_SUCCEEDED", d["summary"])
        self.assertEqual(int(d["summary"]["restarts"]), 1)
        self.assertIn("signal 9", d["attempts"][0]["cause"])
        logs = c.cli("logs", victim, "--attempt", "2").stdout
        self.assertIn("resumed from the checkpoint of step", logs)
        r = c.wait_state(ref, "JOB_SUCCEEDED", timeout=300)
        self.assertEqual(int(r["summary"]["restarts"]), 0)
        a = c.export(ref, "ref.safetensors")
        b = c.export(victim, "victim.safetensors")
        self.assertEqual(sorted(a), sorted(b))
        for name in a:
            self.assertEqual(a[name][:2], b[name][:2], name)
            self.assertTrue(a[name][2] == b[name][2], f"{name} differs after the resume")
        return r, a, victim

    def test_sigkill_resumes_from_checkpoint_bit_exact(self):
        r, a, _ = self.sigkill_resume_bit_exact()
        self.assertIn("layers.3.moe.experts.7.w2", a)
        self.assertEqual(a["wte"][1], (64, 64))
        # The run learned: the last reported loss is near the Markov chain's entropy floor.
        m = r["telemetry"]
        self.assertLess(m["loss"], 1.25 * m["entropy_floor"], m)

    def test_sigkill_resumes_from_an_async_checkpoint_bit_exact(self):
        """checkpoint.async through the whole stack: shards written in the background, a rank
        SIGKILLed after the first commit, the run resumed from the newest committed checkpoint."""
        # The snapshot of step 20 is committed when the one of step 40 starts.
        _, _, victim = self.sigkill_resume_bit_exact(kill_at=50, async_checkpoints=True)
        self.assertNotIn("not committed", self.cluster.cli("logs", victim).stdout)

    def test_sigkill_resumes_bit_exact_on_token_data(self):
        """Shuffled epochs of a token file with a held-out split, killed mid-epoch."""
        path = os.path.join(self.cluster.state, "walk.tokens")
        rng = random.Random(4)
        write_token_file(path, [rng.randrange(64) for _ in range(64 * 90 + 1)], 64)
        # 90 windows, 9 held out and 1 dropped: 80 per epoch, 16 per step.
        _, _, victim = self.sigkill_resume_bit_exact(
            f"data: {{source: tokens, path: {path}, validation: {{fraction: 0.1}}}}\n"
            "eval: {every: 60, batches: 1}",
            steps=60, every=10, kill_at=15)
        logs = self.cluster.cli("logs", victim, "--attempt", "1").stdout
        self.assertIn("80 training sequences of 65 tokens per epoch", logs)
        # Resumed mid-run: the log says where in which epoch the data continues.
        resumed = self.cluster.cli("logs", victim, "--attempt", "2").stdout
        self.assertRegex(resumed, r"data at epoch [0-9]+, sequence [0-9]+ of 80")

    def test_sigkill_resumes_bit_exact_on_an_indexed_blend(self):
        """A blend of two Megatron indexed datasets written by the independent writer."""
        a = os.path.join(self.cluster.state, "a")
        b = os.path.join(self.cluster.state, "b")
        write_indexed(a, 1, 60)
        write_indexed(b, 2, 40)
        _, _, victim = self.sigkill_resume_bit_exact(
            f"data: {{source: indexed, blend: [{{path: {a}, weight: 0.7}}, "
            f"{{path: {b}, weight: 0.3}}]}}", steps=60, every=10, kill_at=15)
        logs = self.cluster.cli("logs", victim, "--attempt", "1").stdout
        self.assertIn(f"indexed data {a} (", logs)
        self.assertRegex(logs, rf"training sequences of 65 tokens per epoch: {a} [0-9]+, {b} [0-9]+")
        # Resumed mid-run: each dataset of the blend has its own epochs, and the log says both.
        resumed = self.cluster.cli("logs", victim, "--attempt", "2").stdout
        self.assertRegex(resumed, rf"data at {a} epoch [0-9]+ sequence [0-9]+ of [0-9]+, "
                                  rf"{b} epoch [0-9]+ sequence [0-9]+ of [0-9]+")

    def bad_data_fails_at_once(self, data, named, parallel=None):
        """A job on bad data ends FAILED at once (not retried), its log naming `named`."""
        c = self.cluster
        spec = train_job("badfile").replace("data: {source: markov, seed: 5}", data)
        if parallel is not None:
            spec = spec.replace("parallel: {micro_batch: 8, micro_batches: 2}", parallel)
        r = c.cli("submit", c.write_job("bad.yaml", spec), "--watch", timeout=120)
        self.assertEqual(r.returncode, 1, r.stdout + r.stderr)
        job = c.cli_json("jobs")["jobs"][0]["job_id"]
        d = c.job(job)
        self.assertEqual(d["summary"]["state"], "JOB_FAILED")
        self.assertEqual(int(d["summary"].get("restarts", 0)), 0)  # retrying cannot help
        self.assertIn("not retried", d["summary"]["cause"])
        logs = c.cli("logs", job).stdout
        self.assertIn(named, logs)
        return logs

    def test_bad_token_file_fails_at_once_with_the_reason(self):
        bad = os.path.join(self.cluster.state, "bad.tokens")
        with open(bad, "wb") as f:
            f.write(b"NOTTOKEN" + bytes(64))
        self.bad_data_fails_at_once(f"data: {{source: tokens, path: {bad}}}", bad)

    def test_a_bad_token_met_in_training_fails_at_once_naming_it(self):
        """Tokens are checked as they are read, not at start-up: a token file with one token past
        its header's vocab trains until the batch that reads it, then fails as corrupt data (not
        retried), naming the token's place and value and the step. Two data-parallel ranks: only
        the one whose batch holds the token meets it, and its cause is the job's, not its peer's
        broken collective."""
        path = os.path.join(self.cluster.state, "damaged.tokens")
        rng = random.Random(6)
        tokens = [rng.randrange(64) for _ in range(64 * 90 + 1)]
        # Window 45 holds it; not one of the tokens the fingerprint reads at start-up (every 5th).
        tokens[2891] = 70
        write_token_file(path, tokens, 64)
        data = f"data: {{source: tokens, path: {path}}}"
        logs = self.bad_data_fails_at_once(
            data, f"token file {path}: token 2891 (byte offset 5810) has value 70, not below the "
            "vocab 64", parallel="parallel: {dp: 2, micro_batch: 4, micro_batches: 2}")
        job = self.cluster.cli_json("jobs")["jobs"][0]["job_id"]
        self.assertIn("data file corrupt", self.cluster.job(job)["summary"]["cause"])
        self.assertRegex(logs, r"window 45 of 65 tokens, read for step [0-9]+, micro-batch")
        self.assertRegex(logs, r"step [0-9]+/120")  # it trained before it met the token

    def test_bad_indexed_dataset_fails_at_once_naming_the_file(self):
        prefix = os.path.join(self.cluster.state, "corpus")
        write_indexed(prefix, 3, 20)
        with open(prefix + ".idx", "r+b") as f:
            f.write(b"TNTIDX")
        logs = self.bad_data_fails_at_once(f"data: {{source: indexed, path: {prefix}}}",
                                           prefix + ".idx: bad magic")
        self.assertIn("not read", logs)

    def test_token_file_of_another_tokenizer_fails_at_once_naming_both(self):
        """data.tokenizer: a token file made by another tokenizer is refused by the rank (naming
        the file and both tokenizers) and not retried; the matching tokenizer trains."""
        c = self.cluster
        corpus = os.path.join(c.state, "corpus.txt")
        with open(corpus, "w", encoding="utf-8") as f:
            for i in range(300):
                f.write(f"line {i % 17}: the experts route tokens, naïve café über {i}\n")
        model = os.path.join(c.state, "tok.model")
        tokens = os.path.join(c.state, "byte.tok")
        r = c.cli("data", "tokenizer", "train", "--input", corpus, "--vocab", "300", "-o", model)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        r = c.cli("data", "prepare", "--eod", "--input", corpus, "-o", tokens)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)

        def job(name, tokenizer):
            return train_job(name, steps=10, every=0).replace("vocab: 64", "vocab: 512").replace(
                "data: {source: markov, seed: 5}",
                f"data: {{source: tokens, path: {tokens}, tokenizer: {tokenizer}}}")

        r = c.cli("submit", c.write_job("mismatch.yaml", job("mismatch", model)), "--watch",
                  timeout=120)
        self.assertEqual(r.returncode, 1, r.stdout + r.stderr)
        bad = c.cli_json("jobs")["jobs"][-1]["job_id"]
        d = c.job(bad)
        self.assertEqual(d["summary"]["state"], "JOB_FAILED")
        self.assertEqual(int(d["summary"].get("restarts", 0)), 0)  # retrying cannot help
        logs = c.cli("logs", bad).stdout
        self.assertIn(f"token file {tokens} was made by tokenizer byte", logs)
        self.assertIn(f"data.tokenizer is {model} (sentencepiece:", logs)

        good = c.submit(c.write_job("match.yaml", job("match", "byte")))
        d = c.wait_state(good, ("JOB_SUCCEEDED", "JOB_FAILED"), timeout=300)
        self.assertEqual(d["summary"]["state"], "JOB_SUCCEEDED", d["summary"])

    def test_offload_policy_trains_bit_identically_to_none(self):
        """memory.policy offload through the whole stack: the worker builds the copy engine
        (paced to a host link), the model offloads and reloads, and the parameters are exactly
        those of policy none."""
        c = self.cluster
        none = c.submit(c.write_job("none.yaml", train_job("keep", steps=12, every=0)))
        off = c.submit(c.write_job("offload.yaml", train_job(
            "offload", steps=12, every=0,
            extra="memory: {policy: offload, offload_ratio: 0.5, host_link_gbps: 2}\n")))
        for job in (none, off):
            d = c.wait_state(job, ("JOB_SUCCEEDED", "JOB_FAILED"), timeout=300)
            self.assertEqual(d["summary"]["state"], "JOB_SUCCEEDED", d["summary"])
        logs = c.cli("logs", off).stdout
        self.assertIn("memory policy offload: the expert buffers closest to 50% of each MoE layer's",
                      logs)
        self.assertIn("link 2 GB/s", logs)
        self.assertRegex(logs, r"offload: [1-9][0-9.]* MiB to the host")
        a = c.export(none, "none.safetensors")
        b = c.export(off, "offload.safetensors")
        self.assertEqual(sorted(a), sorted(b))
        for name in a:
            self.assertTrue(a[name] == b[name], f"{name} differs with policy offload")

    def test_sizes_that_do_not_divide_are_refused_at_submit(self):
        c = self.cluster
        spec = train_job("baddims").replace("heads: 4", "heads: 5")
        r = c.cli("submit", c.write_job("dims.yaml", spec))
        self.assertEqual(r.returncode, 2, r.stdout + r.stderr)
        self.assertIn("heads", r.stderr)
        self.assertEqual(c.cli_json("jobs").get("jobs", []), [])


if __name__ == "__main__":
    harness.main()
