"""Large outputs from recycled memory: the first touch of a fresh buffer costs more than the kernel.

glibc hands every block of 32 MiB or more out as freshly mmap'd pages and unmaps it on free, and trims
blocks of a few MiB from the top of its heaps back to the OS when several are freed together, so large
outputs are page-faulted -- and zeroed by the OS -- again and again: a 8192 x 1024 float32 forward took
3.4 ms on reused memory and 10.7 ms on fresh memory (huge pages, which the kernels ask for, cut the
faults but not the zeroing); bfloat16 forwards with 16 MiB outputs ran at 0.45-0.85 of the copy floor
under glibc's defaults against 0.85-1.22 with freed memory kept. This pool keeps addnorm's own large outputs (forward y and the new
residual stream, backward dx) in anonymous mappings, advised for transparent huge pages, and lends
them to torch as tensor storage (``torch.frombuffer``). When torch frees the storage, the mapping
is idle again and the next output of about its size reuses it, already faulted in.

Bounded: idle blocks beyond ``limit_bytes`` (default 1 GiB) are unmapped, oldest first;
``set_limit(0)`` turns the pool off, ``release()`` unmaps every idle block. Blocks in use are never
counted against the limit: they are the caller's live tensors. Tensors from the pool behave as any
CPU tensor, except that their storage cannot be resized (``untyped_storage().resize_(n)``, 0 included, or an
``out=`` that must resize it): ``set_limit(0)`` for code that does.
"""

from __future__ import annotations

import math
import mmap
import sys
import threading

import torch

MIN_BYTES = 4 << 20  # below this a call is short and glibc's heap keeps such blocks well enough; the pool's own
# cost (~3.4 us more than torch.empty) is then about 2 % of a kernel call at most. It was 8 MiB until a training step
# showed otherwise: at 512 tokens x 4 x 768 the widened stream's 6 MB outputs came back page-faulted (glibc trims the
# heap's top between steps), about 2 % of pre's step for the mHC block, through the Python nodes and the C++ alike
_ROUND = 2 << 20  # blocks come in multiples of a huge page
_IDLE_REFS = 2  # sys.getrefcount of a block only the pool holds: the list's reference and the argument


class OutputPool:
    def __init__(self, limit_bytes: int = 1 << 30):
        self.limit_bytes = limit_bytes
        self._blocks: list[mmap.mmap] = []  # oldest first
        self._lock = threading.Lock()

    def _idle(self, i: int) -> bool:
        return sys.getrefcount(self._blocks[i]) == _IDLE_REFS

    def empty(self, shape, dtype: torch.dtype) -> torch.Tensor | None:
        """A contiguous uninitialised CPU tensor from the pool, or None when the pool does not apply."""
        numel = math.prod(shape)
        nbytes = numel * dtype.itemsize
        if nbytes < MIN_BYTES or self.limit_bytes <= 0:
            return None
        size = -(-nbytes // _ROUND) * _ROUND
        with self._lock:
            block = None
            for i in range(len(self._blocks)):
                # an idle block of this size, up to a quarter larger: reuse it (and make it the newest)
                if size <= len(self._blocks[i]) <= size + size // 4 and self._idle(i):
                    block = self._blocks.pop(i)
                    break
            if block is None:
                block = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
                if hasattr(mmap, "MADV_HUGEPAGE"):
                    block.madvise(mmap.MADV_HUGEPAGE)
            self._blocks.append(block)
            self._trim()
        flat = torch.frombuffer(block, dtype=dtype, count=numel)
        # a tensor of its own over that storage, not a view of ``flat``: an autograd Function's output that is a view
        # refuses in-place operations ("... is a view and is being modified inplace"), which torch's own outputs take.
        # set_(flat), not set_(flat.untyped_storage(), ...): the Python storage object that the latter makes stays tied to
        # the storage and counts as a second owner, so autograd, which sums the two gradients of a tensor used twice in
        # place only into a buffer it owns alone, allocated a third tensor for every such sum (a residual stream's)
        return torch.empty(0, dtype=dtype, device="cpu").set_(flat).resize_(tuple(shape))

    def _trim(self) -> None:
        idle = [i for i in range(len(self._blocks)) if self._idle(i)]
        total = sum(len(self._blocks[i]) for i in idle)
        for i in idle:  # oldest first
            if total <= self.limit_bytes:
                break
            total -= len(self._blocks[i])
            self._blocks[i].close()
        self._blocks = [b for b in self._blocks if not b.closed]

    def set_limit(self, limit_bytes: int) -> None:
        if not isinstance(limit_bytes, int) or isinstance(limit_bytes, bool) or limit_bytes < 0:
            raise ValueError(f"limit_bytes must be an int >= 0, got {limit_bytes!r}")
        with self._lock:
            self.limit_bytes = limit_bytes
            self._trim()

    def release(self) -> None:
        """Unmap every idle block."""
        with self._lock:
            limit, self.limit_bytes = self.limit_bytes, 0
            self._trim()
            self.limit_bytes = limit

    def stats(self) -> dict:
        with self._lock:
            idle = [len(self._blocks[i]) for i in range(len(self._blocks)) if self._idle(i)]  # no loop variable: it would hold a reference
            return {"blocks": len(self._blocks), "idle_bytes": sum(idle),
                    "in_use_bytes": sum(len(b) for b in self._blocks) - sum(idle), "limit_bytes": self.limit_bytes}


POOL = OutputPool()


def empty(shape, dtype: torch.dtype) -> torch.Tensor:
    """A contiguous uninitialised CPU tensor: from the pool when large, else from torch."""
    t = POOL.empty(shape, dtype)
    return torch.empty(shape, device="cpu", dtype=dtype) if t is None else t
