#!/usr/bin/env python3
"""Parm's schedules on a whole training job, side by side in one run: the demo model
(configs/demo.yaml's dims) with tensor parallelism 2 and expert parallelism 2 on 4 ranks
(tp 2 x dp 2, ep 2), through a real controller and local worker daemons, once per
moe.schedule (deepspeed, s1, s2, auto), the schedules interleaved round by round so the
machine's noise hits them alike.

    python3 bench/parm/whole_job.py --bin build/bin [--steps 40] [--rounds 2] [--json out.json]

Reported per schedule (median over the rounds): tokens/s over the timed steps (steps after
--skip; global tokens / summed step time of the step records), the schedule each MoE layer ran
(auto: its choice), the MoE ops' bytes per step per op summed over the ranks, the final loss.
Every job trains the same steps from the same seed; the losses must agree (every schedule
computes the same model) to the layout tests' tolerance, which the script checks (exit 3).
"""
import argparse
import json
import os
import sys
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tests", "integration"))
import harness  # noqa: E402

SCHEDULES = ["deepspeed", "s1", "s2", "auto"]


def job(name, schedule, steps):
    return f"""name: {name}
kind: train
model: {{vocab: 64, seq_len: 64, d_model: 64, heads: 4, layers: 4, expert_ffn: 128}}
moe: {{experts: 8, top_k: 2, capacity_factor: 0, schedule: {schedule}}}
parallel: {{tp: 2, dp: 2, ep: 2, micro_batch: 4, micro_batches: 2}}
train: {{steps: {steps}, lr: 3.0e-3, warmup: 5, seed: 1}}
data: {{source: markov, seed: 7}}
recovery: {{max_restarts: 0}}
"""


def series(cluster, job_id):
    url = f"http://127.0.0.1:{cluster.metrics_port}/api/jobs/{job_id}/series?max=10000"
    with urllib.request.urlopen(url, timeout=10) as r:
        return json.loads(r.read().decode())["steps"]


def metric_lines(cluster, prefix):
    url = f"http://127.0.0.1:{cluster.metrics_port}/metrics"
    with urllib.request.urlopen(url, timeout=10) as r:
        return [l for l in r.read().decode().splitlines() if l.startswith(prefix)]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bin", default=os.path.join(ROOT, "build", "bin"))
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--skip", type=int, default=10, help="untimed first steps")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--json")
    args = ap.parse_args()
    harness.BIN_DIR = os.path.abspath(args.bin)
    cluster = harness.Cluster(workers=4).start()
    rows = {s: [] for s in SCHEDULES}
    try:
        for rnd in range(args.rounds):
            for schedule in SCHEDULES:
                name = f"parm-{schedule}-{rnd}"
                path = cluster.write_job(f"{name}.yaml", job(name, schedule, args.steps))
                job_id = cluster.submit(path)
                d = cluster.wait_state(job_id, harness.FINAL, timeout=900)
                if d["summary"]["state"] != "JOB_SUCCEEDED":
                    print(cluster.dump_logs(), file=sys.stderr)
                    print(f"{name}: {d['summary']['state']}", file=sys.stderr)
                    return 1
                steps = {int(s["step"]): s for s in series(cluster, job_id)}
                timed = [steps[k] for k in sorted(steps) if k > args.skip]
                secs = sum(float(s.get("step_seconds", 0)) for s in timed)
                tokens = sum(float(s.get("tokens", 0)) for s in timed)
                last = steps[max(steps)]
                # What each MoE layer ran (auto: its choice), from the last step's record (the
                # furnace_moe_schedule_info metric is exported only while the job runs).
                ran = sorted({str(m).removeprefix("MOE_LAYER_SCHEDULE_").lower()
                              for m in last.get("moe_schedules", [])})
                if not ran:
                    print(f"{name}: its last step records no moe_schedules", file=sys.stderr)
                    return 1
                op_bytes = {}
                for line in metric_lines(cluster, "furnace_moe_op_bytes_total"):
                    if f'job="{job_id}"' not in line:
                        continue
                    op = line.split('op="')[1].split('"')[0]
                    op_bytes[op] = float(line.rsplit(" ", 1)[1]) / args.steps
                rows[schedule].append({
                    "schedule": schedule, "ran": ran, "tokens_per_s": tokens / secs,
                    "loss": float(last.get("loss", 0)), "op_bytes_per_step": op_bytes,
                })
                print(f"round {rnd} {schedule:9s} ran {','.join(ran) or '?':9s} "
                      f"{tokens / secs:8.0f} tok/s  loss {float(last.get('loss', 0)):.5f}",
                      flush=True)
    finally:
        cluster.close()

    def median(rs, key):
        v = sorted(r[key] for r in rs)
        return v[len(v) // 2]

    base = median(rows["deepspeed"], "tokens_per_s")
    out = []
    print(f"\n{'schedule':10s} {'ran':10s} {'tok/s':>8s} {'vs deepspeed':>13s}  bytes per step (all ranks)")
    for s in SCHEDULES:
        tps = median(rows[s], "tokens_per_s")
        r0 = rows[s][0]
        moved = ", ".join(f"{op} {b / 1024:.0f} KiB" for op, b in sorted(r0["op_bytes_per_step"].items()))
        print(f"{s:10s} {','.join(r0['ran']):10s} {tps:8.0f} {tps / base:12.3f}x  {moved}")
        out.append({"schedule": s, "ran": r0["ran"], "tokens_per_s": tps, "vs_deepspeed": tps / base,
                    "rounds": [r["tokens_per_s"] for r in rows[s]],
                    "op_bytes_per_step": r0["op_bytes_per_step"], "loss": r0["loss"]})
    ref = rows["deepspeed"][0]["loss"]
    worst = max(abs(r["loss"] - ref) / abs(ref) for rs in rows.values() for r in rs)
    print(f"\nfinal loss: deepspeed {ref:.6f}; largest relative difference of any run {worst:.2e}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"date": time.strftime("%Y-%m-%d %H:%M"), "nproc": os.cpu_count(),
                       "steps": args.steps, "skip": args.skip, "rows": out,
                       "loss_rel_diff": worst}, f, indent=1)
    return 3 if worst > 1e-4 else 0


if __name__ == "__main__":
    sys.exit(main())
