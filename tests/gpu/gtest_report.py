#!/usr/bin/env python3
"""The gpu tests' table for tests/gpu/run.sh --bundle: reads the gtest XML files the bundle's test
executables wrote (--gtest_output=xml) and prints a count line and one markdown row per test case
(passed, failed, or skipped with GTEST_SKIP's reason). With --gpu (the machine has one), a case
that skipped saying "no GPU" failed: CUDA could not use the GPU. Exit status 1 when a case failed
or no case was found at all. An argument ending in .log is the output of an executable that wrote
no XML (killed by its time limit, or crashed): its cases are read from gtest's [ OK ], [ FAILED ]
and [ SKIPPED ] lines, and the one still running when it died counts as failed."""
import re
import sys
import xml.etree.ElementTree as ET

RUN = re.compile(r"^\[ RUN      \] (\S+)")
DONE = re.compile(r"^\[\s*(OK|FAILED|SKIPPED)\s*\] (\S+)(?: \((\d+) ms\))?")


def rows_from_log(path):
    """(name, result, seconds, note) of each case a gtest executable's output shows."""
    rows, running = [], None
    try:
        lines = open(path, encoding="utf-8", errors="replace").read().splitlines()
    except OSError:
        return rows
    for line in lines:
        started = RUN.match(line)
        if started:
            running = started.group(1)
            continue
        done = DONE.match(line)
        # Only the line that ends the case running (not gtest's closing list of failures).
        if done and done.group(2) == running:
            result = {"OK": "passed", "FAILED": "failed", "SKIPPED": "skipped"}[done.group(1)]
            ms = done.group(3)
            rows.append((running, result, f"{int(ms) / 1000:.3f}" if ms else "", "from its log"))
            running = None
    if running is not None:
        rows.append((running, "failed", "", "still running when the executable ended (no XML)"))
    return rows


def main(args):
    gpu_present = "--gpu" in args
    paths = [a for a in args if a != "--gpu"]
    rows, counts = [], {"passed": 0, "failed": 0, "skipped": 0}
    for path in paths:
        if path.endswith(".log"):
            for name, result, secs, why in rows_from_log(path):
                counts[result] += 1
                rows.append((name, result, secs, why))
            continue
        try:
            root = ET.parse(path).getroot()
        except (ET.ParseError, FileNotFoundError, OSError):
            continue
        for case in root.iter("testcase"):
            why = ""
            if case.find("failure") is not None or case.find("error") is not None:
                result = "failed"
            elif case.get("result") == "skipped" or case.find("skipped") is not None:
                result = "skipped"
                skipped = case.find("skipped")
                lines = (skipped.get("message", "") if skipped is not None else "").strip()
                lines = [line for line in lines.splitlines() if line.strip()]
                why = lines[-1][:120].replace("|", "/") if lines else ""
            else:
                result = "passed"
            if result == "skipped" and gpu_present and why.startswith("no GPU"):
                result, why = "failed", "said no GPU on a machine with one: " + why
            counts[result] += 1
            rows.append((f"{case.get('classname')}.{case.get('name')}", result,
                         case.get("time", ""), why))
    print(f"\n{counts['passed']} passed, {counts['failed']} failed, {counts['skipped']} skipped "
          f"of {len(rows)}.\n")
    if rows:
        print("| test | result | seconds | note |\n|---|---|---|---|")
        for name, result, secs, why in rows:
            shown = "**failed**" if result == "failed" else result
            print(f"| {name} | {shown} | {secs} | {why} |")
    return 1 if counts["failed"] or not rows else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
