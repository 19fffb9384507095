#!/usr/bin/env python3
"""Recovery time by phase: SIGKILL a rank of the local demo job (configs/demo.yaml: 4 ranks,
dp 4, ep 4, a checkpoint every 50 steps) through a real controller and 4 local worker daemons,
and measure from the kill to the first completed step of the next attempt.

    python3 bench/recovery/recovery_time.py --bin build/bin [--reps 3] [--kill-after 55]
        [--variant fast:recovery.backoff.initial_s=0.1] [--json FILE]

Each repetition is a fresh job (so every recovery is a first restart, with the same backoff): it
runs past its first checkpoint (--kill-after steps), rank --rank is SIGKILLed, and the job is
cancelled once the next attempt has completed a step. Reported per repetition: the wall time from
the kill until `furnace status` shows the recovery (polled every 0.1 s, so up to ~0.2 s late),
the controller's phases (AttemptInfo.recovery: detection, teardown, backoff, placement,
start, rendezvous, setup, checkpoint load, first step; teardown and backoff overlap) and the
first attempt's setup phase, then the median of each. The ranks get a cache directory of the
benchmark's own (XDG_CACHE_HOME), where the first rank to start measures the machine's SGEMM peak
(worker/train_rank.cc PeakFlops) and every later attempt reads it back. --variant NAME:KEY=VALUE[,KEY=VALUE] also runs the demo with its YAML edited
(KEY dotted: section.field or section.field.subfield), interleaved with the default, side by side;
the key bench.drop_peak_cache=1 instead deletes that cached peak right after the kill, so the
restart measures it again (the behaviour before the cache).
"""
import argparse
import glob
import json
import os
import re
import shutil
import signal
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tests", "integration"))
import harness  # noqa: E402

PHASES = ("detection", "teardown", "backoff", "placement", "start", "rendezvous", "setup",
          "checkpoint_load", "first_step")


def demo_yaml(name, max_restarts, overrides):
    """configs/demo.yaml with its name, a restart budget and `overrides` {"a.b": "v"} applied."""
    with open(os.path.join(ROOT, "configs", "demo.yaml")) as f:
        text = f.read()
    text = re.sub(r"(?m)^name: .*$", f"name: {name}", text)
    sections = {}
    for key, value in overrides.items():
        top, _, rest = key.partition(".")
        sections.setdefault(top, []).append((rest, value))
    sections.setdefault("recovery", []).append(("max_restarts", str(max_restarts)))
    for top, items in sections.items():
        # Each override becomes a line of its own at the end of the section (YAML: the last wins
        # is not allowed, so existing keys are removed first).
        lines = []
        for rest, value in items:
            parts = rest.split(".")
            text = re.sub(rf"(?m)^  {re.escape(parts[0])}:.*\n", "", text) if len(parts) == 1 \
                else text
            if len(parts) == 1:
                lines.append(f"  {parts[0]}: {value}")
            else:
                lines.append(f"  {parts[0]}: {{{parts[1]}: {value}}}")
        block = "\n".join(lines) + "\n"
        if re.search(rf"(?m)^{top}:\s*$", text):
            text = re.sub(rf"(?m)^{top}:\s*\n", f"{top}:\n{block}", text, count=1)
        else:
            text += f"\n{top}:\n{block}"
    return text


def one(cluster, name, args, overrides):
    overrides = dict(overrides)
    drop_peak_cache = overrides.pop("bench.drop_peak_cache", "0") == "1"
    job = cluster.submit(cluster.write_job(f"{name}.yaml", demo_yaml(name, 2, overrides)))
    d = cluster.wait_for(job, lambda d: d["summary"]["state"] == "JOB_RUNNING" and
                         int(d["summary"].get("step", 0)) >= args.kill_after, timeout=600,
                         what=f"{name} past step {args.kill_after}")
    pid = int(d["attempts"][0]["ranks"][args.rank]["pid"])
    t_kill = time.time()
    os.kill(pid, signal.SIGKILL)
    if drop_peak_cache:  # the restart measures the SGEMM peak again, as every restart used to
        cached = glob.glob(os.path.join(os.environ["XDG_CACHE_HOME"], "furnace", "peak_flops.*"))
        if not cached:
            raise SystemExit("bench.drop_peak_cache: no cached SGEMM peak under "
                             f"{os.environ['XDG_CACHE_HOME']}/furnace to delete; has "
                             "worker/train_rank.cc's PeakFlops moved it?")
        for path in cached:
            os.remove(path)
    d = cluster.wait_for(job, lambda d: len(d["attempts"]) >= 2 and "recovery" in d["attempts"][1],
                         timeout=300, what=f"{name}: the next attempt's first step")
    wall = time.time() - t_kill
    cluster.cli("cancel", job)
    p = d["attempts"][1]["recovery"]
    row = {"wall_s": wall, "total_s": float(p.get("total_s", 0)), "dominant": p.get("dominant")}
    # What the first attempt's setup took (the first job's measured the SGEMM peak).
    a1 = d["attempts"][0]
    row["first_attempt_setup_s"] = float(a1.get("setup_unix", 0)) - float(a1.get("rendezvous_unix", 0))
    for phase in PHASES:
        row[phase] = float(p.get(f"{phase}_s", 0))
    cluster.wait_for(job, lambda d: all(r["state"] == "RANK_STATE_EXITED"
                                        for a in d["attempts"] for r in a["ranks"]),
                     timeout=60, what=f"{name}: every rank ended")
    cluster.wait_workers(4, timeout=60)
    return row


def parse_variants(args):
    variants = [("default", {})]
    for v in args.variant:
        name, _, kvs = v.partition(":")
        variants.append((name, dict(kv.split("=", 1) for kv in kvs.split(",") if kv)))
    return variants


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bin", default=os.path.join(ROOT, "build", "bin"))
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--kill-after", type=int, default=55)
    ap.add_argument("--rank", type=int, default=2)
    ap.add_argument("--variant", action="append", default=[],
                    help="NAME:KEY=VALUE[,KEY=VALUE]: also run the demo with these edits")
    ap.add_argument("--json")
    args = ap.parse_args()
    harness.BIN_DIR = os.path.abspath(args.bin)
    # The ranks' SGEMM peak cache (worker/train_rank.cc PeakFlops): the benchmark's own, so that
    # bench.drop_peak_cache deletes nothing of the user's and every run starts alike.
    cache = tempfile.mkdtemp(prefix="furnace-bench-cache-")
    os.environ["XDG_CACHE_HOME"] = cache
    cluster = harness.Cluster(workers=4).start()
    variants = parse_variants(args)
    rows = {name: [] for name, _ in variants}
    try:
        for rep in range(args.reps):
            for name, overrides in variants:  # interleaved: side by side in one run
                job_name = re.sub(r"[^a-z0-9_-]", "-", f"rec-{name}-{rep}".lower())
                row = one(cluster, job_name, args, overrides)
                rows[name].append(row)
                print(f"rep {rep} {name}: kill -> first step {row['wall_s']:.2f} s (controller "
                      f"{row['total_s']:.2f} s): " +
                      ", ".join(f"{ph} {row[ph]:.2f}" for ph in PHASES) +
                      f"; longest {row['dominant']} (first attempt's setup "
                      f"{row['first_attempt_setup_s']:.2f} s)", flush=True)
    finally:
        cluster.close()
        shutil.rmtree(cache, ignore_errors=True)
    out = {}
    for name, rs in rows.items():
        med = {k: sorted(r[k] for r in rs)[len(rs) // 2] for k in rs[0] if k != "dominant"}
        med["dominant"] = max(PHASES, key=lambda ph: med[ph])
        out[name] = {"median": med, "reps": rs}
        print(f"{name}: median kill -> first step {med['wall_s']:.2f} s (controller "
              f"{med['total_s']:.2f} s; goal <= 10 s: {'met' if med['wall_s'] <= 10 else 'NOT met'})"
              f"; " + ", ".join(f"{ph} {med[ph]:.2f}" for ph in PHASES) +
              f"; longest {med['dominant']}; first attempt's setup "
              f"{med['first_attempt_setup_s']:.2f} s")
    if len(out) > 1:
        base = out["default"]["median"]["wall_s"]
        for name in out:
            print(f"{name}: {out[name]['median']['wall_s'] / base:.2f}x the default's time")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"date": time.strftime("%Y-%m-%d %H:%M"), "reps": args.reps,
                       "kill_after": args.kill_after, "rank": args.rank, "variants": out}, f,
                      indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
