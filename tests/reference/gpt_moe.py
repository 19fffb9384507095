"""Independent PyTorch implementation of /work/shared/MODEL.md (the numerical contract).

Written from the spec only. Parameters live in a plain dict {name: tensor} using MODEL.md's names and
its [in, out] layout, so a dict read from a Furnace safetensors export can be fed in directly.

Two implementations of the same math live here:
  * fused=False ("reference"): every op written out by hand (LayerNorm, tanh-GELU, attention,
    cross-entropy).  make_golden.py uses this one in float64.
  * fused=True: torch's F.layer_norm / F.gelu(approximate="tanh") / F.cross_entropy; used by the
    benchmark.  make_golden.py checks that both agree to float64 round-off.
and two MoE combine strategies (moe_impl="gather": compute only routed tokens, "dense": every
expert on every token, weighted by a gate matrix that is zero where not routed / dropped);
make_golden.py checks that both agree too.

Config: a dict with keys vocab, seq_len, d_model, heads, layers, moe_every, dense_ffn, experts,
top_k, expert_ffn, capacity_factor, normalize_topk, aux_alpha.
"""
import math

import torch
import torch.nn.functional as F

LN_EPS = 1e-5


def default_config(**over):
    cfg = dict(vocab=256, seq_len=128, d_model=256, heads=4, layers=4, moe_every=1, dense_ffn=None,
               experts=8, top_k=2, expert_ffn=512, capacity_factor=0.0, normalize_topk=None,
               aux_alpha=0.01)
    cfg.update(over)
    return finalize_config(cfg)


def finalize_config(cfg):
    cfg = dict(cfg)
    if cfg.get("dense_ffn") is None:
        cfg["dense_ffn"] = 4 * cfg["d_model"]
    if cfg.get("normalize_topk") is None:
        cfg["normalize_topk"] = cfg["top_k"] > 1
    assert cfg["d_model"] % cfg["heads"] == 0
    assert 1 <= cfg["top_k"] <= cfg["experts"]
    return cfg


def is_moe_layer(cfg, l):
    return l % cfg["moe_every"] == cfg["moe_every"] - 1


# --------------------------------------------------------------------------------------------
# parameters
# --------------------------------------------------------------------------------------------
def param_shapes(cfg):
    """Ordered list of (name, shape) exactly as MODEL.md names them."""
    V, T, d, L = cfg["vocab"], cfg["seq_len"], cfg["d_model"], cfg["layers"]
    E, f, fd = cfg["experts"], cfg["expert_ffn"], cfg["dense_ffn"]
    out = [("wte", (V, d)), ("wpe", (T, d))]
    for l in range(L):
        p = "layers.%d." % l
        out += [(p + "ln1.weight", (d,)), (p + "ln1.bias", (d,)),
                (p + "attn.wqkv", (d, 3 * d)), (p + "attn.bqkv", (3 * d,)),
                (p + "attn.wo", (d, d)), (p + "attn.bo", (d,)),
                (p + "ln2.weight", (d,)), (p + "ln2.bias", (d,))]
        if is_moe_layer(cfg, l):
            out.append((p + "moe.router", (d, E)))
            for e in range(E):
                q = p + "moe.experts.%d." % e
                out += [(q + "w1", (d, f)), (q + "b1", (f,)), (q + "w2", (f, d)), (q + "b2", (d,))]
        else:
            q = p + "mlp."
            out += [(q + "w1", (d, fd)), (q + "b1", (fd,)), (q + "w2", (fd, d)), (q + "b2", (d,))]
    out += [("lnf.weight", (d,)), ("lnf.bias", (d,))]
    return out


def is_residual_proj(name):
    return name.endswith("attn.wo") or name.endswith(".w2")


def init_params(cfg, gen, dtype=torch.float32, nontrivial=False):
    """MODEL.md init: N(0, 0.02) weights, residual projections 0.02/sqrt(2L), biases 0, LN 1/0.

    nontrivial=True (goldens): biases ~ N(0, 0.02), LN weight ~ 1 + N(0, 0.1), LN bias ~ N(0, 0.05),
    so that every gradient path is exercised with non-degenerate values.
    Values are drawn in float64 from `gen` then cast, so they do not depend on `dtype`.
    """
    L = cfg["layers"]
    params = {}
    for name, shape in param_shapes(cfg):
        def rnd(std):
            return torch.randn(shape, generator=gen, dtype=torch.float64) * std
        if name.endswith("ln1.weight") or name.endswith("ln2.weight") or name == "lnf.weight":
            t = 1.0 + rnd(0.1) if nontrivial else torch.ones(shape, dtype=torch.float64)
        elif name.endswith("ln1.bias") or name.endswith("ln2.bias") or name == "lnf.bias":
            t = rnd(0.05) if nontrivial else torch.zeros(shape, dtype=torch.float64)
        elif len(shape) == 1:  # linear biases
            t = rnd(0.02) if nontrivial else torch.zeros(shape, dtype=torch.float64)
        else:
            std = 0.02 / math.sqrt(2 * L) if is_residual_proj(name) else 0.02
            t = rnd(std)
        params[name] = t.to(dtype)
    return params


# --------------------------------------------------------------------------------------------
# building blocks (hand-written reference versions and fused torch versions)
# --------------------------------------------------------------------------------------------
def layer_norm(x, w, b, fused):
    if fused:
        return F.layer_norm(x, (x.shape[-1],), w, b, LN_EPS)
    mu = x.mean(-1, keepdim=True)
    var = ((x - mu) ** 2).mean(-1, keepdim=True)  # biased variance, as GPT-2 / torch
    return (x - mu) / torch.sqrt(var + LN_EPS) * w + b


def gelu_tanh(x, fused):
    if fused:
        return F.gelu(x, approximate="tanh")
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x * x * x)))


def attention(a, P, p, cfg, fused):
    B, T, d = a.shape
    h = cfg["heads"]
    hd = d // h
    qkv = a @ P[p + "attn.wqkv"] + P[p + "attn.bqkv"]          # [B,T,3d]: q | k | v
    q, k, v = qkv[..., :d], qkv[..., d:2 * d], qkv[..., 2 * d:]
    # heads contiguous: head i uses columns [i*hd, (i+1)*hd) of each of q, k, v
    q = q.reshape(B, T, h, hd).transpose(1, 2)                  # [B,h,T,hd]
    k = k.reshape(B, T, h, hd).transpose(1, 2)
    v = v.reshape(B, T, h, hd).transpose(1, 2)
    s = (q @ k.transpose(-1, -2)) * (1.0 / math.sqrt(hd))      # [B,h,T,T]
    causal = torch.ones(T, T, dtype=torch.bool, device=a.device).tril()
    s = s.masked_fill(~causal, float("-inf"))
    if fused:
        w = torch.softmax(s, dim=-1)
    else:
        s = s - s.max(-1, keepdim=True).values
        es = torch.exp(s)
        w = es / es.sum(-1, keepdim=True)
    o = (w @ v).transpose(1, 2).reshape(B, T, d)                # merge heads back, contiguous
    return o @ P[p + "attn.wo"] + P[p + "attn.bo"]


def mlp(u, w1, b1, w2, b2, fused):
    return gelu_tanh(u @ w1 + b1, fused) @ w2 + b2


# --------------------------------------------------------------------------------------------
# MoE
# --------------------------------------------------------------------------------------------
def route_topk(p, k):
    """Indices [N,k] of the k largest p per row, largest first; ties go to the LOWER index.

    Explicit (torch.topk's order among equal values is not specified): at each step take the
    maximum over the still-available experts and, among the experts equal to it, the smallest index.
    """
    N, E = p.shape
    iota = torch.arange(E, device=p.device).expand(N, E)
    avail = torch.ones(N, E, dtype=torch.bool, device=p.device)
    idx = torch.empty(N, k, dtype=torch.long, device=p.device)
    for j in range(k):
        pm = p.masked_fill(~avail, float("-inf"))
        m = pm.max(-1, keepdim=True).values
        cand = torch.where((pm == m) & avail, iota, torch.full_like(iota, E))
        i = cand.min(-1).values
        idx[:, j] = i
        avail[torch.arange(N, device=p.device), i] = False
    return idx


def capacity_of(cfg, N):
    cf = float(cfg["capacity_factor"])
    if cf <= 0:
        return None
    return int(math.ceil(cf * cfg["top_k"] * N / cfg["experts"]))  # Python float == IEEE double


def capacity_keep(idx, E, capacity):
    """keep[N,k]: an expert keeps its first `capacity` assignments in order (token n, then choice j)."""
    N, k = idx.shape
    if capacity is None:
        return torch.ones(N, k, dtype=torch.bool, device=idx.device)
    flat = idx.reshape(-1)                                     # order n*k + j
    onehot = F.one_hot(flat, E).to(torch.int64)                # [N*k, E]
    pos = onehot.cumsum(0).gather(1, flat[:, None])[:, 0] - 1  # 0-based arrival position at its expert
    return (pos < capacity).reshape(N, k)


def moe(u, P, p, cfg, fused, moe_impl="gather", stats=None):
    """u: [B,T,d] -> (out [B,T,d], aux scalar). N = B*T tokens of the micro-batch."""
    B, T, d = u.shape
    E, k = cfg["experts"], cfg["top_k"]
    x = u.reshape(B * T, d)
    N = x.shape[0]
    Wg = P[p + "moe.router"]
    rdt = torch.float64 if x.dtype == torch.float64 else torch.float32  # router in >= fp32
    logits = x.to(rdt) @ Wg.to(rdt)
    probs = torch.softmax(logits, dim=-1)                      # [N,E]
    with torch.no_grad():
        idx = route_topk(probs.detach(), k)                    # [N,k]
        keep = capacity_keep(idx, E, capacity_of(cfg, N))      # [N,k]
    gates = probs.gather(1, idx)                               # [N,k], differentiable
    if cfg["normalize_topk"]:
        gates = gates / gates.sum(-1, keepdim=True)
    gates = gates.to(x.dtype)
    # dropped assignments: expert output 0 and no gradient into their gate
    gates_kept = gates * keep.to(x.dtype)

    out = torch.zeros_like(x)
    for e in range(E):
        q = p + "moe.experts.%d." % e
        W1, b1, W2, b2 = P[q + "w1"], P[q + "b1"], P[q + "w2"], P[q + "b2"]
        if moe_impl == "dense":
            w_e = (gates_kept * (idx == e).to(x.dtype)).sum(-1)  # [N]
            out = out + w_e[:, None] * mlp(x, W1, b1, W2, b2, fused)
        else:
            sel = (idx == e) & keep
            tok, j = sel.nonzero(as_tuple=True)
            if tok.numel() == 0:
                continue
            y = mlp(x.index_select(0, tok), W1, b1, W2, b2, fused)
            out = out.index_add(0, tok, y * gates[tok, j][:, None])

    # Switch load-balancing loss: frac over all k*N assignments (dropped or not), no gradient
    counts = torch.bincount(idx.reshape(-1), minlength=E).to(probs.dtype)
    frac = counts / (k * N)
    meanprob = probs.mean(0)
    aux = cfg["aux_alpha"] * E * (frac * meanprob).sum()

    if stats is not None:
        with torch.no_grad():
            sp = probs.sort(-1, descending=True).values
            margin = (sp[:, k - 1] - sp[:, k]).min().item() if k < E else float("inf")
            stats.append(dict(layer=p, dropped=int((~keep).sum().item()),
                              assignments=int(N * k), counts=counts.to(torch.int64).tolist(),
                              capacity=capacity_of(cfg, N), min_route_margin=margin))
    return out.reshape(B, T, d), aux.to(x.dtype)


# --------------------------------------------------------------------------------------------
# full model
# --------------------------------------------------------------------------------------------
def cross_entropy(logits, targets, fused):
    V = logits.shape[-1]
    lg = logits.reshape(-1, V)
    t = targets.reshape(-1).long()
    if fused:
        return F.cross_entropy(lg, t)
    m = lg.max(-1, keepdim=True).values
    lse = m[:, 0] + torch.log(torch.exp(lg - m).sum(-1))
    return (lse - lg.gather(1, t[:, None])[:, 0]).mean()


def forward(P, cfg, inputs, targets=None, fused=False, moe_impl="gather", stats=None):
    """Returns dict(logits, loss (mean CE, if targets), aux_loss (sum over MoE layers))."""
    B, T = inputs.shape
    x = P["wte"][inputs.long()] + P["wpe"][:T]
    aux_total = torch.zeros((), dtype=x.dtype, device=x.device)
    for l in range(cfg["layers"]):
        p = "layers.%d." % l
        a = layer_norm(x, P[p + "ln1.weight"], P[p + "ln1.bias"], fused)
        x = x + attention(a, P, p, cfg, fused)
        u = layer_norm(x, P[p + "ln2.weight"], P[p + "ln2.bias"], fused)
        if is_moe_layer(cfg, l):
            y, aux = moe(u, P, p, cfg, fused, moe_impl, stats)
            aux_total = aux_total + aux
        else:
            y = mlp(u, P[p + "mlp.w1"], P[p + "mlp.b1"], P[p + "mlp.w2"], P[p + "mlp.b2"], fused)
        x = x + y
    y = layer_norm(x, P["lnf.weight"], P["lnf.bias"], fused)
    logits = y @ P["wte"].t()
    out = dict(logits=logits, aux_loss=aux_total)
    if targets is not None:
        out["loss"] = cross_entropy(logits, targets, fused)
    return out


def count_flops_per_token(cfg):
    """MODEL.md: 6 * active params per token (no wpe, k experts, tied wte once) + 12*L*T*d."""
    d, L, T = cfg["d_model"], cfg["layers"], cfg["seq_len"]
    n = cfg["vocab"] * d + d * 2  # wte (tied, once) + lnf
    for l in range(L):
        n += 4 * d + 3 * d * d + 3 * d + d * d + d
        if is_moe_layer(cfg, l):
            f = cfg["expert_ffn"]
            n += d * cfg["experts"] + cfg["top_k"] * (2 * d * f + f + d)
        else:
            f = cfg["dense_ffn"]
            n += 2 * d * f + f + d
    return 6 * n + 12 * L * T * d
