"""The `train` job kind through the control plane: a run that learns, a rank SIGKILLed mid-run
that resumes from its checkpoint and ends with exactly the parameters of an uninterrupted run,
and bad input refused before training starts."""
import os
import signal
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


class TrainTest(harness.ClusterTest):
    WORKERS = 2

    def test_sigkill_resumes_from_checkpoint_bit_exact(self):
        c = self.cluster
        # Two identical runs side by side, one of them killed mid-run.
        ref = c.submit(c.write_job("ref.yaml", train_job("reference")))
        victim = c.submit(c.write_job("victim.yaml", train_job("victim")))
        d = c.wait_for(victim, lambda d: d["summary"]["state"] == "JOB_RUNNING" and
                       int(d["summary"].get("step", 0)) >= 30, timeout=120,
                       what="victim past its first checkpoint")
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
        self.assertIn("layers.3.moe.experts.7.w2", a)
        for name in a:
            self.assertEqual(a[name][:2], b[name][:2], name)
            self.assertTrue(a[name][2] == b[name][2], f"{name} differs after the resume")
        self.assertEqual(a["wte"][1], (64, 64))
        # The run learned: the last reported loss is near the Markov chain's entropy floor.
        m = r["telemetry"]
        self.assertLess(m["loss"], 1.25 * m["entropy_floor"], m)

    def test_sigkill_resumes_from_an_async_checkpoint_bit_exact(self):
        """checkpoint.async through the whole stack: shards written in the background, a rank
        SIGKILLed after the first commit, the run resumed from the newest committed checkpoint."""
        c = self.cluster
        ref = c.submit(c.write_job("ref.yaml", train_job("reference")))
        victim = c.submit(c.write_job("victim.yaml", train_job("victim", async_checkpoints=True)))
        # The snapshot of step 20 is committed when the one of step 40 starts.
        d = c.wait_for(victim, lambda d: d["summary"]["state"] == "JOB_RUNNING" and
                       int(d["summary"].get("step", 0)) >= 50, timeout=120,
                       what="victim past its first committed checkpoint")
        os.kill(int(d["attempts"][0]["ranks"][0]["pid"]), signal.SIGKILL)
        d = c.wait_state(victim, ("JOB_SUCCEEDED", "JOB_FAILED"), timeout=300)
        self.assertEqual(d["summary"]["state"], "JOB_SUCCEEDED", d["summary"])
        self.assertEqual(int(d["summary"]["restarts"]), 1)
        logs = c.cli("logs", victim, "--attempt", "2").stdout
        self.assertIn("resumed from the checkpoint of step", logs)
        self.assertNotIn("not committed", c.cli("logs", victim).stdout)
        c.wait_state(ref, "JOB_SUCCEEDED", timeout=300)
        a = c.export(ref, "ref.safetensors")
        b = c.export(victim, "victim.safetensors")
        self.assertEqual(sorted(a), sorted(b))
        for name in a:
            self.assertTrue(a[name][2] == b[name][2], f"{name} differs after the resume")

    def test_bad_token_file_fails_at_once_with_the_reason(self):
        c = self.cluster
        bad = os.path.join(c.state, "bad.tokens")
        with open(bad, "wb") as f:
            f.write(b"NOTTOKEN" + bytes(64))
        spec = train_job("badfile").replace("data: {source: markov, seed: 5}",
                                            f"data: {{source: tokens, path: {bad}}}")
        r = c.cli("submit", c.write_job("bad.yaml", spec), "--watch", timeout=120)
        self.assertEqual(r.returncode, 1, r.stdout + r.stderr)
        job = c.cli_json("jobs")["jobs"][0]["job_id"]
        d = c.job(job)
        self.assertEqual(d["summary"]["state"], "JOB_FAILED")
        self.assertEqual(int(d["summary"].get("restarts", 0)), 0)  # retrying cannot help
        self.assertIn("not retried", d["summary"]["cause"])
        self.assertIn(bad, c.cli("logs", job).stdout)

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
        self.assertIn("memory policy offload: 50% of each MoE layer's expert activations", logs)
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
