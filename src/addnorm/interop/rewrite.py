"""Fuse the residual adds of a HuggingFace decoder layer by rewriting its ``forward`` at the level of its
data flow, whatever its attributes are called.

A decoder layer's forward is read (``inspect.getsource``), parsed, and four shapes of statement are
replaced by calls into ``interop.fused_sites`` (a stream's write: ``interop.hyper``); everything else -- the attention call with its exact
arguments, dropouts, reshapes, MoE routing, returned tuples -- stays the layer's own code:

    add then norm     A = E1 + E2 ; [R = A ...] ; D = self.N(A)    ->  (D, A) from one add_*_norm call
                      (Llama, OPT, BioGPT, XGLM, MPT, GPT-Neo, JetMoE, VaultGemma, Granite's scaled branch)
    norm then add     D = self.N(E) ; A = B + D   (or D + B)         ->  A = residual + norm(branch), one call
                      (OLMo 2/3, EXAONE 4 post-branch norms; Gemma2's output norms)
    stream write      A = X + H_post^T y  (HY-V4's, Qwen4-exp's spellings: ``hyper_rewrite``);
                      A = H_post^T y + comb^T X  (DeepSeek-V4's mHC: ``mhc_rewrite``, ``interop.deepseek_hc``)
                                                                     ->  one hyper_write, or with the next
                      hyper-connection's read of A where a probe run finds it (``interop.hyper``)
    any other sum     A = E1 + E2 [+ E3]  (or its .view/.reshape), return E1 + E2 [+ E3]
                                                                     ->  a hand-off site: one call that also
                      normalizes the sum for whichever norms are found (in a probe run) to read it -- the
                      next layer's input norm(s), the final norm, or a norm later in the same layer
                      (``interop.handoff``): GPT-J, GPT-NeoX, Phi, CodeGen, Cohere's parallel residual; every
                      sequential layer's MLP add; OPT's reshaped stream

The rewritten function is compiled once per layer class, in the namespace of the module that defined it
(its decorators, e.g. ``deprecate_kwarg``, applied again). A forward that needs a closure (``super()``) or
whose source cannot be read is not rewritten. What the rewrite changes is checked by ``patch_hf_model``'s
probe, which undoes it on any difference.
"""

from __future__ import annotations

import ast
import inspect
import textwrap
from dataclasses import dataclass, field

from . import deepseek_hc, fused_sites, hyper, hyper_rewrite, mhc_rewrite

_HELPERS = {"_addnorm_add_norm": fused_sites.add_norm, "_addnorm_norm_add": fused_sites.norm_add,
            "_addnorm_sum": fused_sites.layer_sum, "_addnorm_dropout_add": fused_sites.dropout_add,
            "_addnorm_hyper_write": hyper.write, "_addnorm_mhc_write": deepseek_hc.write}


def _is_dropout_add(fn) -> bool:
    """Whether ``fn(x, residual, prob, training)`` is ``residual + dropout(x)``: four parameters, and bit for bit
    ``residual + x`` wherever the dropout is the identity (evaluation, or prob 0), on probes."""
    import torch

    if not inspect.isfunction(fn):
        return False
    try:
        if len(inspect.signature(fn).parameters) != 4:
            return False
        g = torch.Generator().manual_seed(0)
        x, r = torch.randn(3, 8, generator=g), torch.randn(3, 8, generator=g)
        return all(isinstance(o, torch.Tensor) and torch.equal(o, r + x)
                   for o in (fn(x, r, 0.5, False), fn(x, r, 0.0, True)))
    except Exception:  # noqa: BLE001  (not a dropout-add)
        return False


@dataclass
class Rewritten:
    """A layer class's fused forward and what was fused in it."""

    function: object
    sites: dict[str, int] = field(default_factory=dict)  # kind -> count


def _self_norm_call(node, arg_name=None):
    """``self.N(X)`` with one positional Name argument (and no keywords): (N, X) or None."""
    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
            and isinstance(node.func.value, ast.Name) and node.func.value.id == "self"
            and len(node.args) == 1 and not node.keywords and isinstance(node.args[0], ast.Name)):
        return None
    if arg_name is not None and node.args[0].id != arg_name:
        return None
    return node.func.attr, node.args[0].id


def _assign(stmt):
    """``Name = value`` (one target): (name, value) or None."""
    if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name):
        return stmt.targets[0].id, stmt.value
    return None


def _terms(node):
    """The operands of a left-leaning sum of two or three terms, ``(E1 + E2) + E3``, or None."""
    if not (isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add)):
        return None
    left = node.left
    if isinstance(left, ast.BinOp) and isinstance(left.op, ast.Add):
        if isinstance(left.left, ast.BinOp) and isinstance(left.left.op, ast.Add):
            return None
        return [left.left, left.right, node.right]
    return [left, node.right]


def _call(helper, *args):
    return ast.Call(func=ast.Name(helper, ast.Load()), args=list(args), keywords=[])


class _Rewriter:
    def __init__(self, norms: set[str], globals_: dict):
        self.globals = globals_
        self.norms = norms  # attribute names of the layer's patched norms (and hyper-connections)
        self.sites: dict[str, int] = {}
        self.n = 0
        self.coeffs: set[str] = set()  # names a patched hyper-connection's call binds (``hyper_rewrite``)

    def _dropout_add(self, node) -> bool:
        """``f(x, residual, prob, training)`` where ``f`` (a module-level function of the layer's module)
        behaves as ``residual + dropout(x, prob, training)``: BLOOM's and Falcon's ``dropout_add``."""
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in self.globals):
            return False
        return _is_dropout_add(self.globals[node.func.id])

    def _count(self, kind):
        self.sites[kind] = self.sites.get(kind, 0) + 1

    def block(self, stmts: list) -> list:
        out, i = [], 0
        while i < len(stmts):
            s = stmts[i]
            for attr in ("body", "orelse", "finalbody"):
                if isinstance(getattr(s, attr, None), list) and getattr(s, attr) and not isinstance(
                        s, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                    setattr(s, attr, self.block(getattr(s, attr)))
            took = (self._write(stmts, i, out)
                    or self._add_then_norm(stmts, i, out)
                    or self._norm_then_add(stmts, i, out) or self._sum(stmts, i, out))
            if took:
                i += took
                continue
            out.append(s)
            i += 1
        return out

    def _write(self, stmts, i, out) -> int:
        """A write of a widened stream: an mHC one, ``H_post^T y + comb^T X`` (``mhc_rewrite``: one
        ``interop.deepseek_hc.write``), or one without a mixing matrix, ``X + H_post^T y`` (``hyper_rewrite``: one
        ``interop.hyper.write``)."""
        found = (mhc_rewrite.match_write(stmts, i, self.coeffs)
                 or hyper_rewrite.match_write(stmts, i, self.coeffs))
        if found is None:
            return 0
        took, build = found
        self.n += 1
        out.append(build(f"write{self.n}"))
        self._count("hyper-connection write")
        return took

    def _add_then_norm(self, stmts, i, out) -> int:
        a = _assign(stmts[i])
        if a is None:
            return 0
        name, value = a
        terms = _terms(value)
        if terms is None or len(terms) != 2:
            return 0
        j = i + 1
        while j < len(stmts) and (al := _assign(stmts[j])) is not None and isinstance(al[1], ast.Name) \
                and al[1].id == name and al[0] != name:
            j += 1
        if j >= len(stmts) or (d := _assign(stmts[j])) is None:
            return 0
        call = _self_norm_call(d[1], name)
        if call is None or call[0] not in self.norms:
            return 0
        self.n += 1
        tmp = f"_addnorm_normed_{self.n}"
        fused = ast.Assign(targets=[ast.Tuple([ast.Name(tmp, ast.Store()), ast.Name(name, ast.Store())], ast.Store())],
                           value=_call("_addnorm_add_norm", ast.Name("self", ast.Load()), ast.Constant(call[0]), *terms))
        out.append(fused)
        out.extend(stmts[i + 1:j])
        out.append(ast.Assign(targets=[ast.Name(d[0], ast.Store())], value=ast.Name(tmp, ast.Load())))
        self._count("add+norm")
        return j + 1 - i

    def _norm_then_add(self, stmts, i, out) -> int:
        d = _assign(stmts[i])
        if d is None or i + 1 >= len(stmts):
            return 0
        call = _self_norm_call(d[1])
        a = _assign(stmts[i + 1])
        if call is None or call[0] not in self.norms or a is None:
            return 0
        terms = _terms(a[1])
        if terms is None or len(terms) != 2:
            return 0
        names = [t.id if isinstance(t, ast.Name) else None for t in terms]
        if names.count(d[0]) != 1 or None in names:
            return 0  # the other operand must be a plain name: evaluating it before the norm changes nothing
        normed_first = names[0] == d[0]
        other = terms[1] if normed_first else terms[0]
        if a[0] != d[0]:
            return 0  # the normed value must not outlive the add (it may be read after an if, in a loop, ...)
        branch = ast.Name(call[1], ast.Load())
        out.append(ast.Assign(targets=[ast.Name(a[0], ast.Store())],
                              value=_call("_addnorm_norm_add", ast.Name("self", ast.Load()), ast.Constant(call[0]),
                                          branch, other, ast.Constant(normed_first))))
        self._count("norm+add")
        return 2

    def _sum(self, stmts, i, out) -> int:
        """Any other statement whose value is a two- or three-term sum, or a reshape of one: the sum becomes a
        hand-off site (``fused_sites.layer_sum``), fused at run time with whichever norms read it."""
        s = stmts[i]
        if not isinstance(s, ast.Assign | ast.Return) or s.value is None:
            return 0
        holder, attr, node = s, "value", s.value
        while isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                and node.func.attr in ("view", "reshape", "contiguous"):
            holder, attr, node = node.func, "value", node.func.value
        terms = _terms(node)
        if terms is None:
            if self._dropout_add(node):
                self.n += 1
                setattr(holder, attr, _call("_addnorm_dropout_add", ast.Name("self", ast.Load()),
                                            ast.Constant(f"sum{self.n}"), node.func, *node.args))
                getattr(holder, attr).keywords = node.keywords
                self._count("sum")
                out.append(s)
                return 1
            return 0
        self.n += 1
        setattr(holder, attr, _call("_addnorm_sum", ast.Name("self", ast.Load()), ast.Constant(f"sum{self.n}"), *terms))
        self._count("sum" if len(terms) == 2 else "parallel sum")
        out.append(s)
        return 1


_CACHE: dict[tuple[type, frozenset], Rewritten | None] = {}


def rewrite_forward(cls: type, norms: set[str]) -> Rewritten | None:
    """The fused forward of layer class ``cls`` (whose patched norms are the attributes ``norms``), or None
    when nothing in it can be fused or its source cannot be rewritten."""
    key = (cls, frozenset(norms))
    if key in _CACHE:
        return _CACHE[key]
    _CACHE[key] = result = _rewrite(cls, norms)
    return result


def _rewrite(cls, norms) -> Rewritten | None:
    fn = inspect.unwrap(cls.forward)
    try:
        source = textwrap.dedent(inspect.getsource(fn))
    except (OSError, TypeError):
        return None
    if fn.__code__.co_freevars:  # super() or another closure: compiled elsewhere it would not resolve
        return None
    tree = ast.parse(source)
    fdef = tree.body[0]
    if not isinstance(fdef, ast.FunctionDef):
        return None
    rw = _Rewriter(norms, fn.__globals__)
    rw.coeffs = hyper_rewrite.coefficient_names(fdef, norms)
    fdef.body = rw.block(fdef.body)
    if not rw.sites:
        return None
    decorators, fdef.decorator_list = fdef.decorator_list, []
    ast.fix_missing_locations(tree)
    # compiled in the layer's own module namespace, so its globals stay live (a function monkeypatched there
    # later is seen) and torch.compile, which looks globals up by module name, finds everything; the helpers
    # join that namespace under _addnorm_* names. The function itself is not left there.
    namespace = fn.__globals__
    namespace.update(_HELPERS)
    scratch = "_addnorm_compiled_" + fdef.name
    fdef.name = scratch
    code = compile(tree, f"<addnorm fused {cls.__module__}.{cls.__qualname__}.forward>", "exec")
    exec(code, namespace)  # noqa: S102  (the layer's own source, with its adds replaced by addnorm calls)
    new = namespace.pop(scratch)
    new.__name__, new.__qualname__ = fn.__name__, fn.__qualname__
    for dec in reversed(decorators):  # e.g. deprecate_kwarg(...): the same argument handling as before
        try:
            new = eval(compile(ast.Expression(dec), "<decorator>", "eval"), namespace)(new)  # noqa: S307
        except Exception:  # noqa: BLE001  (one that cannot take a compiled function -- HF's auto_docstring reads
            return None  # its source file's path -- leaves the layer's own forward, not a crash)
    return Rewritten(new, rw.sites)
