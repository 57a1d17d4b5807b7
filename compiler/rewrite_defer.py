"""Pass `defer_norm` (last of the rewrites): a transposed softmax's normalization after its
product, its sum out of the VXM.

A packed softmax over transposed scores (compiler/rewrite_pack.py) is p = e / sum(e, axis=0)
(e = exp(s - max) f32 [Nk, W], Nk keys across vectors, W queries across lanes), rounded to f16
and used only as the weights of the heads' products vT_h @ p_h [HD, Nk] @ [Nk, Nq]. Instead

    y_h = [vT_h; 1] @ f16(e)_h          [HD + 1, Nq]: its last row is sum(f16(e)_h, axis=0)
    vT_h @ p_h = y_h[:HD] / y_h[HD]     (a [1, Nq] row broadcast down the vectors)

so the sum across Nk vectors (a VXM tree the MXM waited on, ~700 cycles after the last exp
in gpt2_small_prefill) is one more row of a product the MXM makes anyway, e / sum (Nk vectors
a chunk) becomes HD multiplications a head by 1 / y_h[HD] (one vector), and p@v waits on the
exps only. The ones row is joined at the end of the node vT_h's rows are sliced from (the
heads' transposed v), so [vT_h; 1] is a view; a copy of vT_h otherwise. The weights are
f16(e) in numerator and denominator alike (0 < e <= 1, the max term 1.0: the sum is >= 1);
the reference rounds e / sum to f16 instead, the same relative step (2^-11) a weight.
Masked softmaxes only (`_masked`). Measured: gpt2_small_prefill 178,077 -> 174,737 cycles
(L=1 15,421 -> 15,365, L=2 30,265 -> 29,955, L=3 45,268 -> 44,982); [vT_h; 1] as a copy
instead of a view, L=1 15,570 and L=2 30,185; the sum as a product of its own (ones @ f16(e)_h,
a second install of the weights), L=2 30,377.
"""
from __future__ import annotations

import numpy as np

from lpu.compiler import ops
from lpu.compiler.ir import IRGraph
from lpu.compiler.rewrite import copied, rebuilding, rebuilt


def _norm(g: IRGraph, c):
    """(e, nk) when node c is f16(e / sum(e, axis=0)) of an f32 [nk, W] e; else None."""
    if c.op != "cast" or c.dtype != "f16" or len(c.shape) != 2:
        return None
    d = g.node(c.inputs[0])
    if d.op != "div" or d.dtype != "f32" or g.users(d.id) != [c.id]:
        return None
    e, z = (g.node(i) for i in d.inputs)
    if z.op != "sum" or z.attrs.get("axis") != 0 or z.inputs[0] != e.id or g.users(z.id) != [d.id]:
        return None
    if e.dtype != "f32" or e.shape != c.shape or z.shape != (1, e.shape[1]) or not _masked(g, e):
        return None
    return e.id, e.shape[0]


def _masked(g: IRGraph, e) -> bool:
    """e is exp(where(mask, s, c) - max), or that scaled: a masked softmax's (measured: bert_base's unmasked
    ones went slower, L=1 14,796 -> 15,029 cycles, L=2 28,489 -> 29,804)."""
    if e.op != "exp":
        return False
    d = g.node(e.inputs[0])
    if d.op == "mul":                     # exp(c * (where(...) - max)) (rewrite_pack._late_scale)
        d = g.node(d.inputs[0])
    return d.op == "sub" and g.node(d.inputs[0]).op == "where"


def _weights_of(g: IRGraph, s, c) -> bool:
    """s is a slice of c used only as the weights (B) of plain 2-D f32 matmuls."""
    if s.op != "slice" or s.inputs[0] != c or len(s.shape) != 2:
        return False
    us = [g.node(u) for u in g.users(s.id)]
    return bool(us) and all(u.op == "matmul" and len(u.inputs) == 2 and u.inputs[1] == s.id
                            and u.inputs[0] != s.id and u.dtype == "f32" and not u.attrs
                            and len(u.shape) == 2 for u in us)


def defer_norm(g: IRGraph) -> IRGraph:
    cands = {}
    for n in g.nodes():
        hit = _norm(g, n)
        if hit is not None and g.users(n.id) and all(_weights_of(g, g.node(u), n.id) for u in g.users(n.id)):
            cands[n.id] = hit
    if not cands:
        return g
    prods = {u2 for c in cands for u in g.users(c) for u2 in g.users(u)}
    joins = {}            # node the products' A rows are sliced from (a temp) -> its rows
    for p in prods:
        a = g.node(g.node(p).inputs[0])
        j = g.node(a.inputs[0]) if a.op == "slice" else None
        if j is None or len(j.shape) != 2 or j.id in g.outputs.values() or j.op in ops.LEAVES:
            continue
        if (j.op == "concat" and j.attrs["axis"] == 0 or all(g.node(u).op == "slice" for u in g.users(j.id))):
            joins[j.id] = j.shape[0]
    new = rebuilding(g)
    m: dict[int, int] = {}
    first: dict[int, int] = {}
    joined: dict[int, int] = {}     # join node -> the slice of its ones row
    ones: dict[tuple, int] = {}     # (nk, dtype) -> a ones row, a join's or a constant
    unit = None                     # the constant 1.0 the sums' reciprocals divide
    for n in g.nodes():
        first[n.id] = len(new)
        if n.id in cands:
            e = m[cands[n.id][0]]
            m[n.id] = new.add("cast", (e,), n.shape, "f16", {"to": "f16"}, n.line, n.col)
            continue
        if n.id in joins:     # a ones row joined at its end (a concat's last part): [A; 1] a view
            nk = n.shape[1]
            one = new.add("const", (), (1, nk), "f32", {"value": np.ones((1, nk), dtype=np.float32)}, n.line, n.col)
            row = new.add("cast", (one,), (1, nk), n.dtype, {"to": n.dtype}, n.line, n.col)
            ins = tuple(m[i] for i in n.inputs) + (row,) if n.op == "concat" else (copied(new, n, m), row)
            at = dict(n.attrs) if n.op == "concat" else {"axis": 0}
            m[n.id] = new.add("concat", ins, (n.shape[0] + 1, nk), n.dtype, at, n.line, n.col)
            r0 = n.shape[0]
            joined[n.id] = new.add("slice", (m[n.id],), (1, nk), n.dtype, {"index": ((r0, r0 + 1), (0, nk))},
                                   n.line, n.col)
            ones.setdefault((nk, n.dtype), joined[n.id])
            continue
        if n.id not in prods:
            m[n.id] = copied(new, n, m)
            continue
        a, w = (new.node(m[i]) for i in n.inputs)
        r, nk = a.shape
        q = n.shape[1]
        src = g.node(g.node(n.inputs[0]).inputs[0]).id if g.node(n.inputs[0]).op == "slice" else None
        if src not in joins and (nk, a.dtype) not in ones:     # (else a copy of A and a ones row)
            ones[nk, a.dtype] = new.add("const", (), (1, nk), a.dtype, {"value": np.ones((1, nk), dtype=np.float16)},
                               n.line, n.col)
        row = joined[src] if src in joins else ones[nk, a.dtype]
        aa = new.add("concat", (a.id, row), (r + 1, nk), a.dtype, {"axis": 0}, n.line, n.col)
        y = new.add("matmul", (aa, w.id), (r + 1, q), "f32", {}, n.line, n.col)
        num = new.add("slice", (y,), (r, q), "f32", {"index": ((0, r), (0, q))}, n.line, n.col)
        den = new.add("slice", (y,), (1, q), "f32", {"index": ((r, r + 1), (0, q))}, n.line, n.col)
        if unit is None:
            unit = new.add("const", (), (), "f32", {"value": np.float32(1.0)}, n.line, n.col)
        rec = new.add("div", (unit, den), (1, q), "f32", {}, n.line, n.col)
        m[n.id] = new.add("mul", (num, rec), n.shape, "f32", {}, n.line, n.col)
    return rebuilt(g, new, m, first)
