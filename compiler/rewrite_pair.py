"""Pass `pair_heads` (last of the rewrites): two heads' products with p as rows made as one.

The packed softmax (compiler/rewrite_pack.py) makes p.T [Nk, W] (a vector per key, the heads'
queries across the lanes); where it is transposed back, each head's rows p_h = p.T[:, c_h].T
[Nq, Nk] are the left operand of p_h @ u_h, and split_joins sums two heads' products in one
accumulator, matmul(p_b, u_b, matmul(p_a, u_a)): 2 * Nq rows of Nk lanes each (a half pass
of an f16 pair when Nk <= lanes / 4). Instead

    pp = tfold(p.T, step = c_b - c_a)      pp[c, j*Nk + r] = p.T[r, c + j*step]  (op tfold:
                                           the transpose with the rows rotated by -step stacked
                                           below the rows, in one fill of the SXM buffers)
    y  = pp[c_a rows] @ concat(u_a, u_b, axis=0)

Nq rows of 2 * Nk lanes: the same half pass a row while 2 * Nk <= lanes / 2, so the MXM holds
the pair half as long; the SXM rotates Nk rows on their way into the buffer and reads W - step
columns out, where the plain transpose read all W columns. Products and sums are the same
(one dot product over both heads' keys instead of two accumulated: the MXM's dot products are
exact before one rounding, the accumulation adds in f32: within the reference's tolerance).
Each fold takes its own SXM (movement.tfold_sxm), its product the plane pair on that side and
its rows the FOLD_SLICES slices at that edge (placement), p.T the slices nearest the VXM.
Measured on attention_prefill (tsp-v1, predicted == emulated, check ok): 1,078 -> 965 cycles
(the products' ABCs 851-979 -> 802-866). On the way: p.T sliced, joined and transposed by
plain ops (lane moves copied to SRAM, then TPINs) 1,194; one fold on one SXM (every column
read out) 1,038, only the pairs' columns 1,040; both SXMs 1,032; p.T near the VXM 995; the
folds' rows at the edge in 8, 4, 16, 24, 44 (a hemisphere) slices 965, 983, 972, 970, 995.
Where p.T's zeros are known (`live`: a causal mask's dropped keys), each column is read out as
soon as the rows it needs are in (movement._fold_streamed): the products start while the folds
still fill their buffers (attention_prefill 880 -> 864; with the placements near the VXM, 830),
and, read by the product's ABC chains, goes to the MXM on the stream (movement.fold_feed: 816 -> 806).
"""
from __future__ import annotations

import numpy as np

from lpu.compiler.ir import IRGraph
from lpu.compiler.rewrite import DROP, rebuild


def _rows_of_t(g: IRGraph, a):
    """(p.T id, r0, r1) when a = transpose(p.T)[r0:r1, :] with p.T 2-D, else None."""
    if a.op != "slice" or len(a.shape) != 2:
        return None
    t = g.node(a.inputs[0])
    if t.op != "transpose" or len(t.shape) != 2 or list(t.attrs["perm"]) != [1, 0]:
        return None
    ix = a.attrs["index"]
    if isinstance(ix[0], int) or tuple(ix[1]) != (0, t.shape[1]):
        return None
    return t.inputs[0], ix[0][0], ix[0][1]


def _pair(g: IRGraph, n, lanes):
    """(first product id, (p.T id, r0, r1), step) of n = matmul(p_b, u_b, matmul(p_a, u_a)) with
    p_a, p_b row ranges of one transposed p.T, step apart; None otherwise."""
    if n.op != "matmul" or len(n.inputs) != 3:
        return None
    m1 = g.node(n.inputs[2])
    if m1.op != "matmul" or len(m1.inputs) != 2 or g.users(m1.id) != [n.id]:
        return None
    a1, a2 = g.node(m1.inputs[0]), g.node(n.inputs[0])
    r1, r2 = _rows_of_t(g, a1), _rows_of_t(g, a2)
    if r1 is None or r2 is None or r1[0] != r2[0] or a1.shape != a2.shape or a1.dtype != "f16":
        return None
    pt = g.node(r1[0])
    nk, w = pt.shape
    step = r2[1] - r1[1]
    u1, u2 = g.node(m1.inputs[1]), g.node(n.inputs[1])
    if step <= 0 or w > lanes or 4 * nk > lanes or u1.shape != u2.shape or u1.dtype != u2.dtype:
        return None
    return m1.id, r1, step


def pair_heads(g: IRGraph, lanes: int) -> IRGraph:
    pairs = {n.id: p for n in g.nodes() if (p := _pair(g, n, lanes)) is not None}
    if not pairs:
        return g
    drop = {p[0] for p in pairs.values()}

    def node(new, n, m):
        if n.id in drop:
            return DROP
        if n.id not in pairs:
            return None
        m1, (pid, r0, r1), step = pairs[n.id]
        pt = g.node(pid)
        nk = pt.shape[0]

        def add(op, ins, shape, dtype, attrs):
            return new.add(op, tuple(ins), tuple(shape), dtype, attrs, n.line, n.col)
        p = add("tfold", (m[pid],), (r1 - r0, 2 * nk), pt.dtype, {"step": step, "parts": 2, "starts": (r0,), "count": r1 - r0})
        u1, u2 = g.node(g.node(m1).inputs[1]), g.node(n.inputs[1])
        u = add("concat", (m[u1.id], m[u2.id]), (2 * u1.shape[0], u1.shape[1]), u1.dtype, {"axis": 0})
        return add("matmul", (p, u), n.shape, n.dtype, {})
    return rebuild(g, node)


def _over_keys(g: IRGraph, n, op) -> bool:
    """n's second operand is `op` over axis 0 of its first (a softmax's max or sum)."""
    r = g.node(n.inputs[1])
    return r.op == op and r.inputs[0] == n.inputs[0] and r.attrs["axis"] == 0


def live(g: IRGraph, nid: int):
    """Where the values of n = a packed softmax's p.T may be non-zero (bool, n's shape), or
    None where that is not known: p.T = f16(e / sum(e)), e = exp(c * (where(cond, s, -inf) -
    max)) with cond a constant, c > 0, the max and the sum over axis 0 of the same operand; the
    rows cond drops are exp(-inf) = 0. (A column whose max is not a number has no such zeros,
    but then each of its kept values is NaN too, and so is every product row that reads the
    column: a tfold may read those rows as zeros, lowering/movement.tfold.)"""
    n = g.node(nid)
    if n.op == "cast" and n.dtype in ("f16", "f32"):
        n = g.node(n.inputs[0])
    if n.op != "div" or not _over_keys(g, n, "sum"):
        return None
    e = g.node(n.inputs[0])
    if e.op != "exp":
        return None
    x = g.node(e.inputs[0])
    if x.op == "mul":
        c = g.node(x.inputs[1])
        if c.op != "const" or c.shape != () or not float(np.asarray(c.attrs["value"])) > 0:
            return None
        x = g.node(x.inputs[0])
    if x.op != "sub" or not _over_keys(g, x, "max"):
        return None
    w = g.node(x.inputs[0])
    if w.op != "where":
        return None
    cond, other = (g.node(i) for i in (w.inputs[0], w.inputs[2]))
    if cond.op != "const" or other.op != "const" or other.shape != () or \
            float(np.asarray(other.attrs["value"])) != -np.inf:
        return None
    keep = np.broadcast_to(np.asarray(cond.attrs["value"]) != 0, w.shape)
    if keep.shape != tuple(g.node(nid).shape):
        return None
    return keep | ~keep.any(axis=0)          # (a column cond drops whole: NaN throughout)
