"""memory.policy through the control plane: a tiny job trained with `selective` (norm and GELU
outputs dropped after forward, rebuilt in backward) ends with exactly the parameters of the same
job under `none`, reports a smaller activation peak and its recompute bytes, and its rank says
which policy it ran. Under a budget that only `selective` fits, a `none` job runs out of memory
once, is restarted under `adaptive` at the same budget (the out-of-memory escalation:
adaptive needs the least of every policy) and ends with the same parameters. Under the same
budget, an `adaptive` job needs no restart: its planner offloads what
does not fit, says so in its telemetry, and the job ends with the same parameters again. A budget
below what any policy needs is refused at submit, with the bytes needed. Under
expert parallelism a budget between that floor and the routing bound (every token routed to the
rank's experts, dropless) is warned about at start with the bound, and at the bound an adaptive
job trains through spikes. At 2% above `full_recompute`'s peak, with a host link too slow to
offload much, the expert-parallel ranks agree on which expert buffers all of them drop (each comes
back only by re-running the all-to-all together; those jobs recompute their attention
probabilities, which a rank would otherwise drop alone first): the job trains as `none` bit for bit, and its
steps and the Prometheus counters say how often they agreed and what they dropped."""
import json
import os
import re
import time
import urllib.request

import harness


def job(name, policy, budget=0):
    return f"""name: {name}
kind: train
model: {{vocab: 64, seq_len: 32, d_model: 32, heads: 4, layers: 4, expert_ffn: 64}}
moe: {{experts: 4, top_k: 2}}
parallel: {{micro_batch: 4, micro_batches: 2}}
memory: {{policy: {policy}, device_budget: {budget}}}
train: {{steps: 12, lr: 3.0e-3, warmup: 2, seed: 11}}
data: {{source: markov, seed: 5}}
checkpoint: {{every: 6, keep: 1}}
"""


def activation_peak(d):
    memory = d["telemetry"]["memory"]
    return int(memory.get("activation_peak_bytes", memory.get("activationPeakBytes", 0)))


def planner_bytes(d):
    """The last step's bytes per memory action on rank 0, e.g. {"PLANNER_ACTION_RECOMPUTE": 4096}."""
    return {p["action"]: int(p["bytes"]) for p in d["telemetry"].get("planner", [])}


class MemoryPolicyTest(harness.ClusterTest):
    WORKERS = 2

    def test_selective_trains_bit_identical_to_none(self):
        c = self.cluster
        none = c.submit(c.write_job("none.yaml", job("none", "none")))
        selective = c.submit(c.write_job("selective.yaml", job("selective", "selective")))
        d_none = c.wait_state(none, harness.FINAL, timeout=300)
        d_sel = c.wait_state(selective, harness.FINAL, timeout=300)
        self.assertEqual(d_none["summary"]["state"], "JOB_SUCCEEDED", d_none["summary"])
        self.assertEqual(d_sel["summary"]["state"], "JOB_SUCCEEDED", d_sel["summary"])
        self.assertIn("memory policy selective", c.cli("logs", selective).stdout)
        self.assertIn("memory policy none", c.cli("logs", none).stdout)
        self.assertLess(activation_peak(d_sel), activation_peak(d_none))
        self.assertGreater(activation_peak(d_sel), 0)
        # The step telemetry says what the policy did: selective rebuilt what it dropped.
        self.assertEqual(planner_bytes(d_none), {})
        self.assertEqual(list(planner_bytes(d_sel)), ["PLANNER_ACTION_RECOMPUTE"], d_sel["telemetry"])
        self.assertGreater(planner_bytes(d_sel)["PLANNER_ACTION_RECOMPUTE"], 0)
        a = c.export(none, "none.safetensors")
        b = c.export(selective, "sel.safetensors")
        self.assertEqual(sorted(a), sorted(b))
        self.assertIn("layers.3.moe.experts.3.w2", a)
        for name in a:
            self.assertTrue(a[name] == b[name], f"{name} differs between none and selective")

        # No out-of-memory loop: with an activation budget between the two policies' peaks (the
        # largest over every step of the runs above), `none` runs out of memory, the controller
        # restarts the job under `adaptive` at that budget, and it ends with the same parameters.
        peak_none, peak_sel = self.max_peak(none), self.max_peak(selective)
        self.assertLess(peak_sel, peak_none)
        budget = (peak_sel + peak_none) // 2
        tight = c.submit(c.write_job("tight.yaml", job("tight", "none", budget)))
        d = c.wait_state(tight, harness.FINAL, timeout=300)
        self.assertEqual(d["summary"]["state"], "JOB_SUCCEEDED", d["summary"])
        attempts = d["attempts"]
        self.assertEqual(len(attempts), 2, attempts)
        self.assertEqual(attempts[0].get("failure_kind"), "oom", attempts[0])
        self.assertEqual(attempts[0].get("memory_policy"), "none")
        self.assertEqual(attempts[1].get("memory_policy"), "adaptive")
        escalations = [e["message"] for e in d["events"] if e["kind"] == "escalate"]
        self.assertEqual(escalations, ["attempt 1 ran out of memory under memory.policy none; "
                                       "attempt 2 runs with adaptive"])
        self.assertIn("memory policy adaptive", c.cli("logs", tight).stdout)
        self.assertIn("escalated after an attempt ran out of memory", c.cli("status", tight).stdout)
        t = c.export(tight, "tight.safetensors")
        for name in a:
            self.assertTrue(a[name] == t[name], f"{name} differs between none and the escalated run")

        # adaptive at the same budget: one attempt, the planner's offloads in the telemetry, the
        # peak under the budget, the same parameters (offload and recompute are bit-exact).
        adaptive = c.submit(c.write_job("adaptive.yaml", job("adaptive", "adaptive", budget)))
        d = c.wait_state(adaptive, harness.FINAL, timeout=300)
        self.assertEqual(d["summary"]["state"], "JOB_SUCCEEDED", d["summary"])
        self.assertEqual(len(d["attempts"]), 1, d["attempts"])
        self.assertIn("memory policy adaptive", c.cli("logs", adaptive).stdout)
        self.assertGreater(planner_bytes(d).get("PLANNER_ACTION_OFFLOAD", 0), 0, d["telemetry"])
        memory = d["telemetry"]["memory"]
        self.assertGreater(int(memory.get("planner_decisions", memory.get("plannerDecisions", 0))), 0)
        self.assertLessEqual(self.max_peak(adaptive), budget)
        t = c.export(adaptive, "adaptive.safetensors")
        for name in a:
            self.assertTrue(a[name] == t[name], f"{name} differs between none and adaptive")

    def test_budget_no_policy_fits_is_refused_at_submit(self):
        # 64 KiB is below one module's backward for this model under any policy: `furnace submit`
        # refuses it before anything is sent, naming the bytes needed (the ranks check it too, for
        # jobs other clients send: rank_main_test), and no job is made.
        c = self.cluster
        path = c.write_job("small.yaml", job("small", "adaptive", 65536))
        r = c.cli("submit", path)
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertIn("memory.device_budget: 65536 bytes is below", r.stderr)
        self.assertIn("every rank would refuse it at start (allowed: >= ", r.stderr)
        self.assertIn("small.yaml", c.cli("submit", "--dry-run", path).stderr)
        self.assertNotIn("small", c.cli("jobs").stdout)

    def test_expert_parallel_budget_below_the_routing_bound_is_warned_and_the_bound_trains(self):
        # dp2 x ep2, dropless, with spikes that route every token of a step to one expert: the
        # floor covers balanced rows only. A budget between the floor and the routing bound is
        # warned about at start with the bound; at the bound, adaptive trains every spike.
        c = self.cluster

        def ep_job(name, budget, steps=6):
            return f"""name: {name}
kind: train
model: {{vocab: 64, seq_len: 32, d_model: 32, heads: 4, layers: 2, expert_ffn: 64}}
moe:
  experts: 4
  top_k: 2
  capacity_factor: 0
  spikes: {{probability: 1.0, max_ratio: 2.0, seed: 9}}
parallel: {{dp: 2, ep: 2, micro_batch: 4, micro_batches: 1}}
memory: {{policy: adaptive, device_budget: {budget}}}
train: {{steps: {steps}, lr: 3.0e-3, warmup: 0, seed: 11}}
data: {{source: markov, seed: 5}}
recovery: {{max_restarts: 0}}
"""

        def number_after(text, pattern):
            m = re.search(pattern, text)
            self.assertIsNotNone(m, f"no {pattern!r} in the logs:\n{text[-3000:]}")
            return int(m.group(1))

        # The floor, as `furnace submit` states it for a budget below it (the ranks' own number).
        probe = c.cli("submit", "--dry-run", c.write_job("probe.yaml", ep_job("probe", 65536, 1)))
        self.assertEqual(probe.returncode, 2, probe.stderr)
        floor = number_after(probe.stderr, r"is below (\d+) bytes")

        between = c.submit(c.write_job("between.yaml", ep_job("between", floor, steps=1)))
        c.wait_state(between, harness.FINAL, timeout=120)
        logs = c.cli("logs", between).stdout
        self.assertIn("covers balanced routing", logs)
        self.assertIn("sends every token to this rank's experts", logs)
        bound = number_after(logs, r"(\d+) bytes leaves room for any routing")
        self.assertGreater(bound, floor)

        at_bound = c.submit(c.write_job("bound.yaml", ep_job("bound", bound)))
        d = c.wait_state(at_bound, harness.FINAL, timeout=300)
        self.assertEqual(d["summary"]["state"], "JOB_SUCCEEDED", d["summary"])
        self.assertEqual(len(d["attempts"]), 1, d["attempts"])
        self.assertNotIn("leaves room for any routing", c.cli("logs", at_bound).stdout)
        self.assertLessEqual(self.max_peak(at_bound), bound)

    def test_expert_parallel_ranks_agree_on_collective_drops_below_the_per_rank_floor(self):
        c = self.cluster

        def ep_job(name, memory):
            return f"""name: {name}
kind: train
model: {{vocab: 64, seq_len: 32, d_model: 32, heads: 4, layers: 2, expert_ffn: 64,
        attention_probs: recomputed}}
moe: {{experts: 4, top_k: 2, capacity_factor: 1.25}}
parallel: {{dp: 2, ep: 2, micro_batch: 4, micro_batches: 2}}
memory: {{{memory}}}
train: {{steps: 6, lr: 3.0e-3, warmup: 0, seed: 11}}
data: {{source: markov, seed: 5}}
recovery: {{max_restarts: 0}}
"""

        none = c.submit(c.write_job("ep-none.yaml", ep_job("ep-none", "policy: none")))
        full = c.submit(c.write_job("ep-full.yaml", ep_job("ep-full", "policy: full_recompute")))
        for j in (none, full):
            d = c.wait_state(j, harness.FINAL, timeout=300)
            self.assertEqual(d["summary"]["state"], "JOB_SUCCEEDED", d["summary"])
        # 12% below full_recompute's peak: per rank a plan also drops what full_recompute keeps
        # (qkv, the dense MLP's pre-activation), which reaches about 10% below it, not further
        # (AgreedDropTest finds that floor on its layouts); the expert buffers full_recompute
        # drops come back only through the all-to-all, so below it the ranks must agree.
        budget = int(0.88 * self.max_peak(full))
        adaptive = c.submit(c.write_job("ep-adaptive.yaml", ep_job(
            "ep-adaptive", f"policy: adaptive, device_budget: {budget}, host_link_gbps: 0.001")))
        d = c.wait_state(adaptive, harness.FINAL, timeout=300)
        self.assertEqual(d["summary"]["state"], "JOB_SUCCEEDED", d["summary"])
        self.assertEqual(len(d["attempts"]), 1, d["attempts"])
        self.assertLessEqual(self.max_peak(adaptive), budget)
        a, b = c.export(none, "ep-none.safetensors"), c.export(adaptive, "ep-adaptive.safetensors")
        self.assertEqual(sorted(a), sorted(b))
        for name in a:
            self.assertTrue(a[name] == b[name], f"{name} differs between none and adaptive")

        # Each micro-batch of the first step agreed (later steps: after one where a rank ran
        # short), and the agreements dropped buffers.
        steps = self.steps(adaptive)
        self.assertEqual([int(s["step"]) for s in steps], [1, 2, 3, 4, 5, 6])
        agreements = [int(s.get("agreements", 0)) for s in steps]
        drops = [int(s.get("agreed_drops", 0)) for s in steps]
        self.assertEqual(agreements[0], 2, steps[0])
        self.assertTrue(all(0 <= n <= 2 for n in agreements), agreements)
        self.assertGreater(sum(drops), 0, steps)
        self.assertGreater(float(steps[0].get("agreement_seconds", 0)), 0, steps[0])

        def scrape(name):
            with urllib.request.urlopen(f"http://127.0.0.1:{c.metrics_port}/metrics",
                                        timeout=5) as r:
                m = re.search(rf'^{name}{{job="{adaptive}"}} (\S+)$', r.read().decode(), re.M)
            return None if m is None else float(m.group(1))

        def counter(name):
            # A stored step reaches the series as it is committed and the totals just after:
            # read until the last one is counted (or 5 s).
            deadline = time.monotonic() + 5
            value = scrape(name)
            while value != sum(agreements) and name.endswith("agreements_total") and \
                    time.monotonic() < deadline:
                time.sleep(0.1)
                value = scrape(name)
            self.assertIsNotNone(value, f"no {name} for {adaptive} in /metrics")
            return value

        # (agreements first: once they are all counted, every total is.)
        self.assertEqual(counter("furnace_planner_agreements_total"), sum(agreements))
        self.assertEqual(counter("furnace_planner_agreed_drops_total"), sum(drops))
        self.assertGreater(counter("furnace_planner_agreement_seconds_total"), 0)
        # Each rank's last line says its own total: together, the stored steps' sum.
        logged = re.findall(r"(\d+) expert buffers dropped by the ranks' agreement",
                            c.cli("logs", adaptive).stdout)
        self.assertEqual(len(logged), 2, logged)
        self.assertEqual(sum(int(n) for n in logged), sum(drops))

    def steps(self, job_id):
        url = f"http://127.0.0.1:{self.cluster.metrics_port}/api/jobs/{job_id}/series?max=1000"
        with urllib.request.urlopen(url, timeout=5) as r:
            return json.loads(r.read().decode())["steps"]

    def max_peak(self, job_id):
        return max(int(s["activation_peak_bytes"]) for s in self.steps(job_id))


if __name__ == "__main__":
    harness.main()
