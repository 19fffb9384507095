#!/usr/bin/python3
"""Correctness check of moe_layer_torch.py's expert-parallel path (not a benchmark).

Runs the layer with ep=2 (two gloo processes, small shapes), then the same tokens through the
ep=1 path with both ranks' experts in one process, and prints the largest differences of the
output, the input gradient, the expert w1 gradients and the router gradient (summed over the two
ranks, as the data-parallel all-reduce would). All should be fp32 roundoff (~1e-7).

    OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 GOMP_SPINCOUNT=1000 \
        /usr/bin/python3 bench/distributed/moe_layer_torch_check.py
"""
import os
import sys
import tempfile
from types import SimpleNamespace

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import moe_layer_torch as M  # noqa: E402

N, C = 32, 32


def args(ep):
    return SimpleNamespace(ep=ep, d_model=C, experts=8, top_k=2, expert_ffn=16, seq_len=8, batch=4,
                           aux_alpha=0.01, seed=3, threads=1)


def inputs(rank):
    x = torch.randn(N, C, generator=torch.Generator().manual_seed(rank)).requires_grad_(True)
    dout = torch.randn(N, C, generator=torch.Generator().manual_seed(10 + rank))
    return x, dout


def rank_fn(rank, d):
    a = args(2)
    dist.init_process_group("gloo", init_method="file://" + d + "/store", rank=rank, world_size=2)
    P = M.make_params(a, rank)
    x, dout = inputs(rank)
    out, aux = M.moe_layer(x, P, a)
    torch.autograd.backward([out, aux], [dout, torch.ones(())])
    torch.save(dict(out=out.detach(), dx=x.grad, w1=P["w1"].grad, wg=P["wg"].grad),
               "%s/r%d.pt" % (d, rank))
    dist.destroy_process_group()


def main():
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as d:
        mp.spawn(rank_fn, args=(d,), nprocs=2, join=True)
        got = [torch.load("%s/r%d.pt" % (d, r)) for r in range(2)]
        P0, P1 = M.make_params(args(2), 0), M.make_params(args(2), 1)
    full = {k: (torch.cat([P0[k], P1[k]]) if k in ("w1", "b1", "w2", "b2") else P0[k])
            .detach().requires_grad_(True) for k in P0}
    worst = dict(out=0.0, dx=0.0)
    for r in range(2):
        x, dout = inputs(r)
        out, aux = M.moe_layer(x, full, args(1))
        torch.autograd.backward([out, aux], [dout, torch.ones(())])
        worst["out"] = max(worst["out"], (out.detach() - got[r]["out"]).abs().max().item())
        worst["dx"] = max(worst["dx"], (x.grad - got[r]["dx"]).abs().max().item())
    worst["w1_grad"] = (full["w1"].grad - torch.cat([got[0]["w1"], got[1]["w1"]])).abs().max().item()
    worst["router_grad"] = (full["wg"].grad - got[0]["wg"] - got[1]["wg"]).abs().max().item()
    print(" ".join("%s %.1e" % kv for kv in worst.items()))
    ok = all(v < 1e-5 for v in worst.values())
    print("ep=2 matches ep=1" if ok else "MISMATCH")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
