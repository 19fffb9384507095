#!/usr/bin/python3
"""PyTorch peer benchmark: MODEL.md's MoE GPT trained with AdamW, eager fp32 on CPU.

The model is tests/reference/gpt_moe.py (the independent PyTorch implementation of MODEL.md that
produces the golden files), run with torch's fused ops (F.layer_norm, F.gelu(tanh)) and the
gather-style MoE (each expert computes only its routed tokens; dropless by default).
Per step: zero grads, forward, backward of (cross-entropy + aux), global-norm clip (1.0),
AdamW (beta 0.9/0.95, eps 1e-8, weight decay 0.1 on 2-D params only), LR warm-up + cosine.

Run with the thread pools pinned BEFORE the process starts (see /work/shared/BENCHMARKING.md):

    OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 GOMP_SPINCOUNT=1000 \
        /usr/bin/python3 bench/pytorch/moe_train_bench.py --threads 1

--config overrides sizes, as JSON ('{"d_model": 128}') or key=value pairs ('d_model=128,layers=2';
the flag may be repeated). Keys: vocab seq_len d_model heads layers moe_every dense_ffn experts
top_k expert_ffn capacity_factor normalize_topk aux_alpha batch.
Prints one JSON object on stdout (warnings go to stderr).
"""
import argparse
import json
import math
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "tests", "reference"))


def parse_config(items):
    over = {}
    for s in items or []:
        s = s.strip()
        if s.startswith("{"):
            over.update(json.loads(s))
            continue
        for kv in s.split(","):
            if not kv.strip():
                continue
            k, v = kv.split("=", 1)
            k, v = k.strip(), v.strip()
            if v.lower() in ("true", "false"):
                over[k] = v.lower() == "true"
            else:
                try:
                    over[k] = int(v)
                except ValueError:
                    over[k] = float(v)
    return over


def check_env(threads):
    """Warn (stderr) unless the BLAS/OpenMP pools are pinned as BENCHMARKING.md requires."""
    warnings = []
    for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS"):
        if os.environ.get(var) != str(threads):
            warnings.append("%s=%s (want %d)" % (var, os.environ.get(var, "<unset>"), threads))
    if os.environ.get("GOMP_SPINCOUNT") != "1000":
        warnings.append("GOMP_SPINCOUNT=%s (want 1000)" % os.environ.get("GOMP_SPINCOUNT", "<unset>"))
    if warnings:
        print("WARNING: thread pools not pinned: " + ", ".join(warnings) + ".\n"
              "  Set them in the environment before starting the process, e.g.\n"
              "  OPENBLAS_NUM_THREADS=%d OMP_NUM_THREADS=%d GOMP_SPINCOUNT=1000 /usr/bin/python3 %s "
              "--threads %d" % (threads, threads, sys.argv[0], threads), file=sys.stderr)
    return warnings


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, required=True, help="torch.set_num_threads (pin the env too)")
    ap.add_argument("--config", action="append", help="JSON or key=value,... size overrides")
    ap.add_argument("--warmup", type=int, default=3, help="untimed steps first")
    ap.add_argument("--steps", type=int, default=10, help="timed steps")
    ap.add_argument("--lr", type=float, default=3e-4)
    ap.add_argument("--warmup-steps", type=int, default=2, help="LR warm-up steps (MODEL.md schedule)")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--no-peak", action="store_true", help="skip the SGEMM peak measurement (MFU)")
    args = ap.parse_args()

    env_warnings = check_env(args.threads)
    import torch  # after the env check; thread pools read the env at start-up
    import gpt_moe
    torch.set_num_threads(args.threads)
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:
        pass

    over = parse_config(args.config)
    batch = int(over.pop("batch", 8))
    cfg = gpt_moe.default_config(**over)
    V, T = cfg["vocab"], cfg["seq_len"]

    gen = torch.Generator().manual_seed(args.seed)
    P = gpt_moe.init_params(cfg, gen, dtype=torch.float32)
    for p in P.values():
        p.requires_grad_(True)
    decay = [p for p in P.values() if p.dim() == 2]
    no_decay = [p for p in P.values() if p.dim() != 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95), eps=1e-8)
    params = list(P.values())
    total_steps = args.warmup + args.steps
    min_lr = 0.1 * args.lr

    def lr_at(s):
        if s < args.warmup_steps:
            return args.lr * (s + 1) / args.warmup_steps
        frac = (s - args.warmup_steps) / max(1, total_steps - args.warmup_steps)
        return min_lr + 0.5 * (args.lr - min_lr) * (1 + math.cos(math.pi * min(1.0, frac)))

    data = torch.randint(0, V, (total_steps, batch, T + 1), generator=gen)
    step_s, losses = [], []
    for s in range(total_steps):
        x, y = data[s, :, :T], data[s, :, 1:]
        t0 = time.perf_counter()
        for g in opt.param_groups:
            g["lr"] = lr_at(s)
        opt.zero_grad(set_to_none=True)
        out = gpt_moe.forward(P, cfg, x, y, fused=True, moe_impl="gather")
        (out["loss"] + out["aux_loss"]).backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        dt = time.perf_counter() - t0
        losses.append(out["loss"].item())
        if s >= args.warmup:
            step_s.append(dt)

    tok = batch * T
    tps = sorted(tok / t for t in step_s)
    result = dict(
        tokens_per_s_median=statistics.median(tps), tokens_per_s_min=tps[0], tokens_per_s_max=tps[-1],
        step_s_median=statistics.median(step_s), step_s_min=min(step_s), step_s_max=max(step_s),
        threads=args.threads, warmup_steps=args.warmup, timed_steps=args.steps,
        config=dict(cfg, batch=batch),
        env={k: os.environ.get(k) for k in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "GOMP_SPINCOUNT")},
        env_warnings=env_warnings, torch=torch.__version__,
        loss_first=losses[0], loss_last=losses[-1],
        model_flops_per_token=gpt_moe.count_flops_per_token(cfg))

    if not args.no_peak:
        # CPU peak for MFU: a large SGEMM through the same BLAS, same process, same thread setting
        a = torch.randn(2048, 2048)
        b = torch.randn(2048, 2048)
        torch.mm(a, b)
        ts = []
        for _ in range(3):
            t0 = time.perf_counter()
            torch.mm(a, b)
            ts.append(time.perf_counter() - t0)
        peak = 2 * 2048 ** 3 / statistics.median(ts)
        result["sgemm_2048_gflops"] = peak / 1e9
        result["mfu_median"] = result["model_flops_per_token"] * result["tokens_per_s_median"] / peak
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
