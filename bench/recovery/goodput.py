#!/usr/bin/env python3
"""Goodput under an injected failure rate, fixed checkpoint interval vs `checkpoint.every: auto`,
side by side in one run: the same `train` job through a real controller and local worker daemons,
its rank crashing after a random number of computed steps (fault.mean_steps: geometric with mean
--mean-steps, drawn from train.seed and the attempt, so both modes see the same failure draws),
once with `checkpoint.every: --every` and once with `auto`, interleaved over --rounds.

    python3 bench/recovery/goodput.py --bin build/bin [--steps 1000] [--mean-steps 200] \
        [--every 50] [--rounds 1] [--async] [--json out.json]

Reported per mode (the controller's accounting, controller/store/goodput.h, as `furnace status`
shows it): goodput = productive step time / (productive + lost), and the lost time by cause
(restart, redone steps, checkpoint stall, start-up), the failures, the checkpoints taken and the
wall time of the job. Under auto the first attempt runs on the prior MTBF (one day) until the
first failure is seen, so the first failure is expensive; --skip-first also reports goodput from
the second attempt on (the steady state the interval is chosen for).
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


def job(name, steps, every, mean_steps, ckpt, model, asynchronous):
    return f"""name: {name}
kind: train
model: {model}
moe: {{experts: 4, top_k: 2}}
parallel: {{micro_batch: 4, micro_batches: 1}}
train: {{steps: {steps}, lr: 2.0e-3, warmup: 10, seed: 3}}
data: {{source: markov, seed: 9}}
checkpoint: {{every: {every}, keep: 2, dir: {ckpt}, async: {str(asynchronous).lower()}}}
recovery:
  max_restarts: 1000
  backoff: {{initial_s: 0.2, max_s: 0.2, multiplier: 1.0}}
fault: {{mode: crash, rank: 0, mean_steps: {mean_steps}, every_attempt: true}}
"""


def series(cluster, job_id):
    url = f"http://127.0.0.1:{cluster.metrics_port}/api/jobs/{job_id}/series?max=10000"
    with urllib.request.urlopen(url, timeout=10) as r:
        return json.loads(r.read().decode())["steps"]


def steady_goodput(steps):
    """Goodput from attempt 2 on, by the same rules as the controller's (goodput.h), from the
    series: productive = first computations, redone = recomputations, restart = gaps between
    attempts, stall = checkpoint stalls."""
    high = max((int(s["step"]) for s in steps if int(s["attempt"]) == 1), default=0)
    productive = lost = 0.0
    last_end, last_attempt = None, None
    for s in steps:
        a, n = int(s["attempt"]), int(s["step"])
        secs = float(s.get("step_seconds", 0))
        stall = float(s.get("checkpoint_stall_seconds", 0))
        start = float(s["unix_time"]) - stall - secs
        if a == 1:
            last_end, last_attempt = float(s["unix_time"]), a
            continue
        if a != last_attempt and last_end is not None:
            lost += max(0.0, start - last_end)
        if n <= high:
            lost += secs
        else:
            productive += secs
            high = n
        lost += stall
        last_end, last_attempt = float(s["unix_time"]), a
    return productive / (productive + lost) if productive + lost > 0 else float("nan")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bin", default=os.path.join(ROOT, "build", "bin"))
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--mean-steps", type=int, default=200)
    ap.add_argument("--every", type=int, default=50)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--model", default="{vocab: 64, seq_len: 64, d_model: 64, heads: 4, layers: 2, "
                                       "expert_ffn: 128}")
    ap.add_argument("--async", dest="asynchronous", action="store_true",
                    help="checkpoint.async: true in both modes")
    ap.add_argument("--json")
    args = ap.parse_args()
    harness.BIN_DIR = os.path.abspath(args.bin)
    cluster = harness.Cluster(workers=1).start()
    modes = {"fixed": str(args.every), "auto": "auto"}
    rows = {m: [] for m in modes}
    try:
        for rnd in range(args.rounds):
            for mode, every in modes.items():
                name = f"goodput-{mode}-{rnd}"
                ckpt = os.path.join(cluster.state, name)
                shutil.rmtree(ckpt, ignore_errors=True)
                path = cluster.write_job(f"{name}.yaml", job(name, args.steps, every,
                                                             args.mean_steps, ckpt, args.model,
                                                             args.asynchronous))
                t0 = time.time()
                job_id = cluster.submit(path)
                d = cluster.wait_state(job_id, ("JOB_SUCCEEDED", "JOB_FAILED", "JOB_CANCELLED"),
                                       timeout=1800)
                wall = time.time() - t0
                if d["summary"]["state"] != "JOB_SUCCEEDED":
                    print(cluster.dump_logs())
                    return 1
                g = d["goodput"]
                steps = series(cluster, job_id)
                checkpoints = sum(1 for s in steps if float(s.get("checkpoint_stall_seconds", 0)) > 0)
                plain = sorted(float(s["step_seconds"]) for s in steps)
                row = {"goodput": g["ratio"], "steady_goodput": steady_goodput(steps),
                       "productive_s": g["productive_seconds"], "restart_s": g["restart_seconds"],
                       "redone_s": g["redone_seconds"], "redone_steps": int(g["redone_steps"]),
                       "stall_s": g["checkpoint_stall_seconds"], "startup_s": g["startup_seconds"],
                       "failures": int(g["failures"]), "checkpoints": checkpoints,
                       "interval_steps": int(g.get("checkpoint_interval_steps", 0)) or args.every,
                       "step_ms": 1e3 * plain[len(plain) // 2], "wall_s": wall}
                rows[mode].append(row)
                print(f"round {rnd} {mode:5s}: goodput {100 * row['goodput']:.1f}% "
                      f"(from attempt 2: {100 * row['steady_goodput']:.1f}%), "
                      f"{row['failures']} failures, productive {row['productive_s']:.1f} s, lost: "
                      f"restart {row['restart_s']:.1f} s, redone {row['redone_s']:.1f} s "
                      f"({row['redone_steps']} steps), stall {row['stall_s']:.2f} s "
                      f"({row['checkpoints']} checkpoints), start-up {row['startup_s']:.1f} s; "
                      f"interval {row['interval_steps']} steps, step {row['step_ms']:.1f} ms, "
                      f"wall {row['wall_s']:.0f} s", flush=True)
    finally:
        cluster.close()
    out = {}
    for mode, rs in rows.items():
        out[mode] = {k: sorted(r[k] for r in rs)[len(rs) // 2] for k in rs[0]}
    f, a = out["fixed"], out["auto"]
    print(f"goodput auto / fixed: {a['goodput'] / f['goodput']:.3f} "
          f"(from attempt 2: {a['steady_goodput'] / f['steady_goodput']:.3f}); "
          f"lost auto / fixed: "
          f"{(1 - a['goodput']) / (1 - f['goodput']) if f['goodput'] < 1 else float('nan'):.3f}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"date": time.strftime("%Y-%m-%d %H:%M"), "steps": args.steps,
                       "mean_steps": args.mean_steps, "every": args.every, "model": args.model,
                       "async": args.asynchronous,
                       "rounds": args.rounds, "median": out, "runs": rows}, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
