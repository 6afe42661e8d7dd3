"""Where the norms sit around a residual branch, as data.

Every sub-layer (attention, feed-forward) has three optional norm slots -- on the branch input
(``before``), on the branch output (``after_branch``) and on the residual sum (``after_sum``) --
and a residual form. A placement is one choice of those (x-transformers' model); a model may use
one placement for every layer or a list, one per layer.

Slot values: ``None`` (empty), ``"default"`` (the model's norm kind) or a kind from
``addnorm.nn.NORM_KINDS`` ("layer", "rms", "dyt", "batch"), so any norm can sit in any slot.

Residual forms, with F the branch and x the residual stream:
    "add"     x + F                      (the "+1" highway)
    "scaled"  alpha * x + F              (DeepNorm: alpha = (2N)^(1/4) up-weights the skip path)
    "gated"   x + g * F,  g learnable    (ReZero: scalar g = 0 at init; LayerScale: vector g small)
    "none"    F                          (no skip path at all)
    "normalized"  Norm(x + a * (Norm(F) - x)), a learnable  (nGPT: the stream stays on the unit sphere; built
                  by nGPT's own block and regime, model/ngpt.py and model/regimes/normalized.py: a
                  ResidualSubLayer refuses it)
    "from_norm"   Norm(x) + F(Norm(x))      (HybridNorm's FFN: the skip path starts after the norm)

Beyond the three slots, a placement says what the residual stream is:
    stream          "single" (one (B, T, C) stream) or a widened stream of n copies (B, T, n, C) mixed
                    by learned matrices: "hc" (Hyper-Connections), "mhc" (Sinkhorn-projected, doubly
                    stochastic), "mhc_lite" (an exact convex mix of permutation matrices)
    depth_scaled    LayerNorm Scaling: the branch-input norm's output times 1/sqrt(l), l = 1-based layer
    dense           DenseFormer: a depth-weighted average of every earlier block output after each block
    attn_res        Attention Residuals: each sub-layer's input a softmax over depth of the earlier sub-layer
                    outputs (or block sums), in place of the residual sum
    qkv_norm        HybridNorm: attention normalizes Q, K and V itself (its input is not normed)
    mlp             the feed-forward sub-layer's own placement, where it differs from attention's
"""

from __future__ import annotations

import numbers
from collections.abc import Sequence
from dataclasses import dataclass, replace

from ..nn.factory import NORM_KINDS

RESIDUAL_FORMS = ("add", "scaled", "gated", "none", "normalized", "from_norm")
STREAMS = ("single", "hc", "mhc", "mhc_lite")


@dataclass(frozen=True)
class Placement:
    name: str
    before: str | None = None  # norm of the branch input
    after_branch: str | None = None  # norm of the branch output
    after_sum: str | None = None  # norm of the residual sum
    residual: str = "add"
    final_norm: bool = False  # does a stack of these end with a norm (pre-norm style)?
    gate_init: float = 0.0  # "gated": initial g
    gate_per_channel: bool = False  # "gated": g is a vector (LayerScale) rather than a scalar (ReZero)
    stream: str = "single"  # the residual stream's form (see STREAMS)
    depth_scaled: bool = False  # LayerNorm Scaling: before-norm output * 1/sqrt(l)
    dense: bool = False  # DenseFormer: a depth-weighted average after each block (owned by GPT)
    attn_res: bool = False  # Attention Residuals: a softmax over depth replaces the residual sum (owned by GPT)
    qkv_norm: bool = False  # HybridNorm: Q, K, V normed after their projections
    mlp: Placement | None = None  # the feed-forward sub-layer's placement, if not this one
    formula: str = ""
    reference: str = ""
    xtransformers: str = ""  # the x-transformers option that builds the same thing, where there is one

    def __post_init__(self):
        if self.residual not in RESIDUAL_FORMS:
            raise ValueError(f"residual must be one of {RESIDUAL_FORMS}, got {self.residual!r}")
        if self.stream not in STREAMS:
            raise ValueError(f"stream must be one of {STREAMS}, got {self.stream!r}")
        if self.stream != "single" and (self.after_sum is not None or self.residual != "add"):
            raise ValueError(f"a widened stream ({self.stream!r}) mixes its streams itself: after_sum must be None "
                             f"and residual 'add', got after_sum={self.after_sum!r}, residual={self.residual!r}")
        for slot in ("before", "after_branch", "after_sum"):
            v = getattr(self, slot)
            if v is not None and v != "default" and v not in NORM_KINDS:
                raise ValueError(f"placement slot {slot} must be None, 'default' or one of {NORM_KINDS}, got {v!r}")

    @property
    def widened(self) -> bool:
        return self.stream != "single"

    def with_norm(self, kind: str) -> Placement:
        """This placement with every 'default' slot set to ``kind`` (the FFN's own placement too)."""
        slots = {s: kind for s in ("before", "after_branch", "after_sum") if getattr(self, s) == "default"}
        if self.mlp is not None:
            slots["mlp"] = self.mlp.with_norm(kind)
        return replace(self, **slots)

    def for_mlp(self) -> Placement:
        """The placement of the feed-forward sub-layer."""
        return self if self.mlp is None else self.mlp


PLACEMENTS: dict[str, Placement] = {
    p.name: p
    for p in [
        Placement("post", after_sum="default",
                  formula="LN(x + F(x))", reference="Vaswani et al. 2017, Attention Is All You Need"),
        Placement("pre", before="default", final_norm=True,
                  formula="x + F(LN(x)), final LN",
                  reference="Radford et al. 2019 (GPT-2); Xiong et al. 2020, On Layer Normalization in the Transformer Architecture"),
        Placement("sandwich", before="default", after_branch="default", final_norm=True,
                  formula="x + LN(F(LN(x))), final LN",
                  reference="Ding et al. 2021 (CogView, Sandwich-LN); Kim et al. 2025 (Peri-LN)"),
        Placement("pre_post", before="default", after_sum="default",
                  formula="LN(x + F(LN(x)))", reference="pre- and post-norm slots both filled (a common baseline in placement studies)"),
        Placement("deepnorm", after_sum="default", residual="scaled",
                  formula="LN(alpha*x + F(x)), alpha = (2N)^(1/4), branch init scaled by beta = (8N)^(-1/4)",
                  reference="Wang et al. 2022, DeepNet: Scaling Transformers to 1,000 Layers"),
        Placement("rezero", residual="gated", gate_init=0.0,
                  formula="x + g*F(x), scalar g = 0 at init, no norm",
                  reference="Bachlechner et al. 2020, ReZero is All You Need"),
        Placement("layerscale", before="default", residual="gated", gate_init=1e-4, gate_per_channel=True,
                  final_norm=True, formula="x + diag(g)*F(LN(x)), g = 1e-4 at init",
                  reference="Touvron et al. 2021, Going deeper with Image Transformers (CaiT)"),
        Placement("none", formula="x + F(x), no norm", reference="residual without normalization"),
        Placement("hc", before="default", final_norm=True, stream="hc",
                  formula="h = A_m(H)^T H;  H' = B(H)^T F(LN(h)) + A_r(H)^T H;  A, B = static + s*tanh(LN(H) W)",
                  reference="Zhu et al. 2025, Hyper-Connections (ICLR 2025, arXiv:2409.19606)",
                  xtransformers="none now: num_residual_streams built HC once, it now builds mHC"),
        Placement("mhc", before="default", final_norm=True, stream="mhc",
                  formula="X' = H_res X + H_post^T F(H_pre X);  H_pre = sigmoid, H_post = 2 sigmoid, "
                          "H_res = Sinkhorn(exp(.)) of one projection of RMS-normed vec(X)",
                  reference="Xie et al. 2025 (DeepSeek), mHC: Manifold-Constrained Hyper-Connections, arXiv:2512.24880",
                  xtransformers="num_residual_streams=n"),
        Placement("mhc_lite", before="default", final_norm=True, stream="mhc_lite",
                  formula="as mhc, with H_res = sum_k softmax(a)_k P_k over the n! permutation matrices",
                  reference="mHC-lite, arXiv:2601.05732"),
        Placement("lns", before="default", final_norm=True, depth_scaled=True,
                  formula="x + F(LN(x) / sqrt(l)), l = 1-based layer, final LN",
                  reference="Sun et al. 2025, The Curse of Depth in Large Language Models, arXiv:2502.05795"),
        Placement("denseformer", before="default", final_norm=True, dense=True,
                  formula="pre-norm blocks; after block i: Y_i = sum_{j<=i} a_ij X_j (X_0 the embedding), a_ii = 1",
                  reference="Pagliardini et al. 2024, DenseFormer, arXiv:2402.02622"),
        Placement("attn_res", before="default", final_norm=True, attn_res=True,
                  formula="h_l = sum_{i<l} softmax_i(w_l^T RMSNorm(v_i)) v_i, v_0 the embedding, v_i = F_i(LN(h_i)) "
                          "per sub-layer (attn_res_block=S: v the block sums, eq. 6); final h the same over all, "
                          "final LN",
                  reference="Kimi Team 2026, Attention Residuals, arXiv:2603.15031 (eqs. 2-6)",
                  xtransformers="attn_aggregated_residuals (a multi-head generalisation, not the paper's form)"),
        Placement("hybrid", qkv_norm=True, final_norm=True,
                  mlp=Placement("hybrid_mlp", before="default", residual="from_norm"),
                  formula="Y = X + MHA(X) with Norm(Q), Norm(K), Norm(V) per head;  X' = Norm(Y) + FFN(Norm(Y)); final norm",
                  reference="Zhuo et al. 2025, HybridNorm, arXiv:2503.04598 (eqs. 5-6)"),
        Placement("ngpt", residual="normalized",
                  formula="h <- Norm(h + a (Norm(F(h)) - h)), Norm(x) = x/‖x‖, weights on the sphere",
                  reference="Loshchilov et al. 2025, nGPT (ICLR 2025, arXiv:2410.01131)"),
        Placement("no_residual", after_sum="default", residual="none",
                  formula="LN(F(x)), no skip path", reference="normalization without residual"),
    ]
}
PER_LAYER = ("mix", "hybrid_star")  # names that resolve to different placements at different depths
# HybridNorm* (eq. 7): the first block pre-norm on both sub-layers (QKV-Norm kept), HybridNorm after it
_HYBRID_FIRST = Placement("hybrid_star_first", before="default", qkv_norm=True, final_norm=True,
                          formula="first block Y = X + MHA(Norm(X)) with QKV-Norm, X' = Y + FFN(Norm(Y)); "
                                  "then hybrid",
                          reference="Zhuo et al. 2025, HybridNorm* (eq. 7)")
NAMES = tuple(PLACEMENTS) + PER_LAYER

PlacementSpec = str | Placement | Sequence[str | Placement]


def parse_placement(text: str) -> str | tuple[str, ...]:
    """A placement as written on the command line or in a config: a name, or ``"a+b+c"``, one name per layer
    (``"post+post+pre+pre"``). The one parser of that syntax (the CLI's and GPTConfig's)."""
    if "+" not in text:
        return text
    names = tuple(n.strip() for n in text.split("+"))
    if not all(names):
        raise ValueError(f"placement {text!r}: 'a+b+c' needs a placement name on each side of every '+' "
                         f"(one per layer), e.g. 'post+pre+pre'")
    return names


def get_placement(name: str | Placement) -> Placement:
    if isinstance(name, Placement):
        return name
    if name in PLACEMENTS:
        return PLACEMENTS[name]
    if name in PER_LAYER:
        raise ValueError(f"placement {name!r} differs per layer; resolve it with resolve_placements(..., n_layer)")
    raise ValueError(f"unknown placement {name!r}; valid placements: {', '.join(NAMES)}")


def resolve_placements(spec: PlacementSpec, n_layer: int, norm: str = "layer",
                       mix_post_layers: int | None = None) -> list[Placement]:
    """One Placement per layer, 'default' slots filled with ``norm``.

    ``"mix"`` (Li et al. 2024, Mix-LN): post-norm for the first ``mix_post_layers`` layers
    (default: a quarter of them, as in the paper), pre-norm for the rest.
    """
    if isinstance(n_layer, bool) or not isinstance(n_layer, numbers.Integral) or n_layer < 0:
        raise ValueError(f"n_layer must be an integer >= 0, got {n_layer!r}")
    if isinstance(spec, str) and spec == "mix":
        k = n_layer // 4 if mix_post_layers is None else mix_post_layers
        if not 0 <= k <= n_layer:
            raise ValueError(f"mix_post_layers must be in [0, n_layer={n_layer}], got {k}")
        layers = [PLACEMENTS["post"]] * k + [PLACEMENTS["pre"]] * (n_layer - k)
    elif isinstance(spec, str) and spec == "hybrid_star":
        layers = ([_HYBRID_FIRST] + [PLACEMENTS["hybrid"]] * (n_layer - 1)) if n_layer else []
    elif isinstance(spec, str | Placement):
        layers = [get_placement(spec)] * n_layer
    else:
        layers = [get_placement(p) for p in spec]
        if len(layers) != n_layer:
            raise ValueError(f"a per-layer placement list must have n_layer={n_layer} entries, got {len(layers)}")
    return [p.with_norm(norm) for p in layers]


def final_norm_needed(placements: list[Placement]) -> bool:
    """A stack ends with a norm when its last layer's placement leaves the stream un-normalized."""
    return bool(placements) and placements[-1].final_norm


def deepnorm_constants(n_layer: int) -> tuple[float, float]:
    """(alpha, beta) of DeepNet for a decoder-only stack of n_layer blocks: ((2N)^(1/4), (8N)^(-1/4))."""
    return (2 * n_layer) ** 0.25, (8 * n_layer) ** -0.25


FRONTIER = ("hc", "mhc", "mhc_lite", "lns", "denseformer", "hybrid", "hybrid_star", "ngpt")


# how the per-layer names read in a table: (formula, paper, x-transformers)
_PER_LAYER_DOC = {
    "mix": ("post-norm for the first N/4 layers (configurable), pre-norm for the rest", "Li et al. 2024, Mix-LN", ""),
    "hybrid_star": (_HYBRID_FIRST.formula, _HYBRID_FIRST.reference, ""),
}


def markdown_table(names: Sequence[str] = NAMES) -> str:
    """The docs' table of placements: name, formula, paper, and the x-transformers option where one exists."""
    rows = ["| placement | formula | paper | x-transformers |", "|---|---|---|---|"]
    for n in names:
        p = PLACEMENTS.get(n)
        formula, ref, xt = (p.formula, p.reference, p.xtransformers) if p else _PER_LAYER_DOC[n]
        rows.append(f"| `{n}` | {formula.replace('|', '/')} | {ref} | {xt or '—'} |")
    return "\n".join(rows)
