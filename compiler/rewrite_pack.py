"""Pass `pack_heads` (after `rewrite`): the score matmuls of attention heads that lie in one
chunk of lanes computed as one matmul.

A head's score (computed transposed by `rewrite`) is sT_h = k_h @ q_h.T, k_h and q_h slices of
HD columns of K [Nk, D] and Q [Nq, D]. With HD well under the lanes, each such product uses HD
of the weight rows of an MXM install and Nq of its output lanes, and every head's slices are
lane moves (SXM PERMUTEs) of Q and K. The P heads whose columns lie in one chunk c of lanes
are computed together instead:

    Qm = (Q[:, c] * M).reshape(P * Nq, W)    M [P, 1, W]: row j is 1 on head j's columns, else 0
    S  = K[:, c] @ Qm.T                      [Nk, P * Nq]: S[:, j*Nq:(j+1)*Nq] = sT_j

K[:, c] and Q[:, c] are whole chunks (views), the products with the zeros of M add nothing,
and the MXM makes ceil(P * Nq / lanes) output chunks where the heads made P * ceil(Nq /
lanes). Each head then takes its lanes of S (a lane move where they do not start a chunk).
Applied where it makes fewer output chunks (the MXM's work) and every head's columns lie in
one chunk. f16 products with 1.0 and 0.0 are exact; the f32 sums add the same products (and
zeros) in another order than the reference (its tolerance).
"""
from __future__ import annotations

import math

import numpy as np

from lpu.compiler.ir import IRGraph
from lpu.compiler import ops
from lpu.compiler.rewrite import DROP, copied, rebuild, rebuilding, rebuilt

CHAINS = 2           # accumulators split_joins sums the heads' products in (see there)
ROUND_AFTER = "div"  # the op of the softmax after which split_joins' f16(v_h @ W_h) is lowered (see there)
DECODE_ROWS = 16     # a product of at most this many rows is a decode step's (lower_mxm.FEW_ROWS)


def _head(g: IRGraph, n, lanes):
    """(K id, Q id, c0, c1) of a head's score sT = k[:, c0:c1] @ q[:, c0:c1].T, or None."""
    if n.op != "matmul" or len(n.shape) != 2:
        return None
    b, t = (g.node(i) for i in n.inputs)
    if t.op != "transpose" or list(t.attrs["perm"]) != [1, 0]:
        return None
    a = g.node(t.inputs[0])
    if a.op != "slice" or b.op != "slice" or a.dtype != "f16" or b.dtype != "f16":
        return None
    kk, qq = g.node(b.inputs[0]), g.node(a.inputs[0])
    if len(kk.shape) != 2 or len(qq.shape) != 2 or kk.shape[1] != qq.shape[1]:
        return None
    ib, ia = b.attrs["index"], a.attrs["index"]
    if len(ib) != 2 or len(ia) != 2 or isinstance(ib[1], int) or tuple(ib[1]) != tuple(ia[1]):
        return None
    if tuple(ib[0]) != (0, kk.shape[0]) or tuple(ia[0]) != (0, qq.shape[0]):
        return None
    c0, c1 = ib[1]
    if c0 // lanes != (c1 - 1) // lanes:
        return None
    return kk.id, qq.id, c0, c1


def _packs(g: IRGraph, lanes) -> dict:
    """score matmul id -> (pack key, index in the pack); packs of 2 or more that pay."""
    groups: dict = {}
    for n in g.nodes():
        h = _head(g, n, lanes)
        if h is not None:
            kid, qid, c0, c1 = h
            groups.setdefault((kid, qid, c0 // lanes), []).append((c0, c1, n.id))
    out = {}
    for key, heads in groups.items():
        heads.sort()
        if any(heads[i][1] > heads[i + 1][0] for i in range(len(heads) - 1)):
            continue                      # overlapping columns: not heads
        nq = g.node(heads[0][2]).shape[1]
        p = len(heads)
        if p < 2 or -(-p * nq // lanes) >= p * -(-nq // lanes):
            continue
        for j, (_, _, nid) in enumerate(heads):
            out[nid] = (key, j, tuple(heads))
    return out


def _region(g: IRGraph, s, nk, nq) -> list | None:
    """The nodes downstream of score s, in id order, that work on its [nk, nq] values column by
    column: elementwise ops (other operands scalar constants or [nk, nq] constants, e.g. the
    causal mask) and reductions over axis 0 ([1, nq]), the inputs of each in the region or
    constants; None if a reduction's result leaves it (a column would lose its head)."""
    region, todo = {s}, [s]
    while todo:
        for u in g.users(todo.pop()):
            un = g.node(u)
            if u in region:
                continue
            ok = (un.op in ops.ELEMENTWISE or un.op in ops.REDUCE and un.attrs.get("axis") == 0) \
                and un.shape in ((nk, nq), (1, nq)) and len(un.shape) == 2
            ok = ok and all(i in region or g.node(i).op == "const" and g.node(i).shape in ((), (nk, nq))
                            for i in un.inputs)
            if ok:
                region.add(u)
                todo.append(u)
    out = sorted(region)
    if not any(g.node(x).op in ops.REDUCE for x in out):
        return None                       # (not a softmax over transposed scores)
    for x in out:
        if g.node(x).shape != (nk, nq) and any(u not in region for u in g.users(x)):
            return None
    return out


def _same(g: IRGraph, ra: list, rb: list) -> bool:
    """Two heads' regions the same ops on the same constants, input by input."""
    if len(ra) != len(rb):
        return False
    pa, pb = {x: i for i, x in enumerate(ra)}, {x: i for i, x in enumerate(rb)}
    for x, y in zip(ra, rb):
        nx_, ny = g.node(x), g.node(y)
        if nx_.op != ny.op or nx_.dtype != ny.dtype:
            return False
        if x == ra[0]:
            continue
        if nx_.attrs != ny.attrs:
            return False
        for i, j in zip(nx_.inputs, ny.inputs):
            if (i in pa) != (j in pb) or (i in pa and pa[i] != pb[j]):
                return False
            if i not in pa and not np.array_equal(np.asarray(g.node(i).attrs["value"]),
                                                  np.asarray(g.node(j).attrs["value"])):
                return False
    return True


def pack_heads(g: IRGraph, lanes: int) -> IRGraph:
    packs = _packs(g, lanes)
    if not packs:
        return g
    regions: dict = {}          # pack key -> [region of each head] (whole softmax packed) or None
    for nid, (key, j, heads) in packs.items():
        if key in regions:
            continue
        nk, nq = g.node(nid).shape
        rs = [_region(g, h[2], nk, nq) for h in heads]
        ok = all(r is not None for r in rs) and all(_same(g, rs[0], r) for r in rs[1:])
        regions[key] = rs if ok else None
    packs = {nid: v for nid, v in packs.items() if regions[v[0]] is not None}   # (measured: the
    #       scores alone packed, each head taking its lanes back by a move, were slower)
    if not packs:
        return g
    where: dict = {}            # region node of a head -> (pack key, position in the region, head)
    for key, rs in regions.items():
        for j, r in enumerate(rs or ()):
            for i, x in enumerate(r):
                where[x] = (key, i, j)
    new = rebuilding(g)
    m: dict[int, int] = {}
    made: dict = {}                       # pack key -> new ids of its packed region
    trans: dict = {}                      # (pack key, position) -> new id of the packed node transposed
    half: dict = {}                       # (pack key, position) -> new id of the packed node in f16
    first: dict[int, int] = {}
    consts: dict = {}                     # (chunk, k, dtype, shape, bytes) -> new id of that constant
    at = [0, 0]                           # (chunk, constants made so far) of the pack being made
    for n in g.nodes():
        first[n.id] = len(new)

        def add(op, inputs, shape, dtype, attrs):
            if op != "const":
                return new.add(op, inputs, shape, dtype, attrs, n.line, n.col)
            v = np.asarray(attrs["value"])      # the k-th constant of chunk ch's pack, one node for
            at[1] += 1                          # every layer (their masks are alike); packs of one
            key = (at[0], at[1], dtype, tuple(shape), v.tobytes())    # layer keep their own (one
            if key not in consts:                                     # bank read a cycle each)
                consts[key] = new.add(op, inputs, shape, dtype, attrs, n.line, n.col)
            return consts[key]

        if n.id in packs and packs[n.id][0] not in made:
            key, _, heads = packs[n.id]
            at[:] = [key[2], 0]
            made[key] = _packed(g, add, m, key, heads, regions[key], n, lanes)
        if n.id in where or n.id in packs:
            key, i, j = where.get(n.id) or (packs[n.id][0], 0, packs[n.id][1])
            nk, nq = n.shape
            src, dt = made[key][i], n.dtype
            if dt == "f32" and _weights_only(g, n.id):    # the MXM rounds them to f16: round the
                if (key, i) not in half:                  # packed tensor once, move half the bytes
                    half[key, i] = add("cast", (src,), new.node(src).shape, "f16", {"to": "f16"})
                src, dt = half[key, i], "f16"
            m[n.id] = add("slice", (src,), n.shape, dt, {"index": ((0, nk), (j * nq, (j + 1) * nq))})
            continue
        src = n.inputs[0] if n.inputs else None
        if n.op == "transpose" and src in where and list(n.attrs["perm"]) == [1, 0]:
            key, i, j = where[src]
            pk = made[key][i]
            if (key, i) not in trans:
                ps = new.node(pk).shape
                trans[key, i] = add("transpose", (pk,), ps[::-1], n.dtype, {"perm": (1, 0)})
            nq, nk = n.shape              # a row slice of the packed transpose: a view
            m[n.id] = add("slice", (trans[key, i],), n.shape, n.dtype,
                          {"index": ((j * nq, (j + 1) * nq), (0, nk))})
            continue
        m[n.id] = copied(new, n, m)
    return rebuilt(g, new, m, first)


def _weights_only(g: IRGraph, nid) -> bool:
    """nid's users are matmuls that take it as their weights (B) only."""
    us = g.users(nid)
    return bool(us) and all(g.node(u).op == "matmul" and g.node(u).inputs[1] == nid
                            and g.node(u).inputs[0] != nid for u in us)


def _scale(g: IRGraph, rs) -> tuple[int, float] | None:
    """(id, factor) of the region's op scores * c when c is a power of two and the scores have no
    other user: folded into Q's mask, exactly (f16 products with a power of two, and the f32 sums
    of products scaled by one, round the same; barring underflow)."""
    if rs is None:
        return None
    us = g.users(rs[0][0])
    if len(us) != 1 or g.node(us[0]).op != "mul":
        return None
    x = g.node(us[0])
    other = [i for i in x.inputs if i != rs[0][0]]
    if len(other) != 1 or g.node(other[0]).op != "const" or g.node(other[0]).shape != ():
        return None
    v = float(np.asarray(g.node(other[0]).attrs["value"]))
    if not (v > 0 and math.frexp(v)[0] == 0.5 and 2.0 ** -8 <= v <= 1):
        return None
    return x.id, v


def _packed(g: IRGraph, add, m, key, heads, rs, n, lanes) -> list:
    """New ids of the packed scores and (rs: the heads' regions) of each region node packed."""
    kid, qid, ch = key
    nk, nq = n.shape
    d = g.node(kid).shape[1]
    lo, hi = ch * lanes, min(d, (ch + 1) * lanes)
    w, p = hi - lo, len(heads)
    kc = add("slice", (m[kid],), (nk, w), "f16", {"index": ((0, nk), (lo, hi))})
    q = g.node(qid)
    qt = q.dtype
    # Q = f16(x) is rounded in the masks' own chains (the cast of x's chunk, broadcast over the
    # heads, is a producer fused into the mask: lower_fuse._fits), so Q's rows make no trip
    # through SRAM between the product and the masks (attention_prefill 1,078 -> 1,031)
    src, st = m[qid], qt
    if q.op == "cast" and qt == "f16" and g.node(q.inputs[0]).shape == q.shape:
        src, st = m[q.inputs[0]], g.node(q.inputs[0]).dtype
    qc = add("slice", (src,), (nq, w), st, {"index": ((0, nq), (lo, hi))})
    q3 = add("reshape", (qc,), (1, nq, w), st, {"shape": (1, nq, w)})
    if st != qt:
        q3 = add("cast", (q3,), (1, nq, w), qt, {"to": qt})
    fold = _scale(g, rs)
    mask = np.zeros((p, nq, w), np.float16)     # a vector per row: rows sharing one would
    for i, (c0, c1, _) in enumerate(heads):      # queue on its bank (one read a cycle)
        mask[i, :, c0 - lo:c1 - lo] = fold[1] if fold else 1
    mc = add("const", (), mask.shape, "f16", {"value": mask})
    # f16(x) is masked, not x (f16(x * mask) rounded a head each was measured 1,099 against
    # 1,078 for f16(x) rounded once, then masked; rounded in the masks' chains: 1,031)
    qm3 = add("mul", (q3, mc), (p, nq, w), qt, {})
    if qt != "f16":
        qm3 = add("cast", (qm3,), (p, nq, w), "f16", {"to": "f16"})
    qm = add("reshape", (qm3,), (p * nq, w), "f16", {"shape": (p * nq, w)})
    qmt = add("transpose", (qm,), (w, p * nq), "f16", {"perm": (1, 0)})
    out = [add("matmul", (kc, qmt), (nk, p * nq), n.dtype, {})]
    if rs is None:
        return out
    pos = {x: i for i, x in enumerate(rs[0])}
    consts: dict = {}
    late = None if fold else _late_scale(g, rs)
    for x in rs[0][1:]:
        if fold and x == fold[0] or late and x == late[0]:
            out.append(out[0])
            continue
        xn = g.node(x)
        ins = []
        for i in xn.inputs:
            if i in pos:
                ins.append(out[pos[i]])
                continue
            c = g.node(i)
            if i not in consts:
                v = np.asarray(c.attrs["value"])
                v = np.tile(v, (1, p)) if c.shape else v
                consts[i] = add("const", (), v.shape, c.dtype, {"value": v})
            ins.append(consts[i])
        out.append(add(xn.op, tuple(ins), (xn.shape[0], p * xn.shape[1]), xn.dtype, dict(xn.attrs)))
        if late and x == late[1]:
            c = add("const", (), (), xn.dtype, {"value": np.asarray(late[2], np.float32)})
            out[-1] = add("mul", (out[-1], c), (xn.shape[0], p * xn.shape[1]), xn.dtype, {})
    return out


def _late_scale(g: IRGraph, rs) -> tuple[int, int, float] | None:
    """(id of scores * c, id of the softmax's x - max(x), c) when c > 0 is a scalar constant that
    _scale cannot fold and the scaled scores reach the softmax only through where(mask, ., -inf):
    c * (x - max(x)) instead of c * x - max(c * x) (max commutes with a positive scale; the f32
    roundings differ within the reference's tolerance), so that the product joins the exp's
    fused chain instead of making its own trip to SRAM before the mask."""
    if rs is None or len(rs[0]) < 4:
        return None
    s = rs[0][0]
    us = g.users(s)
    if len(us) != 1 or g.node(us[0]).op != "mul":
        return None
    x = g.node(us[0])
    other = [i for i in x.inputs if i != s]
    if len(other) != 1 or g.node(other[0]).op != "const" or g.node(other[0]).shape != () or x.dtype != "f32":
        return None
    c = float(np.asarray(g.node(other[0]).attrs["value"]))
    wu = g.users(x.id)
    if not c > 0 or len(wu) != 1 or g.node(wu[0]).op != "where":
        return None
    w = g.node(wu[0])
    fill = g.node(w.inputs[2])
    if w.inputs[1] != x.id or fill.op != "const" or fill.shape != () or float(np.asarray(fill.attrs["value"])) != -np.inf:
        return None
    users = sorted(g.users(w.id), key=lambda u: g.node(u).op)
    if [g.node(u).op for u in users] != ["max", "sub"]:
        return None
    mx, sb = (g.node(u) for u in users)
    if mx.attrs.get("axis") != 0 or tuple(sb.inputs) != (w.id, mx.id) or g.users(mx.id) != [sb.id]:
        return None
    return x.id, sb.id, c


def _split_join(g: IRGraph, n, lanes) -> bool:
    """n = concat(x_h, axis=1) @ W with the concat used only there, its pieces narrower than
    the lanes and 2-D: each x_h takes its rows of W instead (see split_joins)."""
    if n.op != "matmul" or len(n.shape) != 2:
        return False
    c, w = (g.node(i) for i in n.inputs)
    if c.op != "concat" or c.attrs["axis"] not in (1, -1) or len(c.shape) != 2 or len(w.shape) != 2:
        return False
    if g.users(c.id) != [n.id] or len(c.inputs) < 2 or c.id in g.outputs.values():
        return False
    return all(len(g.node(i).shape) == 2 and g.node(i).shape[1] < lanes for i in c.inputs) and _last(g, n.id)


def _last(g: IRGraph, nid) -> bool:
    """nid feeds only outputs (through casts): nothing waits for the MXM after it. (Measured:
    where an MLP follows, as in the gpt2 and llama blocks, the extra products cost more than
    the lane moves they save.)"""
    us = g.users(nid)
    return bool(us) and all(g.node(u).op == "output" or g.node(u).op == "cast" and _last(g, u) for u in us)


def split_joins(g: IRGraph, lanes: int) -> IRGraph:
    """concat(x_h, axis=1) @ W = sum_h x_h @ W[rows of h], at the end of a program: the heads'
    outputs, each narrower than the lanes, are not moved to their lanes of one vector (an SXM
    permute per head and row, and VXM adds); each feeds the MXM with its own rows of W (views:
    a product per head and row where the join made one per row) and the products are added
    (in f32, in another order than the reference's one dot product).

    A head's output x_h = f16(p_h @ v_h) whose product with its rows W_h of W costs no more
    output chunks than p_h @ v_h (W no wider than the lanes, as v_h is) is computed as
    p_h @ f16(v_h @ W_h) instead (`_absorbed`): v_h @ W_h runs while the softmax makes p_h (v_h
    is ready long before; lowered after the softmax's max, `_anchor`), and the path from p_h to the output has one product, not two (and
    no f16 pass between them). The rounding moves from the head's output to v_h @ W_h (both f16
    before an MXM product; the reference's tolerance). Its rounding f16(v_h @ W_h) is lowered
    later, after the softmax's ROUND_AFTER (its division): lowered with the product, its chains
    had taken the VXM's ALUs and the near slices' banks first, and the exponentials' chains,
    which wait for the max, came 3 to 5 cycles apart (measured on attention_prefill, tsp-v1:
    793 -> 784 after the sum; after the exponentials 784, the division 811; with the products
    themselves after the sum, 816; with the weights on their product's side,
    placement.joined_region: after the max 788, the exponentials 764, the sum 763, the
    division 758; with lower_reduce.FIRST_ROWS 4, FIRST_GROUPS 5, SUM_GROUPS 6: the sum 754,
    the division 745).

    Past DECODE_ROWS rows the products are summed in CHAINS accumulators, not by VXM adds: a
    product after the first of its accumulator takes the one before as a third operand,
    matmul(a, b, c) = a @ b + c, c left in the accumulators it was made in (plan kind `acc`,
    lower_mxm: those heads are the K-tiles of one product, one ACC per row), and the
    accumulators' results are added. Measured on attention_prefill (tsp-v1, rows on their
    pair's side, placement.side_of): 1,598 (adds) -> 1,445 with two accumulators (heads 0-1 and
    2-3, one per plane pair); one: 1,539, or 1,501 with its rows split over both pairs."""
    todo = {n.id for n in g.nodes() if _split_join(g, n, lanes)}
    if not todo:
        return g
    absorb = {}            # head product p_h @ v_h -> (its cast, W id, W's row offset)
    for nid in todo:
        c, w = (g.node(i) for i in g.node(nid).inputs)
        off = 0
        for i in c.inputs:
            pv = _absorbed(g, i, w, lanes)
            if pv is not None:
                absorb[pv] = (i, w.id, off)
            off += g.node(i).shape[1]
    casts = {i: pv for pv, (i, _, _) in absorb.items()}
    after: dict[int, list] = {}      # node -> the heads' products to make right after it: v_h
    for pv in absorb:                # or p_h's last product (its score), whichever comes later
        p, v = g.node(pv).inputs
        anchor = _anchor(g, p)
        after.setdefault(max(v, anchor), []).append((pv, anchor))
    rounded: dict[int, list] = {}    # node -> (head's cast, v_h @ W_h, anchor) to round right after it

    def node(new, n, m):
        if n.id in absorb or n.id in casts:      # made after v_h; only its cast used it
            return DROP
        if n.id not in todo:
            m[n.id] = copied(new, n, m)
            for pv, anchor in after.get(n.id, ()):     # f16(v_h @ W_h), lowered after the anchor
                cast, wid, off = absorb[pv]
                w, v = g.node(wid), g.node(g.node(pv).inputs[1])
                wr = new.add("slice", (m[wid],), (v.shape[1], w.shape[1]), w.dtype,
                             {"index": ((off, off + v.shape[1]), (0, w.shape[1]))}, n.line, n.col)
                vw = new.add("matmul", (m[v.id], wr), (v.shape[0], w.shape[1]), "f32", {"after": m[anchor]},
                             n.line, n.col)
                late = max(anchor, _anchor(g, g.node(pv).inputs[0], ROUND_AFTER))
                rounded.setdefault(max(n.id, late), []).append((cast, vw, late))
            for cast, vw, late in rounded.pop(n.id, ()):
                attrs = {"to": "f16", "after": m[late]} if late >= 0 else {"to": "f16"}
                m[cast] = new.add("cast", (vw,), new.node(vw).shape, "f16", attrs, n.line, n.col)
            return m[n.id]
        c, w = (g.node(i) for i in n.inputs)
        parts, off = [], 0
        run = -(-len(c.inputs) // CHAINS) if n.shape[0] > DECODE_ROWS else 1   # products per accumulator
        for j, i in enumerate(c.inputs):
            x = g.node(i)
            k = x.shape[1]
            acc = tuple(parts[-1:]) if j % run else ()
            if i in casts:          # p_h @ f16(v_h @ W_h)
                p = g.node(casts[i]).inputs[0]
                parts.append(new.add("matmul", (m[p], m[i]) + acc, n.shape, n.dtype, {}, n.line, n.col))
            else:
                wr = new.add("slice", (m[w.id],), (k, w.shape[1]), w.dtype, {"index": ((off, off + k), (0, w.shape[1]))},
                             n.line, n.col)
                parts.append(new.add("matmul", (m[i], wr) + acc, n.shape, n.dtype, {}, n.line, n.col))
            off += k
        parts = parts[run - 1::run] + ([parts[-1]] if len(parts) % run else [])
        while len(parts) > 1:
            odd = parts[-1:] if len(parts) % 2 else []
            parts = [new.add("add", (parts[j], parts[j + 1]), n.shape, n.dtype, {}, n.line, n.col)
                     for j in range(0, len(parts) - 1, 2)] + odd
        return parts[0]
    return rebuild(g, node)


def _anchor(g: IRGraph, nid, op: str = "max") -> int:
    """The node after which v_h @ W_h is lowered, for a head whose probabilities are nid: the
    softmax's max (the latest max that nid depends on without a matmul between; `op`: the latest
    such node of that op), where the MXM waits for the reduction, else the latest such matmul
    (its score; -1 if none). Measured on attention_prefill (tsp-v1) after: the score product
    1,674 cycles, the mask 1,662, the max 1,626, the exp 1,637, the division 1,648, the f16
    rounding 1,642, the transpose 1,656; later, with the exps' first level of the sum in their
    chains (lower_fuse._block_chains): the max 880, the exp 831, the sum 823, the division 849,
    the rounding 889 (lowered after the max, the products' casts and the exps' chains had
    taken turns on the streams and the VXM: the exps spread over 93 cycles, not 36). With the
    folds' columns fed straight to their products (movement.fold_feed) the max again: 813 -> 793
    (NEAR_SLICES 20, 30, 44 with the max: 807, 793, 784; gpt2_block_prefill 3,229 either way at
    30)."""
    seen, todo, best = set(), [nid], {op: -1, "matmul": -1}
    while todo:
        i = todo.pop()
        if i in seen:
            continue
        seen.add(i)
        n = g.node(i)
        if n.op in best:
            best[n.op] = max(best[n.op], i)
            if n.op == "matmul":
                continue
        todo.extend(n.inputs)
    return best[op] if best[op] >= 0 else best["matmul"]


def _absorbed(g: IRGraph, xid, w, lanes):
    """The product p_h @ v_h of a joined head x_h = f16(p_h @ v_h) (each used only there, 2-D,
    v_h f16) that can take W_h into v_h: p_h @ (v_h @ W_h) makes no more output chunks than
    p_h @ v_h, and p_h has more than a decode step's few rows (decode heads are rewritten by
    rewrite_decode). None otherwise."""
    x = g.node(xid)
    if x.op != "cast" or x.dtype != "f16" or len(g.users(x.inputs[0])) != 1:
        return None
    pv = g.node(x.inputs[0])
    if pv.op != "matmul" or len(pv.shape) != 2 or pv.dtype != "f32":
        return None
    p, v = (g.node(i) for i in pv.inputs)
    if v.dtype != "f16" or len(v.shape) != 2 or p.shape[0] <= DECODE_ROWS:
        return None
    if math.ceil(w.shape[1] / lanes) > math.ceil(v.shape[1] / lanes):
        return None
    return pv.id
