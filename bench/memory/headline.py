#!/usr/bin/env python3
"""The BaGuaLu-2 headline, side by side in one run: full `train` jobs through a real controller and
local worker daemons, each memory policy on the same steps, under a device budget that every step
without a routing spike fits and the spike steps do not, at an H200's compute-to-host-link ratio.

    python3 bench/memory/headline.py --bin build/bin [--layout ep4|pp2] [--steps 40]

0. Warm-up: 10 steps under `none` with no budget, checkpointed. A fresh router routes far worse
   than a trained one (its first steps' imbalance dwarfs any spike), so every later job starts
   from a copy of this checkpoint, mid-training, as the paper's runs are.
1. Calibration: the job under `none` with no budget from the warm-up to the last step; the budget
   is 3% above the largest activation peak (max over ranks) of the steps without a spike, or
   --budget.
2. Each policy (none, selective, full_recompute, offload, adaptive) runs the same job from the
   warm-up checkpoint under that budget (checkpoint.override_settings: the warm-up's cosine ran
   over its own 10 steps), checkpoints every 10 steps, one job at a time. A policy that runs out of memory exits,
   and the controller restarts it from its last checkpoint under the policy the out-of-memory
   escalation gives (controller/store/memory_escalation.h: adaptive at the same budget since
   2026-12-06; before, the next more conservative static policy), as an operator would; its lost
   steps and restart are paid in its wall time.
Reported per policy (steps 11 to the last): tokens/s over the whole job (submit to success, restarts included), tokens/s
of the spike steps and of the other steps (step times of the attempt that trained them), OOM
restarts, the planner's time and decisions, and bytes per action.
The host link: the rank's SGEMM peak (from its log: the machine's, shared among the ranks on it)
/ 18,000 bytes/s, the H200's ratio of dense bf16 FLOPs to PCIe bytes (bench/memory/REPORT.md).
"""
import argparse
import itertools
import json
import os
import re
import shutil
import sys
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tests", "integration"))
import harness  # noqa: E402

LAYOUTS = {
    "ep4": "{micro_batch: 4, micro_batches: 2, dp: 4, ep: 4}",
    "pp2": "{micro_batch: 4, micro_batches: 4, pp: 2, dp: 2, ep: 2}",
}
POLICIES = ["none", "selective", "full_recompute", "offload", "adaptive"]


def job(name, layout, steps, policy, budget, link, spikes, experts, top_k, ckpt, d_model=64,
        expert_ffn=256):
    memory = f"policy: {policy}, device_budget: {budget}"
    if policy in ("offload", "adaptive") and link > 0:
        memory += f", host_link_gbps: {link:.6f}"
    return f"""name: {name}
kind: train
model: {{vocab: 256, seq_len: 64, d_model: {d_model}, heads: 4, layers: 4, expert_ffn: {expert_ffn}}}
moe: {{experts: {experts}, top_k: {top_k}, spikes: {spikes}}}
parallel: {LAYOUTS[layout]}
memory: {{{memory}}}
train: {{steps: {steps}, lr: 2.0e-3, warmup: 4, seed: 3}}
data: {{source: markov, seed: 9}}
checkpoint: {{every: 10, keep: 1, dir: {ckpt}, override_settings: true}}
recovery: {{max_restarts: 4}}
"""


def series(cluster, job_id):
    url = f"http://127.0.0.1:{cluster.metrics_port}/api/jobs/{job_id}/series?max=10000"
    with urllib.request.urlopen(url, timeout=10) as r:
        return json.loads(r.read().decode())["steps"]


def run(cluster, name, text, timeout):
    path = cluster.write_job(f"{name}.yaml", text)
    t0 = time.time()
    job_id = cluster.submit(path)
    d = cluster.wait_state(job_id, harness.FINAL, timeout=timeout)
    wall = time.time() - t0
    return job_id, d, wall


def Median(rs):
    """One row per policy: the median of each number over the rounds (the text of the first)."""
    out = dict(rs[0])
    for key, value in rs[0].items():
        if isinstance(value, (int, float)):
            values = sorted(r[key] for r in rs)
            out[key] = values[len(values) // 2]
    out["rounds"] = len(rs)
    return out


def final_steps(steps):
    """The step records that count: for each step number, the attempt that trained it last."""
    by_step = {}
    for s in steps:
        by_step[int(s["step"])] = s
    return [by_step[k] for k in sorted(by_step)]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bin", default=os.path.join(ROOT, "build", "bin"))
    ap.add_argument("--layout", choices=sorted(LAYOUTS), default="ep4")
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--spike-probability", type=float, default=0.1)
    ap.add_argument("--spike-ratio", type=float, default=3.0)
    ap.add_argument("--experts", type=int, default=4)
    ap.add_argument("--top-k", type=int, default=1)
    ap.add_argument("--d-model", type=int, default=64)
    ap.add_argument("--expert-ffn", type=int, default=256)
    ap.add_argument("--policies", default=",".join(POLICIES))
    ap.add_argument("--budget", type=int, default=0,
                    help="the device budget in bytes (default: 3%% above the calibration's "
                         "largest peak without a spike); e.g. between full_recompute's and "
                         "selective's peaks, where selective no longer fits")
    ap.add_argument("--repeat", type=int, default=1,
                    help="rounds over the policies (in turn, so the machine's noise falls on all "
                         "alike); each number is the median over the rounds")
    args = ap.parse_args()
    harness.BIN_DIR = os.path.abspath(args.bin)
    spikes = f"{{probability: {args.spike_probability}, max_ratio: {args.spike_ratio}, seed: 21}}"
    workers = 4
    cluster = harness.Cluster(workers=workers).start()
    try:
        def ckpt(name):
            d = os.path.join(cluster.state, "bench-checkpoints", name)
            if name != "warmup":
                shutil.copytree(os.path.join(cluster.state, "bench-checkpoints", "warmup"), d)
            return d

        def spec(name, steps, policy, budget, link):
            return job(name, args.layout, steps, policy, budget, link, spikes, args.experts,
                       args.top_k, ckpt(name), args.d_model, args.expert_ffn)

        print(f"warming up: {args.layout}, 10 steps, policy none, no budget", flush=True)
        _, d, _ = run(cluster, "warmup", spec("warmup", 10, "none", 0, 0), 1800)
        if d["summary"]["state"] != "JOB_SUCCEEDED":
            sys.exit(f"warm-up failed: {d['summary']}\n{cluster.dump_logs()}")
        print(f"calibrating: steps 11..{args.steps}, policy none, no budget", flush=True)
        cal, d, wall = run(cluster, "calibrate", spec("calibrate", args.steps, "none", 0, 0), 1800)
        if d["summary"]["state"] != "JOB_SUCCEEDED":
            sys.exit(f"calibration failed: {d['summary']}\n{cluster.dump_logs()}")
        logs = cluster.cli("logs", cal).stdout
        # worker/train_rank.cc: "peak 48.2 GFLOP/s (CPU SGEMM 2048^3, 1 thread, ...)".
        m = re.search(r"peak ([0-9.]+) GFLOP/s \(CPU SGEMM", logs)
        if not m:
            sys.exit("calibration: no `peak N GFLOP/s (CPU SGEMM` line in the job's log, which "
                     "sizes the host link; has worker/train_rank.cc's model line changed?")
        peak_gflops = float(m.group(1))
        link = peak_gflops / 18000.0  # GB/s
        steps = final_steps(series(cluster, cal))
        plain = [int(s["activation_peak_bytes"]) for s in steps if not s.get("routing_spike")]
        spiked = [int(s["activation_peak_bytes"]) for s in steps if s.get("routing_spike")]
        budget = args.budget if args.budget > 0 else int(1.03 * max(plain))
        print("  peaks by step (* spike): " + " ".join(
            f"{int(s['activation_peak_bytes']) // 1024}{'*' if s.get('routing_spike') else ''}"
            for s in steps), flush=True)
        print(f"  spike steps {len(spiked)} of {len(steps)}; peak without spikes {max(plain)} B, "
              f"with {max(spiked) if spiked else 0} B; budget {budget} B; CPU SGEMM "
              f"{peak_gflops:.1f} GFLOP/s -> host link {link * 1000:.2f} MB/s", flush=True)
        if not spiked or max(spiked) <= budget:
            print("  note: no spike step exceeds the budget in this run", flush=True)

        runs = {}
        for round_, policy in itertools.product(range(args.repeat), args.policies.split(",")):
            name = f"{policy}-{round_}"
            print(f"running {name} ...", flush=True)
            job_id, d, wall = run(cluster, name, spec(name, args.steps, policy, budget, link),
                                  3600)
            state = d["summary"]["state"]
            attempts = d.get("attempts", [])
            ooms = sum(1 for a in attempts if a.get("failure_kind") == "oom")
            policies = "->".join(a.get("memory_policy", policy) for a in attempts)
            recs = final_steps(series(cluster, job_id))
            tokens = sum(float(s.get("tokens", 0)) for s in recs)
            spike_recs = [s for s in recs if s.get("routing_spike")]
            plain_recs = [s for s in recs if not s.get("routing_spike")]

            def rate(rs):
                secs = sum(float(s.get("step_seconds", 0)) for s in rs)
                return sum(float(s.get("tokens", 0)) for s in rs) / secs if secs > 0 else 0.0

            action_bytes = {}
            for s in recs:
                for p in s.get("planner", []):
                    a = p["action"].replace("PLANNER_ACTION_", "").lower()
                    action_bytes[a] = action_bytes.get(a, 0) + int(p["bytes"])
            runs.setdefault(policy, []).append({
                "policy": policy, "state": state, "wall": wall, "tokens_per_s": tokens / wall,
                "spike_rate": rate(spike_recs), "plain_rate": rate(plain_recs), "ooms": ooms,
                "attempts": policies,
                "planner_s": sum(float(s.get("planner_seconds", 0)) for s in recs),
                "decisions": sum(int(s.get("planner_decisions", 0)) for s in recs),
                "emergencies": sum(int(s.get("emergency_offloads", 0)) for s in recs),
                "agreed_drops": sum(int(s.get("agreed_drops", 0)) for s in recs),
                "peak": max(int(s["activation_peak_bytes"]) for s in recs),
                "bytes": action_bytes,
            })
            print(f"  {state} in {wall:.1f} s, attempts {policies}", flush=True)
        rows = [Median(rs) for rs in runs.values()]
    finally:
        cluster.close()

    base = {r["policy"]: r for r in rows}
    print()
    print(f"layout {args.layout}, {args.steps} steps, spikes p={args.spike_probability} "
          f"ratio {args.spike_ratio}, budget {budget} B, host link {link * 1000:.2f} MB/s")
    print("| policy | result (attempts) | tokens/s whole job | spike steps tokens/s | other steps "
          "tokens/s | OOM restarts | peak B | planner s | decisions | emergency | agreed drops | "
          "bytes moved |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        moved = ", ".join(f"{a} {b / 1048576:.1f} MiB" for a, b in sorted(r["bytes"].items()))
        print(f"| {r['policy']} | {r['state'].replace('JOB_', '').lower()} ({r['attempts']}) | "
              f"{r['tokens_per_s']:.0f} | {r['spike_rate']:.0f} | {r['plain_rate']:.0f} | "
              f"{r['ooms']} | {r['peak']} | {r['planner_s']:.4f} | {r['decisions']} | "
              f"{r['emergencies']} | {r['agreed_drops']} | {moved or '-'} |")
    if "adaptive" in base:
        a = base["adaptive"]
        static = [r for r in rows if r["policy"] != "adaptive" and r["state"] == "JOB_SUCCEEDED"]
        if static:
            best = max(static, key=lambda r: r["tokens_per_s"])
            best_spike = max(static, key=lambda r: r["spike_rate"])
            print(f"\nadaptive / best static ({best['policy']}) over the job: "
                  f"{a['tokens_per_s'] / best['tokens_per_s']:.3f}x; during spikes / best static "
                  f"({best_spike['policy']}): "
                  f"{a['spike_rate'] / best_spike['spike_rate'] if best_spike['spike_rate'] else 0:.3f}x")
        if "none" in base and base["none"]["plain_rate"]:
            print(f"adaptive / none on steps without a spike: "
                  f"{a['plain_rate'] / base['none']['plain_rate']:.3f}x")


if __name__ == "__main__":
    main()
