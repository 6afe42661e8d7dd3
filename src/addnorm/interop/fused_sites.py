"""What a rewritten decoder layer calls in place of its adds (see ``interop.rewrite``). Each computes
exactly what the replaced statements computed -- on one fused operator where the tensors allow, else the
same eager expressions in the same order."""

from __future__ import annotations

import functools
import inspect

from . import conventions, handoff


def add_norm(layer, name, a, b):
    """``s = a + b; (self.<name>(s), s)``."""
    norm = getattr(layer, name)
    fused = conventions.add_then_norm(norm, a, b)
    if fused is not None:
        return fused
    s = a + b
    return norm(s), s


def norm_add(layer, name, branch, other, normed_first):
    """``d = self.<name>(branch); d + other`` (or ``other + d``)."""
    norm = getattr(layer, name)
    fused = conventions.norm_then_add(norm, branch, other)
    if fused is not None:
        return fused
    d = norm(branch)
    return d + other if normed_first else other + d


def layer_sum(layer, site, *terms):
    """``(t1 + t2) [+ t3]``; fused with the norms found to read it (``handoff``), which find their outputs
    waiting."""
    readers = handoff.readers(layer, site)
    if readers and handoff.enabled(layer):
        fused = conventions.sum_then_norms(readers, terms)
        if fused is not None:
            s, outputs = fused
            for norm, y in outputs:
                handoff.give(norm, s, y)
            return s
    s = terms[0] + terms[1]
    s = s + terms[2] if len(terms) == 3 else s
    handoff.record(layer, site, s)
    return s


def dropout_add(layer, site, fn, *args, **kwargs):
    """``fn(x, residual, prob, training)``, a dropout-add (``rewrite._is_dropout_add``): where its dropout is
    the identity (evaluation, or prob 0) the sum ``residual + x`` as a hand-off site, else ``fn`` itself."""
    x, residual, prob, training = _signature(fn).bind(*args, **kwargs).arguments.values()
    if training and prob > 0:
        return fn(*args, **kwargs)
    return layer_sum(layer, site, residual, x)


@functools.lru_cache(maxsize=None)
def _signature(fn) -> inspect.Signature:  # read once per function, not on every layer call
    return inspect.signature(fn)
