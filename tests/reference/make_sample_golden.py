#!/usr/bin/python3
"""Writes tests/reference/golden_sample.safetensors: a small model, a prompt and its greedy
continuation, computed by gpt_moe.py (MODEL.md in PyTorch) with no key-value cache.

    /usr/bin/python3 tests/reference/make_sample_golden.py [--out-dir DIR]

Greedy decoding here is the plain definition: after each new token the whole sequence runs
through gpt_moe.forward again (float64 math on float32-rounded parameters), and the next token is
the argmax of the last position's logits. The C++ test (tests/runtime/model/generate_golden_test.cc
and the CLI's sample test) must reproduce the continuation token for token with its key-value cache.
Deterministic; the seed is the first one from a fixed start for which every decision is far from a
tie (fp32 round-off cannot flip it): every step's top-1 minus top-2 logit, and every MoE routing
margin (k-th minus (k+1)-th probability) over every token of the final sequence, are >= MIN_MARGIN.

Tensors: every parameter (MODEL.md names, F32), `prompt` [P], `greedy` [N] (the continuation;
token ids stored as F32, exact), `logits` F32 [P + N, V] (the full forward's logits of prompt + continuation).
Metadata: `furnace.model` and `furnace.moe` as `furnace export` writes them (JSON of the job spec's
ModelSpec and MoeSpec, proto field names), so `furnace sample --weights` reads the file as it is.
"""
import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpt_moe  # noqa: E402
from make_golden import read_safetensors, write_safetensors  # noqa: E402

CFG = dict(vocab=64, seq_len=32, d_model=32, heads=4, layers=2, moe_every=2, dense_ffn=64,
           experts=4, top_k=2, expert_ffn=48, capacity_factor=0.0, normalize_topk=True,
           aux_alpha=0.01)
PROMPT_TOKENS = 6
NEW_TOKENS = 20
MIN_MARGIN = 1e-4  # fp32 round-off of these logits and probabilities is ~1e-6 at most
ROUTER_STD = 0.5   # uneven routing, so the experts' choice matters


def greedy(P, cfg, prompt, n):
    """(continuation, smallest top-1 minus top-2 logit margin over the steps)."""
    seq = prompt.clone()
    margin = float("inf")
    with torch.no_grad():
        for _ in range(n):
            logits = gpt_moe.forward(P, cfg, seq[None, :])["logits"][0, -1]
            top = logits.sort(descending=True).values
            margin = min(margin, (top[0] - top[1]).item())
            nxt = int(logits.argmax())  # ties cannot occur: the margin check below
            seq = torch.cat([seq, torch.tensor([nxt], dtype=seq.dtype)])
    return seq[len(prompt):], margin


def make(seed):
    cfg = gpt_moe.finalize_config(CFG)
    gen = torch.Generator().manual_seed(seed)
    P = gpt_moe.init_params(cfg, gen, dtype=torch.float64, nontrivial=True)
    # Weights at the scale of a trained model rather than of MODEL.md's init: with init-scale
    # weights the tied head makes every token predict itself and greedy repeats one token.
    for name in P:
        std = None
        if name.endswith("moe.router"):
            std = ROUTER_STD
        elif name in ("wte", "wpe"):
            std = 0.5
        elif name.endswith((".w1", ".w2", "attn.wqkv", "attn.wo")):
            std = 0.3
        if std is not None:
            P[name] = torch.randn(P[name].shape, generator=gen, dtype=torch.float64) * std
    P = {k: v.to(torch.float32).to(torch.float64) for k, v in P.items()}
    prompt = torch.randint(0, cfg["vocab"], (PROMPT_TOKENS,), generator=gen, dtype=torch.int64)
    cont, logit_margin = greedy(P, cfg, prompt, NEW_TOKENS)
    stats = []
    with torch.no_grad():
        full = gpt_moe.forward(P, cfg, torch.cat([prompt, cont])[None, :], stats=stats)["logits"][0]
    route_margin = min(s["min_route_margin"] for s in stats)
    return cfg, P, prompt, cont, full, logit_margin, route_margin


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out-dir", default=os.path.dirname(os.path.abspath(__file__)))
    args = ap.parse_args()
    torch.manual_seed(0)
    for seed in range(3000, 3200):
        cfg, P, prompt, cont, full, logit_margin, route_margin = make(seed)
        distinct = len(set(cont.tolist())) >= 8  # not one token repeated: the cache matters
        if logit_margin >= MIN_MARGIN and route_margin >= MIN_MARGIN and distinct:
            break
    else:
        raise SystemExit("no seed found")

    # The greedy continuation again from the full forward's logits: each position's argmax is the
    # next token (a self-check of the loop above).
    seq = torch.cat([prompt, cont])
    assert torch.equal(full[PROMPT_TOKENS - 1:-1].argmax(-1), cont), "greedy self-check failed"

    model = {"vocab": cfg["vocab"], "seq_len": cfg["seq_len"], "d_model": cfg["d_model"],
             "heads": cfg["heads"], "layers": cfg["layers"], "dense_ffn": cfg["dense_ffn"],
             "moe_every": cfg["moe_every"], "expert_ffn": cfg["expert_ffn"]}
    moe = {"experts": cfg["experts"], "top_k": cfg["top_k"],
           "capacity_factor": cfg["capacity_factor"], "normalize_topk": cfg["normalize_topk"],
           "aux_alpha": cfg["aux_alpha"]}
    meta = {"format": "pt", "furnace.model": json.dumps(model, separators=(",", ":")),
            "furnace.moe": json.dumps(moe, separators=(",", ":")), "seed": seed,
            "min_logit_margin": "%.3e" % logit_margin, "min_route_margin": "%.3e" % route_margin,
            "generator": "tests/reference/make_sample_golden.py (float64 math, stored float32)"}
    tensors = [(k, v.float()) for k, v in P.items()]
    # Token ids as F32 (exact below 2^24): Furnace's safetensors reader (and so `furnace sample
    # --weights`) reads F32 only.
    tensors += [("prompt", prompt.float()), ("greedy", cont.float()), ("logits", full.float())]
    path = os.path.join(args.out_dir, "golden_sample.safetensors")
    write_safetensors(path, tensors, meta)
    back, bmeta = read_safetensors(path)
    for n, t in tensors:
        assert torch.equal(back[n], t.detach().cpu()), n
    assert bmeta == {k: str(v) for k, v in meta.items()}
    print("== %s (%d bytes, seed %d)" % (path, os.path.getsize(path), seed))
    print("   prompt   %s" % prompt.tolist())
    print("   greedy   %s" % cont.tolist())
    print("   min top-1 - top-2 logit margin %.3e, min routing margin %.3e (>= %g)  OK"
          % (logit_margin, route_margin, MIN_MARGIN))


if __name__ == "__main__":
    main()
