#!/usr/bin/env python3
"""Checkpoint stall, synchronous vs asynchronous (checkpoint.async) vs none, side by side in one
run: `train` jobs through a real controller and local worker daemons, the same job with
checkpoints every --every steps (checkpoint.async false, then true) and without checkpoints
(only the one at the end, which is not counted), interleaved over --rounds.

    python3 bench/recovery/checkpoint_stall.py --bin build/bin [--steps 60] [--every 5] [--rounds 2]

Reported per mode (median over the rounds), from the slowest rank's StepRecords (the first two
steps and the last are left out: start-up and the final checkpoint):
  * the stall per checkpoint: every step's checkpoint_stall_seconds summed, over the number of
    checkpoints (with checkpoint.async the stall is spread: the wait for the snapshot's copy
    before the next update, the per-step check whether every shard is durable and the commit);
  * the median step time;
  * the stall share: summed stalls over summed step times plus stalls (the copy wait is inside
    the step time too, so this overstates a little);
  * the slowdown: mean step time plus stall per step against the run without checkpoints (what
    the background writer costs the training threads on shared cores shows here as well).
The model is big enough (d 256, 8 experts of 1024) that a shard is about 64 MB per rank.
"""
import argparse
import json
import os
import shutil
import sys
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tests", "integration"))
import harness  # noqa: E402


def job(name, steps, every, asynchronous, ckpt):
    return f"""name: {name}
kind: train
model: {{vocab: 256, seq_len: 64, d_model: 256, heads: 4, layers: 4, expert_ffn: 1024}}
moe: {{experts: 8, top_k: 2}}
parallel: {{dp: 4, ep: 4, micro_batch: 2, micro_batches: 1}}
train: {{steps: {steps}, lr: 2.0e-3, warmup: 4, seed: 3}}
data: {{source: markov, seed: 9}}
checkpoint: {{every: {every}, keep: 2, dir: {ckpt}, async: {str(asynchronous).lower()}}}
"""


def series(cluster, job_id):
    url = f"http://127.0.0.1:{cluster.metrics_port}/api/jobs/{job_id}/series?max=10000"
    with urllib.request.urlopen(url, timeout=10) as r:
        return json.loads(r.read().decode())["steps"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bin", default=os.path.join(ROOT, "build", "bin"))
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--every", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--json")
    args = ap.parse_args()
    harness.BIN_DIR = os.path.abspath(args.bin)
    cluster = harness.Cluster(workers=4).start()
    rows = {"sync": [], "async": [], "none": []}
    try:
        for rnd in range(args.rounds):
            for mode in ("sync", "async", "none"):
                name = f"stall-{mode}-{rnd}"
                ckpt = os.path.join(cluster.state, name)
                shutil.rmtree(ckpt, ignore_errors=True)
                every = 0 if mode == "none" else args.every
                path = cluster.write_job(f"{name}.yaml",
                                         job(name, args.steps, every, mode == "async", ckpt))
                job_id = cluster.submit(path)
                d = cluster.wait_state(job_id, harness.FINAL, timeout=900)
                if d["summary"]["state"] != "JOB_SUCCEEDED":
                    print(cluster.dump_logs(), file=sys.stderr)
                    print(f"{name}: {d['summary']['state']}", file=sys.stderr)
                    return 1
                steps = {int(s["step"]): s for s in series(cluster, job_id)}
                shutil.rmtree(ckpt, ignore_errors=True)  # its shards: ~64 MB a rank, kept 2
                recs = [steps[k] for k in sorted(steps) if 1 < k < args.steps]
                stall = [float(s.get("checkpoint_stall_seconds", 0)) for s in recs]
                step_s = [float(s.get("step_seconds", 0)) for s in recs]
                checkpoints = sum(1 for s in recs if every and int(s["step"]) % every == 0)
                row = {"mode": mode,
                       "stall_per_checkpoint_ms":
                           1e3 * sum(stall) / checkpoints if checkpoints else 0,
                       "checkpoints": checkpoints,
                       "step_ms": 1e3 * sorted(step_s)[len(step_s) // 2],
                       "cost_per_step_ms": 1e3 * (sum(step_s) + sum(stall)) / len(recs),
                       "stall_share": sum(stall) / (sum(step_s) + sum(stall))}
                rows[mode].append(row)
                print(f"round {rnd} {mode:5s}: stall {row['stall_per_checkpoint_ms']:7.1f} ms per "
                      f"checkpoint ({checkpoints}), step {row['step_ms']:6.1f} ms, "
                      f"stall share {100 * row['stall_share']:.2f}%", flush=True)
    finally:
        cluster.close()
    out = {}
    for mode, rs in rows.items():
        out[mode] = {k: sorted(r[k] for r in rs)[len(rs) // 2] for k in rs[0] if k != "mode"}
    base = out["none"]["cost_per_step_ms"]
    for mode, med in out.items():
        med["slowdown_vs_none"] = med["cost_per_step_ms"] / base - 1 if base else 0
        print(f"{mode:5s}: stall {med['stall_per_checkpoint_ms']:.1f} ms per checkpoint, "
              f"step {med['step_ms']:.1f} ms, stall {100 * med['stall_share']:.2f}% of step time, "
              f"{100 * med['slowdown_vs_none']:+.1f}% per step against no checkpoints")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"date": time.strftime("%Y-%m-%d %H:%M"), "steps": args.steps,
                       "every": args.every, "rounds": out}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
