"""The write of an mHC stream in a decoder layer's source, found by its data flow for ``interop.rewrite``: the
expand of the sub-layer's output by a hyper-connection's H_post plus the mix of the stream by its comb matrix,
as DeepSeek-V4 (and GLM-5-next) spell it --

    A = P[.to(D)].unsqueeze(-1) * Y.unsqueeze(-2) + torch.matmul(M[.to(D)][.transpose(-1, -2)], S)
    (``return`` of it too; either order of the product's factors and of the sum's terms; ``@`` for matmul;
    ``.mT`` for the transpose)

where P and M are names bound by ``a, b, c = self.<hc>(...)`` of a patched hyper-connection
(``hyper_rewrite.coefficient_names``), and Y, S are names.
Such a write becomes ``A = _addnorm_mhc_write(self, site, S, Y, P, M, D, transposed, lambda: <the layer's own
expression>)`` (``interop.deepseek_hc.write``), which computes the layer's expression itself wherever the
operators do not take it.
"""

from __future__ import annotations

import ast
import copy

from .hyper_rewrite import write_call


def _int(node):
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        v = _int(node.operand)
        return None if v is None else -v
    return node.value if isinstance(node, ast.Constant) and type(node.value) is int else None


def _method(node, name, nargs):
    """``E.name(args)`` with ``nargs`` positional arguments and no keywords: (E, args) or None."""
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == name
            and len(node.args) == nargs and not node.keywords):
        return node.func.value, node.args
    return None


def _plain(node) -> bool:
    """A name, or an attribute of one (``dtype``, ``hidden_states.dtype``): safe to evaluate twice."""
    return isinstance(node, ast.Name) or (isinstance(node, ast.Attribute) and _plain(node.value))


def _cast(node):
    """(E, D) for ``E.to(D)`` with D a plain name, else (node, None)."""
    m = _method(node, "to", 1)
    return (m[0], m[1][0]) if m and _plain(m[1][0]) else (node, None)


def _coefficient(node, coeffs, dim):
    """``P[.to(D)].unsqueeze(dim)``: (P, D) or None."""
    m = _method(node, "unsqueeze", 1)
    if m is None or _int(m[1][0]) != dim:
        return None
    p, d = _cast(m[0])
    return (p.id, d) if isinstance(p, ast.Name) and p.id in coeffs else None


def _expand(node, coeffs):
    """``P[.to(D)].unsqueeze(-1) * Y.unsqueeze(-2)`` in either order: (P, D, Y) or None."""
    if not (isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult)):
        return None
    for a, b in ((node.left, node.right), (node.right, node.left)):
        p = _coefficient(a, coeffs, -1)
        y = _method(b, "unsqueeze", 1)
        if p is not None and y is not None and _int(y[1][0]) == -2 and isinstance(y[0], ast.Name):
            return p[0], p[1], y[0].id
    return None


def _transposed(node):
    """(E, True) for ``E.transpose(-1, -2)`` (or ``(-2, -1)``) or ``E.mT``, else (node, False)."""
    m = _method(node, "transpose", 2)
    if m and {_int(m[1][0]), _int(m[1][1])} == {-1, -2}:
        return m[0], True
    if isinstance(node, ast.Attribute) and node.attr == "mT":
        return node.value, True
    return node, False


def _mix(node, coeffs):
    """``torch.matmul(M', S)`` or ``M' @ S``, M' = ``M[.to(D)][.transpose(-1, -2)]``: (M, D, transposed, S)."""
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.MatMult):
        left, right = node.left, node.right
    elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "matmul"
          and isinstance(node.func.value, ast.Name) and node.func.value.id == "torch" and len(node.args) == 2
          and not node.keywords):
        left, right = node.args
    else:
        return None
    inner, transposed = _transposed(left)
    m, d = _cast(inner)
    if not (isinstance(m, ast.Name) and m.id in coeffs and isinstance(right, ast.Name)):
        return None
    return m.id, d, transposed, right.id


def _write(value, coeffs):
    """(S, Y, P, M, D, transposed) of an mHC write, or None."""
    if not (isinstance(value, ast.BinOp) and isinstance(value.op, ast.Add)):
        return None
    for a, b in ((value.left, value.right), (value.right, value.left)):
        expand, mix = _expand(a, coeffs), _mix(b, coeffs)
        if expand is None or mix is None:
            continue
        p, d_post, y = expand
        m, d_comb, transposed, s = mix
        if p == m or ast.dump(d_post or ast.Constant(None)) != ast.dump(d_comb or ast.Constant(None)):
            return None  # one dtype for both coefficients, as the operator takes them
        return s, y, p, m, d_post, transposed
    return None


def _call(site, s, y, p, m, dtype, transposed, eager):
    return write_call("_addnorm_mhc_write", site, (s, y, p, m), dtype, transposed, eager)


def match_write(stmts, i, coeffs):
    """(statements taken, build(site) -> the replacing statement) for an mHC write at ``stmts[i]``, or None."""
    if not coeffs:
        return None
    stmt = stmts[i]
    if isinstance(stmt, ast.Return) and stmt.value is not None:
        found = _write(stmt.value, coeffs)
        if found:
            eager = copy.deepcopy(stmt.value)
            return 1, lambda site: ast.Return(_call(site, *found, eager))
    if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name):
        found = _write(stmt.value, coeffs)
        if found:
            eager, target = copy.deepcopy(stmt.value), stmt.targets[0].id
            return 1, lambda site: ast.Assign([ast.Name(target, ast.Store())], _call(site, *found, eager))
    return None
