"""Pass `late_columns` (the last rewrite): a matmul whose output columns feed matmuls at
different depths computed in two column parts, the part only the deeper ones need lowered after
the shallower ones' matmuls.

A transformer's qkv = f16(x @ wqkv + b) is one [S, 3D] product whose q and k columns feed the
score products and whose v columns are needed only by p @ v, after the softmax. Lowered as one
node, every column is placed before the first score, and the MXM then idles while the first
head pack's softmax runs. Split at the first chunk boundary past the columns the score products
read, the early part (the first chunks) is placed first, then the scores, then the late part
(attribute `late`: the offset to the id of the first matmul that reads the early part, so that
`level_order` lowers it `LATE_DEPTHS` after that matmul, behind the softmax's chains), whose
product fills the MXM while the softmax runs. The two parts' elementwise ops (bias, scale, cast)
read their columns of the broadcast operands (views), and the parts are joined along the lanes
in whole chunks (a `joined` concat: each part computed straight into its chunks, no copy); the
slices of the join read their columns of it as they read the one product before (and wait only
for the parts they read: level_order). A transpose of columns that cross the split (v.T) is the
two sides' transposes joined as rows, the late side read straight from its part's chunks (not
from a copy of v moved to lane 0). The values are bit for bit the same.

Measured: bert_base 178,788 -> 176,930 cycles (L=2 31,098 -> 30,230), gpt2_small_prefill
193,247 -> 182,368. A split at a multiple of both plane pairs' chunks (1920 of the 2304 qkv
columns early) was slower: bert_base L=3 46,405 (45,867 unsplit). A decode step's one-row
products are left whole (split: gpt2_small_decode 29,396 -> 29,827, slower).
"""
from __future__ import annotations

from dataclasses import replace

from lpu.compiler import ops
from lpu.compiler.ir import IRGraph
from lpu.compiler.rewrite import DROP, MIN_Q, rebuild


def _depths(g: IRGraph) -> dict:
    depth = {}
    for n in g.nodes():
        depth[n.id] = 1 + max((depth[i] for i in n.inputs), default=-1)
    return depth


def _first_matmuls(g: IRGraph, nid: int) -> list:
    """The matmuls reached from nid's users through non-matmul nodes (not past a store)."""
    out, seen, todo = [], set(), list(g.users(nid))
    while todo:
        u = todo.pop()
        if u in seen:
            continue
        seen.add(u)
        un = g.node(u)
        if un.op == "matmul":
            out.append(u)
        elif un.op != "store":
            todo.extend(g.users(u))
    return out


def _broadcast_cols(n, cols: int) -> bool:
    return n.shape in ((cols,), (1, cols))


def _chain(g: IRGraph, m) -> list:
    """[m, elementwise ops...]: the product and its single-user elementwise successors whose
    other operands are broadcast columns or scalars."""
    rows, cols = m.shape
    out = [m]
    while True:
        us = g.users(out[-1].id)
        if len(us) != 1:
            return out
        u = g.node(us[0])
        if u.op not in ops.ELEMENTWISE or u.op == "where" or u.shape != (rows, cols):
            return out
        others = [g.node(i) for i in u.inputs if i != out[-1].id]
        if not all(_broadcast_cols(o, cols) or o.size == 1 for o in others):
            return out
        out.append(u)


def _split_point(g: IRGraph, chain: list, lanes: int, depth: dict) -> int | None:
    """The chunk boundary past the columns the shallowest first matmuls read, if the columns
    after it feed only deeper ones."""
    z = chain[-1]
    rows, cols = z.shape
    users = [g.node(u) for u in g.users(z.id)]
    if len(users) < 2 or not all(u.op == "slice" and len(u.shape) == 2 and tuple(u.attrs["index"][0]) == (0, rows)
                                 for u in users):
        return None
    need = {}
    for u in users:
        mm = _first_matmuls(g, u.id)
        need[u.id] = min((depth[x] for x in mm), default=None)
    known = [d for d in need.values() if d is not None]
    if not known:
        return None
    first = min(known)
    hi = max(u.attrs["index"][1][1] for u in users if need[u.id] == first)
    c = -(-hi // lanes) * lanes
    if c >= cols:
        return None
    for u in users:
        lo = u.attrs["index"][1][0]
        if need[u.id] == first and lo >= c or need[u.id] != first and u.attrs["index"][1][1] <= c:
            return None
    return c


def _weight_part(new, g, w, m, lo, hi, like):
    """Columns lo:hi of the matmul's right operand w ([K, N]): a slice, under w's cast if it
    is one (an i8 weight widened as the MXM loads it stays so)."""
    wn = g.node(w)
    k = wn.shape[0]
    if wn.op == "cast" and len(g.users(w)) == 1:
        src = new.add("slice", (m[wn.inputs[0]],), (k, hi - lo), g.node(wn.inputs[0]).dtype,
                      {"index": ((0, k), (lo, hi))}, like.line, like.col)
        return new.add("cast", (src,), (k, hi - lo), wn.dtype, dict(wn.attrs), like.line, like.col)
    return new.add("slice", (m[w],), (k, hi - lo), wn.dtype, {"index": ((0, k), (lo, hi))}, like.line, like.col)


def _cols(new, g, nid, m, lo, hi, like):
    n = g.node(nid)
    if n.size == 1:
        return m[nid]
    index = ((lo, hi),) if len(n.shape) == 1 else ((0, 1), (lo, hi))
    shape = (hi - lo,) if len(n.shape) == 1 else (1, hi - lo)
    return new.add("slice", (m[nid],), shape, n.dtype, {"index": index}, like.line, like.col)


def late_columns(g: IRGraph, lanes: int) -> IRGraph:
    depth = _depths(g)
    splits = {}
    for n in g.nodes():
        if n.op != "matmul" or len(n.shape) != 2 or n.shape[0] < MIN_Q or n.shape[1] <= lanes \
                or len(g.node(n.inputs[1]).shape) != 2:
            continue
        chain = _chain(g, n)
        c = _split_point(g, chain, lanes, depth)
        if c is not None:
            splits[chain[-1].id] = (chain, c)
    if not splits:
        return g
    member = {x.id for chain, _ in splits.values() for x in chain}

    def node(new, n, m):
        if n.id in splits:
            chain, c = splits[n.id]
            rows, cols = n.shape
            parts = []
            for lo, hi in ((0, c), (c, cols)):
                mm = chain[0]
                w = _weight_part(new, g, mm.inputs[1], m, lo, hi, mm)
                cur = new.add("matmul", (m[mm.inputs[0]], w), (rows, hi - lo), mm.dtype, dict(mm.attrs), mm.line, mm.col)
                for prev, x in zip(chain, chain[1:]):
                    ins = tuple(cur if i == prev.id else _cols(new, g, i, m, lo, hi, x) for i in x.inputs)
                    cur = new.add(x.op, ins, (rows, hi - lo), x.dtype, dict(x.attrs), x.line, x.col)
                parts.append(cur)
            return new.add("concat", tuple(parts), n.shape, n.dtype, {"axis": 1, "split": c}, n.line, n.col)
        if _crossing_transpose(g, n, splits):
            return _transposed_parts(new, g, n, splits, m)
        return DROP if n.id in member else None
    out = rebuild(g, node)
    _mark_late(out)
    return out


def _crossing_transpose(g: IRGraph, n, splits: dict) -> bool:
    """A transpose of a slice of a split product's columns that crosses the split (v.T)."""
    if n.op != "transpose" or list(n.attrs["perm"]) != [1, 0]:
        return False
    s = g.node(n.inputs[0])
    if s.op != "slice" or s.inputs[0] not in splits or len(s.shape) != 2 \
            or tuple(s.attrs["index"][0]) != (0, g.node(s.inputs[0]).shape[0]):
        return False
    lo, hi = s.attrs["index"][1]
    return lo < splits[s.inputs[0]][1] < hi


def _transposed_parts(new, g, n, splits, m) -> int:
    """The transpose of columns lo:hi of a split join as the transposes of its columns on
    either side of the split, joined as rows: the late side is transposed straight from the
    late part's chunks (a view), not from a copy of the columns moved to lane 0."""
    s = g.node(n.inputs[0])
    z = m[s.inputs[0]]
    rows = s.shape[0]
    lo, hi = s.attrs["index"][1]
    c = splits[s.inputs[0]][1]
    parts = []
    for a, b in ((lo, c), (c, hi)):
        piece = new.add("slice", (z,), (rows, b - a), s.dtype, {"index": ((0, rows), (a, b))}, s.line, s.col)
        parts.append(new.add("transpose", (piece,), (b - a, rows), n.dtype, {"perm": (1, 0)}, n.line, n.col))
    return new.add("concat", tuple(parts), n.shape, n.dtype, {"axis": 0}, n.line, n.col)


def _mark_late(g: IRGraph):
    """Attribute `late` of each late part's product: the offset to the id of the first matmul
    that reads the early part of its join (ids as in the final graph)."""
    for n in g.nodes():
        if n.op != "concat" or "split" not in n.attrs:
            continue
        early, tail = n.inputs
        mm = g.node(tail)
        while mm.op != "matmul" and mm.inputs:
            mm = g.node(mm.inputs[0])
        if mm.op != "matmul":
            continue
        c = n.attrs["split"]
        reads = [u for u in g.users(n.id) if g.node(u).op == "slice" and g.node(u).attrs["index"][1][1] <= c]
        targets = [x for u in reads for x in _first_matmuls(g, u)]
        if targets and min(targets) > mm.id:
            g.replace(replace(mm, attrs={**mm.attrs, "late": min(targets) - mm.id}))
