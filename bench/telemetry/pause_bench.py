#!/usr/bin/env python3
"""Does a stopped controller slow training down? Runs the demo-sized train job through a real
furnace-controller with one local worker, A B A B: A = telemetry consumed normally, B = the
controller SIGSTOPped for the measured window. The step times come from the rank's own log
("step N/T ... step X ms", every 10th step) written during the window, so the measurement needs
nothing from the controller. Each job is cancelled after its window. Writes REPORT.md with the
micro benchmark's output (furnace_bench_telemetry) when its binary is given.

  python3 bench/telemetry/pause_bench.py --bin build/bin \
      [--micro build/bin/furnace_bench_telemetry] [--window 8] [--pairs 2]

Every program of the build lands in <build>/bin (CMakeLists.txt), furnace_bench_telemetry too.
"""
import argparse
import datetime
import glob
import os
import re
import signal
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "tests", "integration"))
import harness  # noqa: E402

JOB = """name: {name}
kind: train
model: {{vocab: 64, seq_len: 64, d_model: 64, heads: 4, layers: 4, expert_ffn: 128}}
moe: {{experts: 8, top_k: 2, capacity_factor: 0}}
parallel: {{micro_batch: 8, micro_batches: 2}}
train: {{steps: 100000, lr: 3.0e-3, warmup: 20, seed: 1}}
data: {{source: markov, seed: 7}}
recovery: {{max_restarts: 0, heartbeat_timeout_s: 120, hang_timeout_s: 120}}
"""

STEP_LINE = re.compile(r"step (\d+)/\d+ .*? step ([0-9.]+) ms")


def step_times(path, offset):
    with open(path, errors="replace") as f:
        f.seek(offset)
        return [(int(m.group(1)), float(m.group(2))) for m in STEP_LINE.finditer(f.read())]


def one_run(c, label, paused, window):
    job = c.submit(c.write_job(f"{label}.yaml", JOB.format(name=label.lower())))
    c.wait_for(job, lambda d: d["summary"]["state"] == "JOB_RUNNING" and
               int(d["summary"].get("step", 0)) >= 30, timeout=180, what="running")
    log = glob.glob(os.path.join(c.state, "workers", "slot-*", "logs", job, "attempt-1",
                                 "rank-0.log"))[0]
    offset = os.path.getsize(log)
    if paused:
        c.controller.send_signal(signal.SIGSTOP)
    try:
        time.sleep(window)
    finally:
        if paused:
            c.controller.send_signal(signal.SIGCONT)
    samples = step_times(log, offset)
    c.cli("cancel", job)
    c.wait_state(job, harness.FINAL, timeout=60)
    return samples


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--micro", default="")
    ap.add_argument("--window", type=float, default=8.0)
    ap.add_argument("--pairs", type=int, default=2)
    ap.add_argument("--out", default=os.path.join(HERE, "REPORT.md"))
    args = ap.parse_args()
    harness.BIN_DIR = os.path.abspath(args.bin)
    for k, v in (("OPENBLAS_NUM_THREADS", "1"), ("OMP_NUM_THREADS", "1"),
                 ("GOMP_SPINCOUNT", "1000")):
        os.environ[k] = v

    micro = ""
    if args.micro:
        micro = subprocess.run([args.micro], capture_output=True, text=True, check=True).stdout

    c = harness.Cluster(workers=1, worker_timeout=60).start()
    results = []  # (label, paused, [(step, ms)])
    try:
        for i in range(args.pairs):
            for paused in (False, True):
                label = f"{'B-paused' if paused else 'A-normal'}-{i + 1}"
                s = one_run(c, label, paused, args.window)
                results.append((label, paused, s))
                ms = [t for _, t in s]
                print(f"{label}: {len(ms)} logged steps, median "
                      f"{statistics.median(ms) if ms else float('nan'):.1f} ms", flush=True)
    finally:
        c.controller.send_signal(signal.SIGCONT)
        c.close()

    def pooled(p):
        return [t for _, q, s in results if q == p for _, t in s]

    def steps_done(s):
        return s[-1][0] - s[0][0] if len(s) > 1 else 0

    a, b = pooled(False), pooled(True)
    ratio = statistics.median(b) / statistics.median(a)
    commit = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"],
                            capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run(["git", "-C", ROOT, "status", "--porcelain"], capture_output=True,
                           text=True).stdout.strip()
    rows = "\n".join(
        f"| {label} | {'SIGSTOP' if p else 'running'} | {len(s)} | "
        f"{statistics.median([t for _, t in s]):.1f} | {min(t for _, t in s):.1f} - "
        f"{max(t for _, t in s):.1f} | {steps_done(s)} |"
        for label, p, s in results if s)
    text = f"""# Telemetry cost and back-pressure

Does telemetry slow training? Two measurements, both on this machine (2 shared vCPUs), commit
{commit}{' (with uncommitted changes)' if dirty else ''}, {datetime.date.today()}, with
`OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 GOMP_SPINCOUNT=1000` (each rank also pins BLAS to one
thread).

## 1. The per-step record on the rank

```
{args.micro or os.path.join(args.bin, 'furnace_bench_telemetry')}
```
```
{micro.strip() or '(not run: pass --micro)'}
```
The record is what `worker/train_rank.cc` sends each step: a `StepTelemetry` with the loss, timing
and memory figures and, for 4 MoE layers x 8 experts, the imbalance and tokens per expert. "build +
write" is the rank's whole cost (the message, the record, framing, the blocking `write` into the
agent's pipe); a second thread drains and decodes the pipe as the agent does.

## 2. A stopped controller

```
python3 bench/telemetry/pause_bench.py --bin {args.bin}{' --micro ' + args.micro if args.micro else ''} --window {args.window:g} --pairs {args.pairs}
```
The demo model (configs/demo.yaml sizes), one rank on one local worker, A B A B: each run waits
for step 30, then measures {args.window:g} s of the rank's own log (every 10th step logs its step
time) with the controller running (A) or SIGSTOPped for the whole window (B); then the job is
cancelled. The agent's telemetry queue is the default 10000 records.

| run | controller | logged steps | median step (ms) | min - max (ms) | steps in window |
|---|---|---|---|---|---|
{rows}

Median step time, SIGSTOPped / running: **{ratio:.3f}** (pooled medians {statistics.median(b):.1f}
ms / {statistics.median(a):.1f} ms). A ratio near 1 within the min-max spread says a stopped
controller costs the rank nothing measurable: the agent keeps draining the pipe and drops the
oldest records instead of blocking.
"""
    with open(args.out, "w") as f:
        f.write(text)
    print(text)


if __name__ == "__main__":
    main()
