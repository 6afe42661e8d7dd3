"""The C++ autograd nodes of the eager fast path (``kernels/cpu/autograd_nodes.cpp``), and the Python
backward they hand every case but the plain one.

``NODES`` is the loaded module, or None where it is not built (``addnorm.kernels.cpu.nodes.status()`` says
why): the callers then use the Python nodes, ``EagerAddNorm``, ``EagerNormAdd`` and ``EagerParallelAddNorm``,
whose backward is also what runs here under create_graph=True, a forward-AD level, a dispatch mode, or an
incoming gradient that is not a plain CPU tensor (as do ``MhcPre``'s for mHC's pre step, ``MhcWritePre``'s for the
write and the pre step after it, and ``StreamRead``'s and
``StreamWrite``'s for the widened stream's read and write). ``MAX_NUMEL``: the norm forms' C++ nodes allocate with
torch; larger calls' outputs come from the output pool (``kernels.cpu.output_pool``) through the Python nodes, and at
those sizes the per-call cost is a small part of the kernel's time anyway. The widened stream's nodes take every size and draw their large outputs
from the pool themselves (``_pool_empty``).
"""

from __future__ import annotations

from types import SimpleNamespace

from ..kernels.cpu import nodes as _nodes
from ..kernels.cpu import norm as _cpu
from ..kernels.cpu import output_pool as _pool
from .fused.autograd import EagerNormAdd, EagerParallelAddNorm
from .mhc.autograd import N_ARGS as MHC_ARGS
from .mhc.autograd import MhcPre
from .mhc.schema import CPU as MHC_CPU
from .mhc.write import N_ARGS as WRITE_PRE_ARGS
from .mhc.write import MhcWritePre
from .norm.autograd import EagerAddNorm
from .pointwise.autograd import DirectPointwiseNorm
from .pointwise.schema import CPU as PW_CPU
from .stream.autograd import StreamRead, StreamWrite
from .stream.schema import CPU as STREAM_CPU

KIND = {"layer": 0, "rms": 1}
_KIND_NAME = ("layer", "rms")
_PW_NAME = ("dyt", "derf")  # kernels.cpu.pointwise.KINDS
MAX_NUMEL = (8 << 20) // 4  # the norm forms' C++ nodes take calls below 8 MiB of float32 (the output pool's start
# until it moved to 4 MiB for the widened stream's tensors; these nodes' per-call saving outweighs the pool there)


def _backward(op, saved, grads, needs, meta):
    """The Python node's backward for a C++ node's context: (op, saved tensors, incoming gradients, needs, the
    node's scalars) -> one gradient (or None) per input."""
    ctx = SimpleNamespace(saved_tensors=tuple(saved), needs_input_grad=tuple(needs))
    if op == 4:  # mHC's pre step: MhcPre's backward, with the scalars the node kept
        ctx.needs_input_grad = tuple(needs) + (False,) * MHC_ARGS
        ctx.perms, ctx.eps, ctx.iters, ctx.direct = meta["perms"], meta["eps"], meta["iters"], MHC_CPU[1]
        ctx.convention = tuple(meta[k] for k in ("pre_eps", "res_eps", "res_t", "post_scale", "post_eps", "groups"))
        return list(MhcPre.backward(ctx, *grads, None, None, None))[:len(needs)]
    if op == 7:  # a write of the stream and mHC's pre step: MhcWritePre's backward (its inputs but `products`)
        ctx.needs_input_grad = (*needs[:4], False, *needs[4:]) + (False,) * WRITE_PRE_ARGS
        ctx.products, ctx.perms, ctx.eps, ctx.iters = meta["products"], meta["perms"], meta["eps"], meta["iters"]
        ctx.convention = tuple(meta[k] for k in ("pre_eps", "res_eps", "res_t", "post_scale", "post_eps", "groups"))
        g = list(MhcWritePre.backward(ctx, *grads, None, None))
        return (g[:4] + g[5:])[:len(needs)]
    if op == 5:  # the stream's write
        ctx.direct = STREAM_CPU[3]
        return list(StreamWrite.backward(ctx, *grads, *[None] * (2 - len(grads))))
    if op == 6:  # the stream's read
        ctx.direct = STREAM_CPU[1]
        return list(StreamRead.backward(ctx, *grads))
    kind = _KIND_NAME[meta["kind"]] if op != 3 else None
    if op == 0:
        sv, _, w, b = saved
        D = sv.shape[-1]
        ctx.w_read = meta["w_read"]
        ctx.meta = (kind, sv.numel() // D, D, meta["eps"], meta["off"], meta["cbw"], meta["has_res"], meta["pcode"],
                    _cpu.spec(w, meta["w_read"]), _cpu.spec(b, meta["b_read"]))
        return list(EagerAddNorm.backward(ctx, *grads, *[None] * (2 - len(grads))))  # a plain norm: one output
    if op == 1:
        _, _, w, b = saved
        ctx.meta = (kind, meta["eps"], meta["off"], meta["cbw"])
        ctx.params = (meta["w_read"], meta["pcode"], _cpu.spec(w, meta["w_read"]), _cpu.spec(b, meta["b_read"]))
        return list(EagerNormAdd.backward(ctx, *grads))
    if op == 2:
        ctx.meta = (kind, meta["eps"], meta["off"], meta["cbw"], meta["two"], meta["has_x2"])
        return list(EagerParallelAddNorm.backward(ctx, *grads))
    ctx.meta = (_PW_NAME[meta["kind"]], meta["has_res"], saved[0].dtype)
    ctx.direct = PW_CPU[1]
    return list(DirectPointwiseNorm.backward(ctx, *grads, *[None] * (2 - len(grads))))


_DTYPE_OF_CODE = {c: dt for dt, c in _cpu.DTYPE.items()}  # the kernels' dtype codes, as autograd_nodes.cpp's code()


def _pool_empty(shape, code):
    """An output of the widened stream's C++ nodes from the output pool (None where the pool declines it)."""
    return _pool.POOL.empty(tuple(shape), _DTYPE_OF_CODE[code])


def _load():
    mod = _nodes.load(_backward, MAX_NUMEL, _pool_empty, _pool.MIN_BYTES)
    return None if isinstance(mod, str) else mod


NODES = _load()
