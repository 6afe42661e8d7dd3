"""The whole GPT of every frontier placement as one float64 function of a state_dict.

``gpt_logits(sd, hp, idx)`` recomputes the logits from the parameters alone (the model's state_dict
names, converted to float64 by the caller), composing the per-paper equations of
``reference.frontier`` and ``reference.streams``. It shares no code with ``addnorm.model``; tests
compare the model's forward and, through autograd in float64, its gradients with it.

``hp`` is a plain dict: n_layer, n_head, placement, norm, eps, n_streams, sinkhorn_iters,
value_residual, dense_dilation, dense_period, attn_res_block.
"""

from __future__ import annotations

import math

import torch

from . import attn_res as ar
from . import frontier as fr
from . import streams as st


def _norm(sd, prefix, x, kind, eps):
    g = lambda name: sd.get(f"{prefix}.{name}")  # noqa: E731
    if kind == "layer":
        return fr.layer_norm(x, g("weight"), g("bias"), eps)
    if kind == "rms":
        return fr.rms_norm(x, g("weight"), eps)
    if kind == "dyt":
        return fr.dyt(x, g("alpha"), g("weight"), g("bias"))
    if kind == "derf":
        return fr.derf(x, g("alpha"), g("shift"), g("weight"), g("bias"))
    raise ValueError(kind)


def _value_residual(sd, prefix, v, hp, layer, values):
    """ResFormer: layer 1 keeps V_1; later layers use lambda_1 V_n + lambda_2 V_1."""
    if not hp.get("value_residual"):
        return v
    if layer == 0:
        values["v1"] = v
        return v
    lam = sd[f"{prefix}.value_residual.lambdas"]
    return fr.value_residual(v, values["v1"], lam[0], lam[1])


def _attention(sd, prefix, x, hp, layer, values):
    B, T, C = x.shape
    nh = hp["n_head"]
    qkv = x @ sd[f"{prefix}.c_attn.weight"].T
    if f"{prefix}.c_attn.bias" in sd:
        qkv = qkv + sd[f"{prefix}.c_attn.bias"]
    q, k, v = qkv.split(C, dim=-1)
    hs = C // nh
    if hp.get("qkv_norm"):  # HybridNorm eq. 5: per head, over d_k
        q, k, v = (_norm(sd, f"{prefix}.{n}_norm", t.reshape(B, T, nh, hs), hp["norm"], hp["eps"]).reshape(B, T, C)
                   for n, t in zip("qkv", (q, k, v)))
    v = _value_residual(sd, prefix, v, hp, layer, values)
    heads = lambda t: t.reshape(B, T, nh, C // nh).transpose(1, 2)  # noqa: E731
    y = fr.causal_attention(heads(q), heads(k), heads(v), 1.0 / math.sqrt(C // nh))
    y = y.transpose(1, 2).reshape(B, T, C) @ sd[f"{prefix}.c_proj.weight"].T
    return y + sd[f"{prefix}.c_proj.bias"] if f"{prefix}.c_proj.bias" in sd else y


def _ffn(sd, prefix, x):
    h = x @ sd[f"{prefix}.c_fc.weight"].T
    if f"{prefix}.c_fc.bias" in sd:
        h = h + sd[f"{prefix}.c_fc.bias"]
    y = fr.gelu_tanh(h) @ sd[f"{prefix}.c_proj.weight"].T
    return y + sd[f"{prefix}.c_proj.bias"] if f"{prefix}.c_proj.bias" in sd else y


def _branch(sd, hp, i, sub, h, values):
    pre = f"h.{i}.{sub}.fn"
    return _attention(sd, pre, h, hp, i, values) if sub == "attn" else _ffn(sd, pre, h)


def _coefficients(sd, prefix, X, hp):
    """(H_pre, H_post, H_res) of one sub-layer's connection, by the paper of hp['placement']."""
    n, p = hp["n_streams"], hp["placement"]
    g = lambda name: sd[f"{prefix}.{name}"]  # noqa: E731
    if p == "hc":
        C = X.shape[-1]
        norm = lambda H: fr.layer_norm(H, g("norm.weight"), sd.get(f"{prefix}.norm.bias"), hp["eps"])  # noqa: E731
        W = g("w_alpha")  # (C, n + 1): column 0 is W_m, the rest W_r
        S = g("static_alpha")
        A_m, A_r, Bv = st.hc_dynamic(X, S[:, 0], S[:, 1:], g("static_beta"), W[:, 0], W[:, 1:], g("w_beta"),
                                     g("s_alpha"), g("s_beta"), norm)
        assert W.shape == (C, n + 1)
        return A_m, Bv, A_r.transpose(-1, -2)  # H_res = A_r^T in the eq. 3 convention
    xp = st.mhc_eq7_rmsnorm(X, 1e-6)
    phi = g("phi")
    pre = st.mhc_eq8_pre(xp, phi[:, :n], g("alpha_pre"), g("b_pre"))
    post = st.mhc_eq8_post(xp, phi[:, n:2 * n], g("alpha_post"), g("b_post"))
    if p == "mhc":
        res = st.mhc_eq9_sinkhorn(st.mhc_eq8_res_logits(xp, phi[:, 2 * n:], g("alpha_res"), g("b_res"), n),
                                  hp["sinkhorn_iters"])
    else:
        res = st.mhc_lite_res(xp, phi[:, 2 * n:], g("alpha_res"), g("b_res"), n)
    return pre, post, res


def gpt_logits(sd, hp, idx, record: list | None = None):
    """Logits (B, T, vocab) in float64. ``record`` (a list) receives each sub-layer's H_res if widened."""
    B, T = idx.shape
    L, eps, kind, p = hp["n_layer"], hp["eps"], hp["norm"], hp["placement"]
    if p == "ngpt":
        return _ngpt_logits(sd, hp, idx)
    x = sd["wte.weight"][idx] + sd["wpe.weight"][:T]
    values = {}
    if p in ("hc", "mhc", "mhc_lite"):
        X = x[..., None, :].expand(B, T, hp["n_streams"], x.shape[-1])
        for i in range(L):
            for sub in ("attn", "mlp"):
                H_pre, H_post, H_res = _coefficients(sd, f"h.{i}.{sub}.streams", X, hp)
                if record is not None:
                    record.append(H_res)
                h = st.mhc_layer_input(H_pre, X)
                y = _branch(sd, hp, i, sub, _norm(sd, f"h.{i}.{sub}.norm_before", h, kind, eps), values)
                X = st.mhc_eq3(X, y, H_post, H_res)
        x = X.sum(-2)
    elif p in ("pre", "lns", "denseformer"):
        outputs = [x]
        for i in range(L):
            l = i + 1
            scale = fr.lns_scale(l) if p == "lns" else 1.0
            for sub in ("attn", "mlp"):
                x = x + _branch(sd, hp, i, sub, _norm(sd, f"h.{i}.{sub}.norm_before", x, kind, eps) * scale, values)
            if p == "denseformer":
                outputs.append(x)
                if l % hp.get("dense_period", 1) == 0:
                    x = fr.dwa(outputs, sd[f"dwa.{i}.weight"], hp.get("dense_dilation", 1))
    elif p == "attn_res":
        x = _attn_res_stack(sd, hp, x, values)
    elif p in ("hybrid", "hybrid_star"):
        for i in range(L):
            star = p == "hybrid_star" and i == 0
            a_in = _norm(sd, f"h.{i}.attn.norm_before", x, kind, eps) if star else x
            Y = _branch(sd, hp, i, "attn", a_in, values) + x  # eq. 6 (eq. 7 for HybridNorm*'s first block)
            N = _norm(sd, f"h.{i}.mlp.norm_before", Y, kind, eps)
            x = _branch(sd, hp, i, "mlp", N, values) + (Y if star else N)
    else:
        raise ValueError(f"no reference for placement {p!r}")
    x = _norm(sd, "ln_f", x, kind, eps)
    return x @ sd["wte.weight"].T


def _attn_res_stack(sd, hp, x, values):
    """Attention Residuals over the 2 n_layer sub-layers (eqs. 2-6), then the final aggregation; returns what the
    final norm reads. Block size S = hp['attn_res_block'] sub-layers (None: Full AttnRes, S = 1)."""
    S = hp.get("attn_res_block") or 1
    kind, eps = hp["norm"], hp["eps"]
    blocks, partial = [x], None  # b_0 = h_1, the token embedding (eq. 5)
    for j in range(2 * hp["n_layer"]):  # sub-layer l = j + 1
        i, sub = divmod(j, 2)
        sub = ("attn", "mlp")[sub]
        V = ar.eq6_values(blocks, partial)
        prefix = f"h.{i}.{sub}"
        # the first sub-layer has one source (softmax weight 1): its input is h_1, and it has no query
        h = V[0] if j == 0 else ar.attn_res(V, sd[f"{prefix}.attn_res.query"], sd[f"{prefix}.attn_res.weight"], eps)
        f = _branch(sd, hp, i, sub, _norm(sd, f"{prefix}.norm_before", h, kind, eps), values)
        partial = ar.eq5_partial(partial, f)
        if (j + 1) % S == 0:  # block n complete: b_n = b_n^S
            blocks, partial = [*blocks, partial], None
    return ar.attn_res(ar.eq6_values(blocks, partial), sd["attn_res.query"], sd["attn_res.weight"], eps)


def _ngpt_logits(sd, hp, idx):
    """nGPT, eqs. 3, 10-21 of the paper (no position table: RoPE; no norms: L2 on the sphere)."""
    B, T = idx.shape
    nh = hp["n_head"]
    h = sd["wte.weight"][idx]
    C = h.shape[-1]
    hs, base = C // nh, 1 / math.sqrt(C)
    values = {}
    for i in range(hp["n_layer"]):
        a = f"h.{i}.attn"
        q, k, v = (h @ sd[f"{a}.c_attn.weight"].T).split(C, dim=-1)
        v = _value_residual(sd, a, v, hp, i, values)
        heads = lambda t: t.reshape(B, T, nh, hs).transpose(1, 2)  # noqa: E731
        s_qk = fr.ngpt_scale(sd[f"{a}.s_qk.weight"], 1.0, base).reshape(1, nh, 1, hs)
        q = fr.l2_norm(fr.rope(heads(q))) * s_qk
        k = fr.l2_norm(fr.rope(heads(k))) * s_qk
        y = fr.causal_attention(q, k, heads(v), math.sqrt(hs))
        att = y.transpose(1, 2).reshape(B, T, C) @ sd[f"{a}.c_proj.weight"].T
        h = fr.ngpt_update(h, att, fr.ngpt_scale(sd[f"h.{i}.alpha_attn.weight"], 0.05, base))
        m = f"h.{i}.mlp"
        u, nu = (h @ sd[f"{m}.c_fc.weight"].T).chunk(2, dim=-1)
        u = u * fr.ngpt_scale(sd[f"{m}.s_u.weight"], 1.0, 1.0)
        nu = nu * fr.ngpt_scale(sd[f"{m}.s_v.weight"], 1.0, 1.0) * math.sqrt(C)
        mlp = (u * fr.silu(nu)) @ sd[f"{m}.c_proj.weight"].T
        h = fr.ngpt_update(h, mlp, fr.ngpt_scale(sd[f"h.{i}.alpha_mlp.weight"], 0.05, base))
    return (h @ sd["lm_head.weight"].T) * fr.ngpt_scale(sd["s_z.weight"], 1.0, base)
