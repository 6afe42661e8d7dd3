"""Widened residual streams: the stream is n copies X (B, T, n, C), mixed by learned matrices.

Every form here is one small class with the same two calls around a sub-layer F:

    h, mix = conn.read(X)          h = H_pre X                       (B, T, C), F's input
    X'     = conn.write(X, y, mix) X' = H_res X + H_post^T y         y = F(norm(h))

with per-token coefficients H_pre (1 x n), H_post (1 x n), H_res (n x n) computed from X:

    "hc"        Hyper-Connections (Zhu et al., ICLR 2025, arXiv:2409.19606), dynamic and unconstrained:
                [A_m | A_r] = static + s_alpha * tanh(LN(X) W_alpha),  B = static + s_beta * tanh(LN(X) W_beta)
                H_pre = A_m^T, H_res = A_r^T, H_post = B
    "mhc"       mHC (DeepSeek, arXiv:2512.24880), from one projection of the RMS-normed vec(X):
                H_pre = sigmoid(.), H_post = 2 sigmoid(.), H_res = Sinkhorn-Knopp(exp(.)), doubly stochastic
    "mhc_lite"  mHC-lite (arXiv:2601.05732): as mhc, with H_res = sum_k softmax(a)_k P_k over the n!
                permutation matrices P_k -- doubly stochastic exactly, no iteration

The math is in functions (``hc_coefficients``; mHC's in ``addnorm.ops.mhc.formulas``, run by the fused operator
``addnorm.functional.mhc.mhc_pre``); the modules hold parameters. Each connection passes its H_res through
``self.h_res_tap`` (an identity) so that diagnostics can read the mixing matrices with a hook.

A sub-layer leaves its write pending (``PendingWrite``, the ``(stream, pending)`` seam of a widened stream): the next
sub-layer's ``conn.write_read(X, pending)`` finishes it and reads the result, which mHC does in one pass over each
token (``functional.mhc.mhc_write_pre``), and ``finish(X, pending)`` anywhere else (a block finishes its last
one). Both give the stream the same values: the fused pass writes X' with the stream write's own arithmetic.
"""

from __future__ import annotations

import contextlib
import itertools
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from .. import functional as AF
from ..nn.scalars import ScalarParameters, scalar_parameter
from ..ops.mhc.formulas import permutation_mix, sinkhorn_knopp  # noqa: F401  (the math lives with the operator)

# --- the math


def stream_read(h_pre: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """h = H_pre X: (B, T, n) x (B, T, n, C) -> (B, T, C)."""
    return (h_pre.unsqueeze(-1) * x).sum(-2)


def stream_write(x: torch.Tensor, y: torch.Tensor, h_post: torch.Tensor, h_res: torch.Tensor) -> torch.Tensor:
    """X' = H_res X + H_post^T y: row i of X' is sum_j H_res[i, j] X_j + H_post[i] y."""
    return torch.matmul(h_res, x) + h_post.unsqueeze(-1) * y.unsqueeze(-2)


def permutation_matrices(n: int) -> torch.Tensor:
    """All n! permutation matrices (n!, n, n), the identity first (itertools' order)."""
    perms = list(itertools.permutations(range(n)))
    eye = torch.eye(n, dtype=torch.float64)
    return torch.stack([eye[list(p)] for p in perms])


def _no_autocast(x: torch.Tensor):
    """Autocast turned off for x's device type where it is on; where it is not, nothing to enter (entering and leaving
    torch.autocast took about 0.1 ms a read inside a training step, with the caches cold from the kernels)."""
    t = x.device.type
    return torch.autocast(t, enabled=False) if torch.is_autocast_enabled(t) else contextlib.nullcontext()


# --- the modules


class StreamConnection(ScalarParameters):
    """read/write around one sub-layer; subclasses give ``coefficients(X) -> (H_pre, H_post, H_res)``."""

    def __init__(self, n: int):
        super().__init__()
        self.n = n
        self.h_res_tap = nn.Identity()  # diagnostics hook here to see each H_res

    def coefficients(self, x: torch.Tensor):
        raise NotImplementedError

    def read(self, x: torch.Tensor):
        """(h, mix): h = H_pre X by the fused read (``addnorm.functional.stream``: one pass, the coefficients
        kept in float32 beside 16-bit streams)."""
        if x.dim() < 2 or x.size(-2) != self.n:
            raise ValueError(f"a widened stream must be (..., n={self.n}, C), got shape {tuple(x.shape)}")
        with _no_autocast(x):  # the coefficients in float32 at least, never 16 bits
            h_pre, h_post, h_res = self.coefficients(x)
        h_res = self.h_res_tap(h_res)
        return AF.stream_read(x, h_pre), (h_post, h_res)

    def write(self, x: torch.Tensor, y: torch.Tensor, mix) -> torch.Tensor:
        """X' = H_res X + H_post^T y by the fused write (one pass)."""
        h_post, h_res = mix
        return AF.stream_write(x, y.to(x.dtype), h_post, h_res)[0]

    def write_read(self, x: torch.Tensor, pending: PendingWrite | None):
        """(X', h, mix): the stream with the write left pending by the sub-layer before (None: none) finished, and
        this connection's read of it."""
        x = finish(x, pending)
        return (x, *self.read(x))

    def extra_repr(self) -> str:
        return f"n={self.n}"


@dataclass(frozen=True, eq=False)
class PendingWrite:
    """A widened sub-layer's write, left for the next read of the stream: ``conn.write(X, y, mix)`` not yet done.
    ``finish(X, pending)`` does it, as does ``X + pending`` in eager code (so a hook that finishes a pending branch
    output by adding it finishes this too); an mHC read does it in its own pass
    (``ManifoldHyperConnection.write_read``).
    """

    conn: StreamConnection
    y: torch.Tensor
    mix: tuple

    def __radd__(self, x):
        if not isinstance(x, torch.Tensor):
            return NotImplemented
        return finish(x, self)

    def plain_write(self) -> bool:
        """Whether it is the stream family's write, H_res X + H_post^T y (what mHC's fused pass does)."""
        return type(self.conn).write is StreamConnection.write and len(self.mix) == 2 and self.mix[1] is not None


def finish(x: torch.Tensor, pending) -> torch.Tensor:
    """The stream with what a sub-layer left pending done: nothing (None), a branch output added (a tensor), or a
    widened sub-layer's write (``PendingWrite``). The model's own code calls this rather than ``x + pending``, which
    torch.compile does not send to ``PendingWrite.__radd__``."""
    if pending is None:
        return x
    if isinstance(pending, PendingWrite):
        return pending.conn.write(x, pending.y, pending.mix)
    return x + pending


def _at_least_float32(t: torch.Tensor) -> torch.Tensor:
    return t.float() if t.dtype in (torch.float16, torch.bfloat16) else t


def hc_coefficients(x, static_alpha, static_beta, w_alpha, w_beta, s_alpha, s_beta, norm):
    """Dynamic Hyper-Connections (HC paper, eqs. for A_m(H), A_r(H), B(H)).

    x: (B, T, n, C). static_alpha (n, n+1) = [A_m | A_r], static_beta (n,) = B.
    H_bar = norm(H); alpha = s_alpha * tanh(H_bar W_alpha) + [A_m | A_r]; beta = s_beta * tanh(H_bar W_beta) + B.
    The layer reads h_0 = alpha[:, 0]^T H and the stream becomes beta^T y + alpha[:, 1:]^T H.
    Computed in float32 at least (``HyperConnection.coefficients`` casts the inputs; ``StreamConnection.read``
    turns autocast off around every coefficient computation).
    """
    n1 = w_alpha.size(-1)
    # W_alpha and W_beta as one product, its weight laid out (n + 2, C) as F.linear's: at 2048 stream rows x 768 MKL
    # took 3.3 ms forward and back for H_bar @ W with W (C, n + 2) and 1.3 ms this way, and two products twice one
    w = torch.cat((w_alpha.t(), w_beta.unsqueeze(0)), 0)
    t = torch.tanh(F.linear(norm(x), w))  # (B, T, n, n + 2)
    alpha = s_alpha * t[..., :n1] + static_alpha  # (B, T, n, n+1)
    beta = s_beta * t[..., n1] + static_beta  # (B, T, n)
    return alpha[..., 0], beta, alpha[..., 1:].transpose(-1, -2)


class HyperConnection(StreamConnection):
    """Dynamic hyper-connection around sub-layer k (k counts attention and FFN sub-layers from 0).

    Init as the paper: A_m = e_{k mod n} (the sub-layer reads one stream), A_r = I, B = 1, the
    dynamic projections 0 and their scales s_alpha = s_beta = 0.01, so that at init with n = 1 the
    block computes pre-norm exactly.
    """

    SCALE_INIT = 0.01

    def __init__(self, n: int, dim: int, k: int, *, eps: float = 1e-5, bias: bool = True):
        super().__init__(n)
        self.k = k
        self.static_alpha = nn.Parameter(torch.empty(n, n + 1))
        self.static_beta = nn.Parameter(torch.empty(n))
        self.w_alpha = nn.Parameter(torch.empty(dim, n + 1))
        self.w_beta = nn.Parameter(torch.empty(dim))
        self.s_alpha = scalar_parameter()
        self.s_beta = scalar_parameter()
        self.norm = nn.LayerNorm(dim, eps=eps, bias=bias)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        n = self.n
        with torch.no_grad():
            self.static_alpha.zero_()
            self.static_alpha[self.k % n, 0] = 1.0
            self.static_alpha[:, 1:] = torch.eye(n)
            self.static_beta.fill_(1.0)
            self.w_alpha.zero_()
            self.w_beta.zero_()
            self.s_alpha.fill_(self.SCALE_INIT)
            self.s_beta.fill_(self.SCALE_INIT)
        self.norm.reset_parameters()

    def coefficients(self, x):
        """In float32 at least: 16-bit inputs and parameters cast up (as mHC's projection); ``read`` calls it
        with autocast off."""
        f = _at_least_float32
        xf = f(x)
        w, b = self.norm.weight, self.norm.bias
        norm = lambda t: F.layer_norm(t, (t.size(-1),), f(w), None if b is None else f(b),  # noqa: E731
                                      self.norm.eps)
        return hc_coefficients(xf, f(self.static_alpha), f(self.static_beta), f(self.w_alpha), f(self.w_beta),
                               f(self.s_alpha), f(self.s_beta), norm)


class ManifoldHyperConnection(StreamConnection):
    """mHC around one sub-layer: one projection phi (nC x (n^2 + 2n)) of the RMS-normed flattened stream,
    gated by the scalars alpha_pre/post/res, plus static biases; H_res projected by Sinkhorn-Knopp.

    Init: alpha = 0.01 (mHC, Table 5), gating a projection phi ~ N(0, 1/(nC)) (so alpha * x~'phi has a std of
    0.01). The paper gives no bias init; we start at the fixed mappings of its ablation (Table 1): H_pre = 1/n
    (1/2 when n = 1), H_post = 1 (b_post = 0), H_res ~ I (b_res 0 on the diagonal, -8 off it). phi must not
    start at 0: with uniform static mappings and the streams starting as copies of the embedding, every
    stream would get the same gradient and the n copies would stay identical for ever -- one stream
    (tested). The random phi makes each stream's coefficients differ from the first token on.
    """

    ALPHA_INIT = 0.01  # mHC Table 5, "gating factor init"
    OFF_DIAGONAL_INIT = -8.0  # exp(-8) = 3.4e-4: H_res starts within 1e-3 of I
    EPS = 1e-6  # RMSNorm of vec(X) (the paper writes none; DeepSeek-V4's code uses 1e-6)

    def __init__(self, n: int, dim: int, *, sinkhorn_iters: int = 20, eps: float = EPS, res_outputs: int | None = None):
        super().__init__(n)
        self.sinkhorn_iters, self.eps = sinkhorn_iters, eps
        r = n * n if res_outputs is None else res_outputs
        self.phi = nn.Parameter(torch.empty(n * dim, 2 * n + r))
        self.alpha_pre = scalar_parameter()
        self.alpha_post = scalar_parameter()
        self.alpha_res = scalar_parameter()
        self.b_pre = nn.Parameter(torch.empty(n))
        self.b_post = nn.Parameter(torch.empty(n))
        self.b_res = nn.Parameter(torch.empty(n, n) if res_outputs is None else torch.empty(r))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        n = self.n
        with torch.no_grad():
            self.phi.normal_(0.0, 1.0 / math.sqrt(self.phi.size(0)))
            for a in (self.alpha_pre, self.alpha_post, self.alpha_res):
                a.fill_(self.ALPHA_INIT)
            self.b_pre.fill_(-math.log(n - 1) if n > 1 else 0.0)  # sigmoid(b_pre) = 1/n
            self.b_post.zero_()  # 2 sigmoid(0) = 1
            self._init_b_res()

    def _init_b_res(self) -> None:
        self.b_res.fill_(self.OFF_DIAGONAL_INIT).fill_diagonal_(0.0)

    def _pre(self, x, backend=None):
        return AF.mhc_pre(x, self.phi, self.alpha_pre, self.alpha_post, self.alpha_res, self.b_pre, self.b_post,
                          self.b_res, perms=getattr(self, "perms", None), eps=self.eps, iters=self.sinkhorn_iters, backend=backend)

    def coefficients(self, x):
        """(H_pre, H_post, H_res) by the formulas (float32 at least), for diagnostics."""
        return self._pre(x, backend="torch")[1:]

    def read(self, x: torch.Tensor):
        """(h, mix) in one fused pass over X (``functional.mhc.mhc_pre``): the RMS of vec(X), the projection,
        the sigmoids and Sinkhorn-Knopp (or mHC-lite's permutation mix) and h = H_pre X."""
        if x.dim() < 2 or x.size(-2) != self.n:
            raise ValueError(f"a widened stream must be (..., n={self.n}, C), got shape {tuple(x.shape)}")
        with _no_autocast(x):  # the coefficients in float32 at least, never 16 bits
            h, _, h_post, h_res = self._pre(x)
        return h, (h_post, self.h_res_tap(h_res))

    def write_read(self, x: torch.Tensor, pending: PendingWrite | None):
        """(X', h, mix) as ``StreamConnection.write_read``; a pending stream write (H_res X + H_post^T y) is done in
        the same pass over each token as the read (``functional.mhc.mhc_write_pre``, mHC-lite's permutations
        included): X' is written and read while it is in cache, and its backward is one pass too, with no sum of two
        gradients of X'."""
        if not (isinstance(pending, PendingWrite) and pending.plain_write()):
            return super().write_read(x, pending)
        if x.dim() < 2 or x.size(-2) != self.n:
            raise ValueError(f"a widened stream must be (..., n={self.n}, C), got shape {tuple(x.shape)}")
        h_post, h_res = pending.mix
        with _no_autocast(x):
            x2, h, _, h_post2, h_res2 = AF.mhc_write_pre(
                x, pending.y.to(x.dtype), h_post, h_res, self.phi, self.alpha_pre, self.alpha_post, self.alpha_res,
                self.b_pre, self.b_post, self.b_res, perms=getattr(self, "perms", None), eps=self.eps,
                iters=self.sinkhorn_iters)
        return x2, h, (h_post2, self.h_res_tap(h_res2))

    def extra_repr(self) -> str:
        return f"n={self.n}, sinkhorn_iters={self.sinkhorn_iters}"


class MHCLiteConnection(ManifoldHyperConnection):
    """mHC-lite: H_res = sum_k softmax(a_res p_res + b_res)_k P_k over the n! permutation matrices."""

    def __init__(self, n: int, dim: int, *, eps: float = ManifoldHyperConnection.EPS):
        super().__init__(n, dim, eps=eps, res_outputs=math.factorial(n))
        self.sinkhorn_iters = 0
        self.register_buffer("perms", permutation_matrices(n).float(), persistent=False)

    def reset_parameters(self) -> None:
        super().reset_parameters()
        self._fill_perms()

    def _fill_perms(self) -> None:
        """The permutation matrices are no state (not in the state_dict): rebuilt here, at load and at reset, so
        that a model built on the meta device and materialized by ``to_empty()`` does not keep empty memory."""
        if hasattr(self, "perms") and not self.perms.is_meta:
            with torch.no_grad():
                self.perms.copy_(permutation_matrices(self.n))

    def _load_from_state_dict(self, *args, **kwargs):
        self._fill_perms()
        super()._load_from_state_dict(*args, **kwargs)

    def _init_b_res(self) -> None:  # mHC-lite's code: -8 on every permutation but the identity (index 0)
        self.b_res.fill_(self.OFF_DIAGONAL_INIT)
        self.b_res[0] = 0.0

    def extra_repr(self) -> str:
        return f"n={self.n}, permutations={math.factorial(self.n)}"


def make_connection(config, placement, k: int) -> StreamConnection | None:
    """The stream connection of sub-layer k (0-based, attention and FFN counted separately), or None."""
    n, dim = config.streams, config.n_embd
    if placement.stream == "single":
        return None
    if placement.stream == "hc":
        return HyperConnection(n, dim, k, eps=config.eps, bias=config.bias)
    if placement.stream == "mhc":
        return ManifoldHyperConnection(n, dim, sinkhorn_iters=config.sinkhorn_iters)
    if placement.stream == "mhc_lite":
        return MHCLiteConnection(n, dim)
    raise ValueError(f"unknown stream {placement.stream!r}")


def reduce_streams(x: torch.Tensor, stream: str) -> torch.Tensor:
    """(B, T, n, C) -> (B, T, C) before the final norm: the streams summed."""
    return x.sum(-2)
