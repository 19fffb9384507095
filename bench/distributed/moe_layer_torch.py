#!/usr/bin/python3
"""PyTorch peer of bench_moe_layer: one expert-parallel MoE layer, forward + backward, per EP rank.

The layer (MODEL.md "The MoE layer", the same math as runtime/model/moe_block.cc):
    u = LayerNorm(x); p = softmax(u @ Wg); top-k -> gates (renormalised over the k when k > 1);
    dropless dispatch: the N*k (token, choice) rows sorted by expert; the per-expert counts
    exchanged with all_to_all_single, then the rows with all_to_all_single and uneven split sizes
    (torch.distributed.nn.functional's autograd-aware version, so backward runs the reverse
    all-to-all); this rank's E/ep experts: GELU(tanh)(x W1 + b1) W2 + b2, one GEMM pair per expert;
    all-to-all back; weighted combine (index_add of gate * row); residual; the Switch aux loss.
Backward: d loss / d out = a fixed random (B, T, C) tensor, d loss / d aux = 1 (what
bench_moe_layer feeds MoeBlockBackward). Gradients reach x, the LN, the router and the experts.

One process per EP rank (torch.multiprocessing, gloo over 127.0.0.1 through a FileStore). Per
repetition: a barrier, then forward and backward, each timed on every rank; a repetition's time is
the slowest rank's (all_reduce MAX). Rank 0 prints one JSON object shaped like bench_moe_layer's.

Pin the pools before the process starts (BENCHMARKING.md):
    OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 GOMP_SPINCOUNT=1000 \
        /usr/bin/python3 bench/distributed/moe_layer_torch.py --ep 2
"""
import argparse
import json
import math
import os
import statistics
import tempfile
import time

import torch
import torch.distributed as dist
import torch.distributed.nn.functional as dnn
import torch.multiprocessing as mp
import torch.nn.functional as F

LN_EPS = 1e-5


def make_params(a, rank):
    """LN, router (whole) and this rank's E/ep experts; normal(0, 0.02), LN weight 1, biases 0."""
    C, E, f, El = a.d_model, a.experts, a.expert_ffn, a.experts // a.ep
    g = torch.Generator().manual_seed(a.seed)
    P = dict(ln_w=torch.ones(C), ln_b=torch.zeros(C), wg=torch.randn(C, E, generator=g) * 0.02,
             w1=torch.empty(El, C, f), b1=torch.zeros(El, f), w2=torch.empty(El, f, C),
             b2=torch.zeros(El, C))
    for le in range(El):
        ge = torch.Generator().manual_seed(a.seed * 1000 + rank * El + le + 1)
        P["w1"][le] = torch.randn(C, f, generator=ge) * 0.02
        P["w2"][le] = torch.randn(f, C, generator=ge) * 0.02
    for t in P.values():
        t.requires_grad_(True)
    return P


def moe_layer(x, P, a):
    """x: (N, C) -> (out (N, C), aux scalar)."""
    N, C = x.shape
    E, k, ep = a.experts, a.top_k, a.ep
    El = E // ep
    u = F.layer_norm(x, (C,), P["ln_w"], P["ln_b"], LN_EPS)
    probs = torch.softmax(u @ P["wg"], dim=-1)                        # (N, E)
    top, idx = probs.topk(k, dim=-1)                                  # (N, k)
    gates = top / top.sum(-1, keepdim=True) if k > 1 else top
    flat = idx.reshape(-1)                                            # (N*k) choice n*k + j
    order = torch.argsort(flat, stable=True)                          # grouped by expert
    counts = torch.bincount(flat, minlength=E)                        # (E)
    rows = u.index_select(0, order // k)                              # (S, C), S = N*k

    if ep > 1:
        # counts_in[s, le]: rows EP source s sends to my local expert le.
        counts_in = torch.empty_like(counts)
        dist.all_to_all_single(counts_in, counts)
        counts_in = counts_in.view(ep, El)
        send = counts.view(ep, El).sum(1).tolist()
        recv = counts_in.sum(1).tolist()
        got = dnn.all_to_all_single(rows.new_empty(sum(recv), C), rows, recv, send)  # (A, C)
        # Received order (source, local expert) -> expert order (local expert, source).
        starts = torch.cumsum(counts_in.reshape(-1), 0) - counts_in.reshape(-1)
        perm = torch.cat([torch.arange(int(starts[s * El + le]),
                                       int(starts[s * El + le]) + int(counts_in[s, le]))
                          for le in range(El) for s in range(ep)])
        xe = got.index_select(0, perm)
        per_expert = counts_in.sum(0).tolist()
    else:
        xe, per_expert = rows, counts.tolist()

    outs, at = [], 0
    for le in range(El):
        n = per_expert[le]
        h = F.gelu(xe[at:at + n] @ P["w1"][le] + P["b1"][le], approximate="tanh")
        outs.append(h @ P["w2"][le] + P["b2"][le])
        at += n
    ye = torch.cat(outs)                                              # (R, C) expert order

    if ep > 1:
        back_in = torch.empty_like(ye).index_copy(0, perm, ye)        # received order
        back = dnn.all_to_all_single(rows.new_empty(rows.shape[0], C), back_in, send, recv)
    else:
        back = ye
    w = gates.reshape(-1).index_select(0, order)                      # (S)
    combined = torch.zeros_like(x).index_add(0, order // k, back * w[:, None])
    frac = counts.to(probs.dtype) / (k * N)
    aux = a.aux_alpha * E * (frac * probs.mean(0)).sum()
    return x + combined, aux


def run_rank(rank, a, store_path):
    torch.set_num_threads(a.threads)
    dist.init_process_group("gloo", init_method="file://" + store_path, rank=rank,
                            world_size=a.ep)
    N = a.batch * a.seq_len
    g = torch.Generator().manual_seed(a.seed * 7919 + rank)
    x0 = torch.randn(N, a.d_model, generator=g)
    dout = torch.randn(N, a.d_model, generator=g) / math.sqrt(N * a.d_model)
    P = make_params(a, rank)
    fwd, bwd = [], []
    for r in range(a.warmup + a.reps):
        for t in P.values():
            t.grad = None
        x = x0.clone().requires_grad_(True)
        if a.ep > 1:
            dist.barrier()
        t0 = time.perf_counter()
        out, aux = moe_layer(x, P, a)
        t1 = time.perf_counter()
        torch.autograd.backward([out, aux], [dout, torch.ones(())])
        t2 = time.perf_counter()
        if r >= a.warmup:
            fwd.append(t1 - t0)
            bwd.append(t2 - t1)
    times = torch.tensor([fwd, bwd, [f + b for f, b in zip(fwd, bwd)]], dtype=torch.float64)
    if a.ep > 1:
        dist.all_reduce(times, op=dist.ReduceOp.MAX)
    if rank == 0:
        def summary(v):
            return dict(median=statistics.median(v), min=min(v), max=max(v))
        env = {v: os.environ.get(v) for v in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS",
                                               "GOMP_SPINCOUNT")}
        print(json.dumps(dict(
            impl="pytorch", torch=torch.__version__, ep=a.ep,
            shape=dict(d_model=a.d_model, experts=a.experts, top_k=a.top_k,
                       expert_ffn=a.expert_ffn, seq_len=a.seq_len, batch=a.batch),
            reps=a.reps, warmup=a.warmup, threads=a.threads,
            fwd_bwd_s=summary(times[2].tolist()), fwd_s=summary(times[0].tolist()),
            bwd_s=summary(times[1].tolist()), env=env)), flush=True)
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ep", type=int, default=1)
    ap.add_argument("--d_model", type=int, default=256)
    ap.add_argument("--experts", type=int, default=8)
    ap.add_argument("--top_k", type=int, default=2)
    ap.add_argument("--expert_ffn", type=int, default=512)
    ap.add_argument("--seq_len", type=int, default=128)
    ap.add_argument("--batch", type=int, default=8, help="B per rank")
    ap.add_argument("--aux_alpha", type=float, default=0.01)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1, help="torch threads per rank")
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    if a.experts % a.ep:
        ap.error("ep must divide experts")
    with tempfile.TemporaryDirectory(prefix="moe_layer_torch.") as d:
        mp.spawn(run_rank, args=(a, os.path.join(d, "store")), nprocs=a.ep, join=True)


if __name__ == "__main__":
    main()
