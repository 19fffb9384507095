#!/usr/bin/env python3
"""Checks that every CUDA kernel of kernels/cuda is in its file's FURNACE_PRELOAD_KERNELS list.

PreloadKernels (kernels/cuda/common.h) loads the kernels listed there before a rank's first
collective; a kernel left out is loaded lazily at its first launch, which can hang behind an NCCL
kernel waiting for a peer. Reads the sources only (no build, no GPU): for each .cu, the names of
its __global__ functions and the names in its FURNACE_PRELOAD_KERNELS(...) (a template kernel:
each instantiation listed, e.g. Kernel<float>). Prints each kernel missing from its list, and
each listed name that is no kernel of the file, and exits 1 if there is any. A template kernel
counts as listed with any one instantiation: which others a launcher uses is not in the source
text (a new instantiation must be added to the list by hand). Kernels launched through CUB have no
name in the file to list: a .cu that includes a CUB header must register a FURNACE_PRELOAD_HOOK,
which loads them by running them (kernels/cuda/common.cuh).

Usage: check_preload_list.py [--root DIR]   (DIR: the repository root; default: three levels up)
"""

import argparse
import glob
import os
import re
import sys

KERNEL = re.compile(r"__global__\s+(?:__launch_bounds__\s*\([^)]*\)\s*)?void\s+"
                    r"(?:__launch_bounds__\s*\([^)]*\)\s*)?(\w+)\s*\(")
LIST = re.compile(r"FURNACE_PRELOAD_KERNELS\(([^;]*)\);", re.S)
CUB = re.compile(r"#include\s*<cub/")
HOOK = re.compile(r"FURNACE_PRELOAD_HOOK\(\s*\w+\s*\);")


def problems(path, text):
    kernels = set(KERNEL.findall(text))
    lists = LIST.findall(text)
    listed = set()
    for body in lists:
        for item in body.split(","):
            item = " ".join(item.split())
            if item:
                listed.add(re.sub(r"<.*>$", "", item).strip())
    out = []
    name = os.path.relpath(path)
    if kernels and len(lists) != 1:
        out.append(f"{name}: {len(lists)} FURNACE_PRELOAD_KERNELS lists (want exactly one)")
    for k in sorted(kernels - listed):
        out.append(f"{name}: kernel {k} is not in FURNACE_PRELOAD_KERNELS (it would load lazily)")
    for k in sorted(listed - kernels):
        out.append(f"{name}: FURNACE_PRELOAD_KERNELS lists {k}, which is no kernel of this file")
    if CUB.search(text) and not HOOK.search(text):
        out.append(f"{name}: includes CUB but registers no FURNACE_PRELOAD_HOOK (CUB's kernels "
                   "would load lazily)")
    return out


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--root", default=os.path.join(os.path.dirname(__file__), "..", "..", ".."))
    args = parser.parse_args()
    files = sorted(glob.glob(os.path.join(args.root, "kernels", "cuda", "*.cu")))
    if not files:
        print(f"no kernels/cuda/*.cu under {args.root}", file=sys.stderr)
        return 1
    found = []
    count = 0
    for path in files:
        with open(path, encoding="utf-8") as f:
            text = f.read()
        count += len(KERNEL.findall(text))
        found += problems(path, text)
    for line in found:
        print(line)
    if count == 0:
        print("no __global__ kernel found: the pattern no longer matches the sources")
        return 1
    print(f"{len(files)} files, {count} kernels: "
          f"{'every one listed' if not found else f'{len(found)} problems'}")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
