#!/usr/bin/env python3
"""Checkpoint stall, synchronous vs asynchronous (checkpoint.async), side by side in one run:
`train` jobs through a real controller and local worker daemons, the same job with checkpoints
every --every steps, once with checkpoint.async false and once true, interleaved over --rounds.

    python3 bench/recovery/checkpoint_stall.py --bin build/bin [--steps 60] [--every 5] [--rounds 2]

Reported per mode (median over the rounds): the stall per checkpoint (how long checkpointing held
the step it followed, the slowest rank's: StepRecord.checkpoint_stall_seconds), the step time of
the steps without a checkpoint, and the stall as a share of step time over the whole job
(summed stalls / summed step times). The model is big enough (d 256, 8 experts of 1024) that a
shard is a few MiB per rank.
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
    url = f"http://127.0.0.1:{cluster.metrics_port}/api/jobs/{job_id}/series?max=100000"
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
    rows = {"sync": [], "async": []}
    try:
        for rnd in range(args.rounds):
            for mode in ("sync", "async"):
                name = f"stall-{mode}-{rnd}"
                ckpt = os.path.join(cluster.state, name)
                shutil.rmtree(ckpt, ignore_errors=True)
                path = cluster.write_job(f"{name}.yaml",
                                         job(name, args.steps, args.every, mode == "async", ckpt))
                job_id = cluster.submit(path)
                d = cluster.wait_state(job_id, harness.FINAL, timeout=900)
                if d["summary"]["state"] != "JOB_SUCCEEDED":
                    cluster.dump_logs()
                    return 1
                steps = {int(s["step"]): s for s in series(cluster, job_id)}
                recs = [steps[k] for k in sorted(steps) if k > 1]
                stalls = [float(s.get("checkpoint_stall_seconds", 0)) for s in recs
                          if float(s.get("checkpoint_stall_seconds", 0)) > 0]
                total = sum(float(s.get("step_seconds", 0)) for s in recs)
                plain = sorted(float(s.get("step_seconds", 0)) for s in recs
                               if float(s.get("checkpoint_stall_seconds", 0)) == 0)
                row = {"mode": mode,
                       "stall_per_checkpoint_ms": 1e3 * sorted(stalls)[len(stalls) // 2] if stalls else 0,
                       "checkpoints": len(stalls),
                       "plain_step_ms": 1e3 * plain[len(plain) // 2] if plain else 0,
                       "stall_share": sum(stalls) / (total + sum(stalls)) if total else 0}
                rows[mode].append(row)
                print(f"round {rnd} {mode:5s}: stall {row['stall_per_checkpoint_ms']:7.1f} ms per "
                      f"checkpoint ({row['checkpoints']}), step {row['plain_step_ms']:6.1f} ms, "
                      f"stall share {100 * row['stall_share']:.2f}%", flush=True)
    finally:
        cluster.close()
    out = {}
    for mode, rs in rows.items():
        med = {k: sorted(r[k] for r in rs)[len(rs) // 2] for k in rs[0] if k != "mode"}
        out[mode] = med
        print(f"{mode:5s}: stall {med['stall_per_checkpoint_ms']:.1f} ms per checkpoint, "
              f"plain step {med['plain_step_ms']:.1f} ms, stall {100 * med['stall_share']:.2f}% of step time")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"date": time.strftime("%Y-%m-%d %H:%M"), "steps": args.steps,
                       "every": args.every, "rounds": out}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
