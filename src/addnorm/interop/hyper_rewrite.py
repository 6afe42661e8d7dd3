"""The write of a widened stream in a decoder layer's source, ``X' = X + H_post^T y``, found by its data flow for
``interop.rewrite``: a sum of the stream and an outer product of a hyper-connection's output with the sub-layer's
output, in either of the two spellings HF's decoders use --

    one statement    A = (P[.float()].unsqueeze(-1) * Y[.float()].unsqueeze(-2) + S[.float()])[.to(D)]
                     (HY-V4; ``return`` of it too; any operand order of the product and the sum)
    two statements   I = Y.unsqueeze(-2) * P.unsqueeze(-1) ;  A = S + I.flatten(-2)
                     (Qwen4-exp, whose stream is flattened; I read nowhere after)

where P is a name bound by ``... = self.<hc>(...)`` of a patched hyper-connection (its H_post, or Qwen4-exp's
injection weights). Such a write becomes ``A = _addnorm_hyper_write(self, site, S, Y, P, D, rounding, lambda: <the layer's
own expression>)`` (``interop.hyper.write``), which computes the layer's expression itself wherever the operator
does not take it. A cast to float32 inside is matched only where ``.to(D)`` rounds the result back: the operator
then rounds once; without casts it rounds each product first, as eager 16-bit code does (``Rounding``).
"""

from __future__ import annotations

import ast
import copy


def coefficient_names(fdef: ast.FunctionDef, sites) -> set[str]:
    """The names bound by a tuple assignment ``a, b[, c] = self.<site>(...)``: what a patched hyper-connection
    returns (a norm returns one tensor, never unpacked)."""
    names = set()
    for node in ast.walk(fdef):
        if (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Tuple)
                and isinstance(node.value, ast.Call) and isinstance(node.value.func, ast.Attribute)
                and isinstance(node.value.func.value, ast.Name) and node.value.func.value.id == "self"
                and node.value.func.attr in sites):
            names.update(e.id for e in node.targets[0].elts if isinstance(e, ast.Name))
    return names


def _int(node):
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub) and isinstance(node.operand, ast.Constant) \
            and type(node.operand.value) is int:
        return -node.operand.value
    return None


def _method(node, name, nargs):
    """``E.name(args)`` with ``nargs`` positional arguments and no keywords: (E, args) or None."""
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == name
            and len(node.args) == nargs and not node.keywords):
        return node.func.value, node.args
    return None


def _float(node):
    """(E, True) for ``E.float()``, else (node, False)."""
    m = _method(node, "float", 0)
    return (m[0], True) if m else (node, False)


def _unsqueezed(node, dim):
    m = _method(node, "unsqueeze", 1)
    return m[0] if m and _int(m[1][0]) == dim else None


def _outer(node, coeffs):
    """``P.unsqueeze(-1) * Y.unsqueeze(-2)`` in either order, each maybe ``.float()``: (P, Y, cast) or None."""
    if not (isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult)):
        return None
    for a, b in ((node.left, node.right), (node.right, node.left)):
        p, y = _unsqueezed(a, -1), _unsqueezed(b, -2)
        if p is None or y is None:
            continue
        (p, cp), (y, cy) = _float(p), _float(y)
        if isinstance(p, ast.Name) and isinstance(y, ast.Name) and p.id in coeffs:
            return p.id, y.id, cp or cy
    return None


def _one_statement(value, coeffs):
    """(S, Y, P, D, rounding) of ``(outer + S)[.to(D)]``, or None: with a factor of the product cast to float32 the
    result is rounded once, without one the product is rounded first, as eager computes it."""
    to = _method(value, "to", 1)
    node, dtype = (to[0], to[1][0]) if to else (value, None)
    if not (isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add)):
        return None
    for a, b in ((node.left, node.right), (node.right, node.left)):
        outer = _outer(a, coeffs)
        s, cs = _float(b)
        if outer is None or not isinstance(s, ast.Name):
            continue
        p, y, cast = outer
        if (cast or cs) and dtype is None:
            return None  # computed and returned in float32: not the stream's dtype the operator keeps
        return s.id, y, p, dtype, "once" if cast else "products"  # a factor cast: the product is float32's
    return None


def _assign(stmt):
    if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name):
        return stmt.targets[0].id, stmt.value
    return None


def _unread_after(name: str, stmts) -> bool:
    """``name`` is not read by the statements that follow before one assigns it again."""
    for stmt in stmts:
        nodes = [n for n in ast.walk(stmt) if isinstance(n, ast.Name) and n.id == name]
        if any(isinstance(n.ctx, ast.Load) for n in nodes):
            return False
        if nodes:
            return True
    return True


def _two_statements(stmts, i, coeffs):
    """(target, S, Y, P, eager) of ``I = outer ; A = S + I.flatten(-2)``, or None."""
    first, second = _assign(stmts[i]), _assign(stmts[i + 1]) if i + 1 < len(stmts) else None
    if first is None or second is None:
        return None
    outer = _outer(first[1], coeffs)
    value = second[1]
    if outer is None or outer[2] or not (isinstance(value, ast.BinOp) and isinstance(value.op, ast.Add)):
        return None
    for a, b, flat_first in ((value.left, value.right, False), (value.right, value.left, True)):
        flat = _method(b, "flatten", 1)
        if (flat and isinstance(flat[0], ast.Name) and flat[0].id == first[0] and _int(flat[1][0]) == -2
                and isinstance(a, ast.Name) and first[0] != a.id and _unread_after(first[0], stmts[i + 2:])):
            inlined = ast.Call(ast.Attribute(copy.deepcopy(first[1]), "flatten", ast.Load()),
                               [ast.Constant(-2)], [])
            terms = (inlined, ast.Name(a.id, ast.Load())) if flat_first else (ast.Name(a.id, ast.Load()), inlined)
            return second[0], a.id, outer[1], outer[0], ast.BinOp(terms[0], ast.Add(), terms[1])
    return None


def write_call(function: str, site: int, names: tuple[str, ...], dtype, option, eager) -> ast.Call:
    """``function(self, site, *names, dtype, option, lambda: eager)``: the call a matched write becomes (the
    layer's own expression kept as the lambda, for the paths the operator declines)."""
    return ast.Call(ast.Name(function, ast.Load()),
                    [ast.Name("self", ast.Load()), ast.Constant(site), *(ast.Name(n, ast.Load()) for n in names),
                     copy.deepcopy(dtype) if dtype is not None else ast.Constant(None), ast.Constant(option),
                     ast.Lambda(ast.arguments([], [], None, [], [], None, []), eager)], [])


def _call(site, s, y, p, dtype, rounding, eager):
    return write_call("_addnorm_hyper_write", site, (s, y, p), dtype, rounding, eager)


def match_write(stmts, i, coeffs):
    """(statements taken, build(site) -> the replacing statement) for a write starting at ``stmts[i]``, or None."""
    if not coeffs:
        return None
    stmt = stmts[i]
    if isinstance(stmt, ast.Return) and stmt.value is not None:
        found = _one_statement(stmt.value, coeffs)
        if found:
            eager = copy.deepcopy(stmt.value)
            return 1, lambda site: ast.Return(_call(site, *found, eager))
    one = _assign(stmt)
    if one is not None:
        found = _one_statement(one[1], coeffs)
        if found:
            eager = copy.deepcopy(one[1])
            return 1, lambda site: ast.Assign([ast.Name(one[0], ast.Store())], _call(site, *found, eager))
    two = _two_statements(stmts, i, coeffs)
    if two is not None:
        target, s, y, p, eager = two
        return 2, lambda site: ast.Assign([ast.Name(target, ast.Store())],
                                          _call(site, s, y, p, None, "products", eager))
    return None
