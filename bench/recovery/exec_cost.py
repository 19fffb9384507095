#!/usr/bin/env python3
"""What starting a worker process costs before it does anything: N concurrent execs of
`furnace-worker --help` (as N ranks of a restart start at once), programs of two builds
interleaved, side by side in one run; plus each program's peak resident memory for one exec.

    python3 bench/recovery/exec_cost.py --a OLD_BIN_DIR --b NEW_BIN_DIR [--procs 4] [--reps 10]

Prints the median wall time of the N execs for each build, their ratio (b / a), and the peak RSS.
"""
import argparse
import os
import resource
import statistics
import subprocess
import sys
import time


def peak_rss_kb(exe):
    """Peak resident memory of one `exe --help`, read in a fresh child (RUSAGE_CHILDREN is a max)."""
    code = ("import resource, subprocess, sys; "
            "subprocess.run([sys.argv[1], '--help'], stdout=subprocess.DEVNULL, check=True); "
            "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)")
    return int(subprocess.run([sys.executable, "-c", code, exe], capture_output=True, text=True,
                              check=True).stdout)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--a", required=True, help="the first build's bin directory")
    ap.add_argument("--b", required=True, help="the second build's bin directory")
    ap.add_argument("--procs", type=int, default=4)
    ap.add_argument("--reps", type=int, default=10)
    args = ap.parse_args()
    exes = {"a": os.path.join(args.a, "furnace-worker"), "b": os.path.join(args.b, "furnace-worker")}
    times = {k: [] for k in exes}
    for _ in range(args.reps):
        for name, exe in exes.items():  # interleaved
            t = time.monotonic()
            procs = [subprocess.Popen([exe, "--help"], stdout=subprocess.DEVNULL)
                     for _ in range(args.procs)]
            for p in procs:
                if p.wait() != 0:
                    sys.exit(f"{exe} --help exited {p.returncode}")
            times[name].append(time.monotonic() - t)
    for name, exe in exes.items():
        print(f"{name} ({exe}): median {statistics.median(times[name]):.3f} s for {args.procs} "
              f"concurrent execs over {args.reps} reps; peak RSS of one {peak_rss_kb(exe) / 1024:.0f} MB")
    print(f"b / a: {statistics.median(times['b']) / statistics.median(times['a']):.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
