#!/usr/bin/env python3
"""Renders bench_parm's JSON results side by side as the Markdown tables of REPORT.md.

    python3 bench/parm/report_tables.py bench/parm/results/nodes1.json \
        bench/parm/results/nodes2-1gbit.json bench/parm/results/nodes2-300mbit.json

Per config and run: deepspeed's median fwd+bwd time, s1/ds, s2/ds, auto's pick, auto/ds and
auto/best (ratios of medians measured side by side in one run); then each run's summary.
"""
import json
import sys


def label(run):
    return "1 node (loopback)" if run["nodes"] == 1 else f"2 nodes, {run['link']}"


def main(paths):
    runs = [json.load(open(p)) for p in paths]
    head = "| layout tp,ep,esp | N | C | f | E | k |"
    rule = "|---|---|---|---|---|---|"
    for run in runs:
        head += f" {label(run)}: ds ms | s1/ds | s2/ds | auto | auto/ds | auto/best |"
        rule += "---|---|---|---|---|---|"
    print(head)
    print(rule)
    for li, layout in enumerate(runs[0]["layouts"]):
        for ci, c in enumerate(layout["configs"]):
            line = (f"| {layout['tp']},{layout['ep']},{layout['esp']} | {c['N']} | {c['C']} | "
                    f"{c['f']} | {c['E']} | {c['k']} |")
            for run in runs:
                rc = run["layouts"][li]["configs"][ci]
                ds = rc["schedules"]["deepspeed"]["fwd_bwd_s"]["median"] * 1e3
                slow = " **!**" if rc["ratio_auto_ds"] > 1 + run["summary"]["noise_margin"] else ""
                line += (f" {ds:.1f} | {rc['ratio_s1_ds']:.2f} | {rc['ratio_s2_ds']:.2f} | "
                         f"{rc['auto']} | {rc['ratio_auto_ds']:.2f}{slow} | "
                         f"{rc['ratio_auto_best']:.2f} |")
            print(line)
    print()
    print("| run | configs | auto > ds by >3% | auto within 5% of best | auto = best | "
          "best Parm / ds (min .. max, median) | median abs. prediction error (fwd+bwd, fwd, bwd) |")
    print("|---|---|---|---|---|---|---|")
    for run in runs:
        s = run["summary"]
        sp = s["speedup_best_parm_over_deepspeed"]
        print(f"| {label(run)} | {s['configs']} | {s['auto_slower_than_deepspeed']} | "
              f"{s['auto_within_5pct_of_best']} ({100 * s['auto_within_5pct_of_best_fraction']:.0f}%) | "
              f"{s['auto_is_measured_best']} | {sp['min']:.2f}x .. {sp['max']:.2f}x "
              f"({sp['median']:.2f}x) | {100 * s['median_abs_prediction_error']:.0f}%, "
              f"{100 * s['median_abs_prediction_error_fwd']:.0f}%, "
              f"{100 * s['median_abs_prediction_error_bwd']:.0f}% |")
    print()
    print("| run | " + " | ".join(runs[0]["summary"]["speedup_by_layout"].keys()) + " |")
    print("|---|" + "---|" * len(runs[0]["summary"]["speedup_by_layout"]))
    for run in runs:
        cells = [f"{v['min']:.2f}x .. {v['max']:.2f}x" for v in
                 run["summary"]["speedup_by_layout"].values()]
        print(f"| {label(run)} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main(sys.argv[1:])
