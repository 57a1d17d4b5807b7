"""Pass `decode_heads` (after `heads_rope`): a decode step's attention heads read the KV cache
where it lies, at the heads' lane offsets, instead of copies of each head's lanes.

A head's columns [c0, c1) of a row q and of the caches k and v sit at a lane offset within one
vector chunk. Its score row q[:, c0:c1] @ k[rows, c0:c1].T and its output p @ v[rows, c0:c1]
took copies of those lanes moved to lane 0 (an SXM permute per cache row and head every step,
and one for the query on the step's critical path), and the heads' outputs were moved back to
their lanes by the concat (another trip). Here:

- scores: (q[:, chunk] * mask) @ k[rows, chunk].T, the mask 1 on the head's lanes and 0
  elsewhere: the MXM installs the cache's own rows (views) and the other heads' lanes meet
  zeros. The products are exact and added exactly before the one rounding to f32 (the MXM's
  contract, docs/accumulation.md), so every score is the one the head's own product gives.
  A query that is the rope of the head's slice (llama) is the slice of one rope of the row with
  the tables per head (attr `hd`, as heads_rope makes for k): the same value in every lane.
- outputs joined by concat(heads, axis=1), each head at its own columns of v: p @ v[rows,
  chunk] puts the head's output in its own lanes (the MXM computes every lane of the chunk; the
  other lanes hold other heads' sums), the heads of a chunk are combined by masks (x * 1 and
  x * 0 + y are exact), then cast as each head was. No lane moves.
- the heads of one chunk whose softmax chains agree (the same ops and constants from the score
  to p) are rows of one product each way: q[:, chunk] * masks (a row per head) @ k[rows,
  chunk].T, each head's softmax on its own row (row views, spread over both SXMs as before),
  the rows of p joined in place (plan kind `joined`) @ v[rows, chunk], then the masked rows
  summed across vectors (exact: each lane adds zeros to one head's value). One weight install
  per chunk instead of one per head (the installs of one plane pair are serial).
- the max and the sum of a single row of w <= lanes / 2 (a decode head's scores) that only
  elementwise ops of the row use are splats over the row's own lanes (attrs `splat`, `window`:
  rotations by -(w-1) .. w, lower_lanes.lane_plan), read as they are: no DISTRIBUTE trip (two
  of a head's four SXM trips). Measured: llama_block_decode 2,224 -> 2,128 cycles,
  gpt2_block_decode 2,128 -> 2,098, attention_decode 1,263 -> 1,210, gpt2_small_decode 36,692
  -> 35,151 (the splat over all the lanes, radices multiplying to 320: llama 2,177, gpt2 block
  2,116).
  Measured: llama_block_decode 2,520 -> 2,224 cycles, gpt2_block_decode 2,308 -> 2,128,
  gpt2_small_decode 37,820 -> 36,692 (one head per score and output product, the
  installs as many as before: 2,459, 2,158 and, L=2, 6,765 against 6,721).
- a power-of-two score scale (1 / sqrt(64)) is folded into the queries' masks (_scale), and
  then the score product fills the lanes past each row's end with the row's own scores (attr
  `fill`: the transposed install's buffer rows past N repeat the cache rows, where they were
  zeros), so the max's lane tree, which sees lanes past the row, needs no MASK to -inf first
  (attr `filled`): the max rotates the product's row itself, two VXM chains (the scale, the
  mask) fewer on every head's path. Measured, with the rows' SXMs chosen by lower_lanes._side:
  llama_block_decode 1,950 -> 1,917, gpt2_block_decode 2,001 -> 1,977, gpt2_small_decode
  31,948 -> 31,390 (the fold alone: llama 1,928, gpt2_block 2,038).
- a stacked chunk's p = e / sum(e) (the sum an MXM splat as below, used only there) is divided
  after the output product: (f16(e) rows @ v[rows, chunk]) / the rows' sums, so the sums' trip
  to the MXM and the product run side by side (e rounded to f16 where p was: the same rounding
  before the product, the division in f32 after it; the sums made w lanes wide, as the output
  rows are). Measured: llama_block_decode 1,860 -> 1,758, gpt2_block_decode 1,965 -> 1,816,
  gpt2_small_decode 30,626 -> 30,074 (the sums as lanes-wide splats, sliced to w: 1,793,
  1,851, 30,374; a lane slice of a chunk is a copy). The heads' sums are joined by the same
  masks as their outputs (off the path: they are ready before the product) and the joined row
  divided once, where each head's row was: llama 1,721, gpt2_block 1,773, gpt2_small 29,396.
  A lone head's p @ v (not stacked: attention_decode's heads, each multiplied by its rows of wo,
  rewrite_pack.split_joins) the same way, its sum N lanes wide: attention_decode 1,035 -> 915.
- the sum of such an f32 row (softmax's sum of exp) goes through the MXM instead: hi = f16(e)
  and lo = f16(e - hi) as the two rows of one product with ones[w, lanes] (joined in place: one
  install), their sums added (the products with 1.0 exact, each sum rounded to f32 once; e kept
  to about 22 bits, or 2^-24 absolutely where lo is subnormal, against a sum of at least 1, e's
  largest being 1), the sum in every lane: one trip to the MXM where a lane tree takes 2 trips
  to the SXM and back. Measured: llama_block_decode 2,095 -> 2,001 -> 1,950 cycles (hi and lo
  as two products, then as one; the heads' max trees alternating between the SXMs in between,
  lower_reduce: 1,967), gpt2_block_decode 2,098 -> 2,041 -> 2,001, attention_decode 1,127 ->
  1,054 -> 1,035, gpt2_small_decode 33,202 -> 33,064 -> 31,948. All the heads of a chunk as
  the rows of one such product (2 h rows): llama 1,988-2,003.

Only for single-row products (decode) of 2-D operands whose head slices do not straddle chunks.
The stacked products carry attr `heads`, the sums' products attr `hilo` (lower.py still treats
the step as decode).
"""
from __future__ import annotations

import math

import numpy as np

from lpu.compiler import ops
from lpu.compiler.ir import IRGraph
from lpu.compiler.rewrite import copied, rebuilding, rebuilt
from lpu.isa.dtypes import NP_DTYPE


def _cols(g: IRGraph, s, lanes):
    """(source id, index of the other axes, c0, c1) of a slice with a 2-D result taking columns
    [c0, c1) of its source within one chunk (narrower than it), else None."""
    if s.op != "slice" or s.attrs.get("splat") or len(s.shape) != 2:
        return None
    src = g.node(s.inputs[0])
    idx = tuple(s.attrs["index"])
    if len(src.shape) < 2 or len(idx) != len(src.shape) or isinstance(idx[-1], int):
        return None
    c0, c1 = idx[-1]
    if c1 - c0 >= lanes or c0 // lanes != (c1 - 1) // lanes:
        return None
    return src.id, idx[:-1], c0, c1


def _chunk(c0, width, lanes):
    lo = c0 // lanes * lanes
    return lo, min(lo + lanes, width)


def _query(g: IRGraph, a, c0, c1, lanes):
    """(row id, rope key or None) where a is lanes [c0, c1) of a [1, W] row (or the rope of
    them, per head of c1 - c0 columns), else None."""
    rope = None
    if a.op == "rope" and "hd" not in a.attrs and len(g.users(a.id)) == 1:
        hd = c1 - c0
        rope = (a.attrs.get("pos", 0), a.attrs.get("theta", 10000.0), hd)
        if a.dtype != g.node(a.inputs[0]).dtype:
            return None
        a = g.node(a.inputs[0])
    if a.op != "slice" or a.shape[0] != 1:
        return None
    got = _cols(g, a, lanes)
    if got is None or got[2:] != (c0, c1) or got[1] != ((0, 1),):
        return None
    q = g.node(got[0])
    if q.shape[0] != 1 or (rope and (c0 % rope[2] or q.shape[1] % rope[2] or rope[2] % 2)):
        return None
    return q.id, rope


def _score(g: IRGraph, n, lanes):
    """(q row, rope key, k source, rows, c0, c1) for a decode score q_h @ k[rows, c0:c1].T."""
    if n.op != "matmul" or len(n.shape) != 2 or n.shape[0] != 1:
        return None
    a, t = (g.node(i) for i in n.inputs)
    if t.op != "transpose" or tuple(t.attrs["perm"]) != (1, 0) or g.users(t.id) != [n.id]:
        return None
    ks = _cols(g, g.node(t.inputs[0]), lanes)
    if ks is None:
        return None
    k, rows, c0, c1 = ks
    q = _query(g, a, c0, c1, lanes)
    if q is None or g.node(q[0]).shape[1] != g.node(k).shape[-1]:
        return None
    return q[0], q[1], k, rows, c0, c1


def _head_out(g: IRGraph, x, off, width, lanes):
    """(matmul id, cast dtype or None, v source, rows) where x, at columns [off, ...) of a
    concat, is p @ v[rows, off:off + w] (perhaps cast), used only there, else None."""
    cast = None
    if x.op == "cast":
        if len(g.users(x.inputs[0])) != 1:
            return None
        cast, x = x.dtype, g.node(x.inputs[0])
    if x.op != "matmul" or x.shape[0] != 1 or len(x.shape) != 2:
        return None
    vs = _cols(g, g.node(x.inputs[1]), lanes)
    if vs is None or vs[2] != off or g.node(vs[0]).shape[-1] != width:
        return None
    return x.id, cast, vs[0], vs[1]


def _joined(g: IRGraph, n, lanes):
    """[(chunk lo, hi, [(matmul, cast, v, rows, c0, c1), ...]), ...] for a concat of the heads'
    outputs at their own columns of v, else None."""
    if n.op != "concat" or len(n.shape) != 2 or n.shape[0] != 1 or n.attrs["axis"] not in (1, -1):
        return None
    heads, off = [], 0
    for i in n.inputs:
        x = g.node(i)
        if g.users(i) != [n.id]:
            return None
        h = _head_out(g, x, off, n.shape[1], lanes)
        if h is None:
            return None
        heads.append(h + (off, off + x.shape[1]))
        off += x.shape[1]
    if len({h[1] for h in heads}) != 1 or len({(h[2], h[3]) for h in heads}) != 1:
        return None
    chunks = []
    for h in heads:
        lo, hi = _chunk(h[4], n.shape[1], lanes)
        if not chunks or chunks[-1][0] != lo:
            chunks.append((lo, hi, []))
        chunks[-1][2].append(h)
    return chunks


def _chain(g: IRGraph, scores: dict, mm):
    """The nodes from a head's score matmul to its probabilities p (mm = p @ v), in order, if
    only that chain uses them and its other operands are scalar constants, else None."""
    p = g.node(mm).inputs[0]
    anc, todo = {p}, [p]
    while todo:
        for i in g.node(todo.pop()).inputs:
            if i not in anc and i not in scores and g.node(i).op != "const":
                anc.add(i)
                todo.append(i)
    ss = {i for x in anc for i in g.node(x).inputs if i in scores} | ({p} & set(scores))
    if len(ss) != 1:
        return None
    s = ss.pop()
    chain = [s] + sorted(anc - {s})
    inside = set(chain)
    for x in chain:
        n = g.node(x)
        if x != s and any(i not in inside and not (g.node(i).op == "const" and g.node(i).size == 1) for i in n.inputs):
            return None
        if x != s and not any(i in inside for i in n.inputs):
            return None
        if any(u not in inside for u in g.users(x)) if x != p else g.users(x) != [mm]:
            return None
    return chain


def _same(g: IRGraph, a: list, b: list) -> bool:
    """Chains of the same ops on the same shapes, with equal scalar constants."""
    if len(a) != len(b):
        return False
    pos = {x: k for k, x in enumerate(a)}
    posb = {x: k for k, x in enumerate(b)}
    for x, y in zip(a[1:], b[1:]):
        nx, ny = g.node(x), g.node(y)
        if (nx.op, nx.dtype, nx.shape, nx.attrs) != (ny.op, ny.dtype, ny.shape, ny.attrs) or len(nx.inputs) != len(ny.inputs):
            return False
        for i, j in zip(nx.inputs, ny.inputs):
            if i in pos or j in posb:
                if pos.get(i) != posb.get(j):
                    return False
                continue
            ci, cj = g.node(i), g.node(j)
            if ci.dtype != cj.dtype or not np.array_equal(ci.attrs["value"], cj.attrs["value"]):
                return False
    return True


def _stackable(g: IRGraph, scores: dict, heads: list):
    """The heads of one chunk computed as rows of one score matmul, one softmax and one output
    matmul: [chain per head] if their queries, caches and chains agree, else None."""
    chains = [_chain(g, scores, h[0]) for h in heads]
    if any(c is None for c in chains):
        return None
    keys = {scores[c[0]][:4] for c in chains}
    if len(keys) != 1 or any(scores[c[0]][4:] != h[4:] for c, h in zip(chains, heads)):
        return None
    if not all(_same(g, chains[0], c) for c in chains[1:]):
        return None
    return chains


def _scale(g: IRGraph, sid) -> float | None:
    """c where a head's scores (sid) are used only as scores * c, c a power of two: folded into
    the queries' masks, exactly as rewrite_pack's fold (an f16 query times a power of two,
    barring underflow, and the f32 sums of products scaled by one round the same). (Another c
    as rewrite_pack's late scale, c * (s - max(s)), was slower: attention_decode 1,035 ->
    1,046.)"""
    us = g.users(sid)
    if len(us) != 1:
        return None
    x = g.node(us[0])
    other = [i for i in x.inputs if i != sid]
    if x.op != "mul" or len(other) != 1 or g.node(other[0]).op != "const" or g.node(other[0]).shape != ():
        return None
    v = float(np.asarray(g.node(other[0]).attrs["value"]))
    return v if v > 0 and math.frexp(v)[0] == 0.5 and 2.0 ** -8 <= v <= 1 else None


def _fillable(g: IRGraph, nid) -> bool:
    """nid's users read only its row's own lanes (elementwise ops) or take its max (whose lane
    tree may see lanes past the row: the score product fills them with the row's own scores)."""
    return all(g.node(u).op in ops.ELEMENTWISE or g.node(u).op == "max" for u in g.users(nid))


def _late_div(g: IRGraph, chain: list, lanes: int):
    """(index of e, index of sum(e)) in a head's chain that ends p = e / sum(e), the sum an f32
    row's alone (no other user): p @ v becomes (f16(e) @ v) / sum(e), so that the sum's trip to
    the MXM and the product's run side by side."""
    p = g.node(chain[-1])
    if p.op != "div" or p.dtype != "f32" or len(p.inputs) != 2:
        return None
    e, l = p.inputs
    if e not in chain or l not in chain or g.users(l) != [p.id]:
        return None
    ln, en = g.node(l), g.node(e)
    if ln.op != "sum" or ln.inputs[0] != e or ln.dtype != "f32" or en.dtype != "f32" or not _row_splat(g, ln, lanes):
        return None
    return chain.index(e), chain.index(l)


def _row_splat(g: IRGraph, n, lanes: int) -> bool:
    """A max or sum over a head's score row whose users are elementwise ops on that row: a lane
    tree of rotations that leaves the result in each of the row's own lanes (lower_reduce's
    window plan), read by them as it is: no DISTRIBUTE trip."""
    if n.op not in ("max", "sum") or n.attrs.get("axis") not in (1, -1) or n.shape != (1, 1):
        return False
    width = g.node(n.inputs[0]).shape[-1]
    return 2 * width <= lanes + 1 and all(g.node(u).op in ops.ELEMENTWISE and g.node(u).shape == (1, width) for u in g.users(n.id))


def decode_heads(g: IRGraph, lanes: int) -> IRGraph:
    """g with decode heads reading the caches in place (g itself if none)."""
    scores = {n.id: s for n in g.nodes() if (s := _score(g, n, lanes)) is not None}
    joins = {n.id: j for n in g.nodes() if (j := _joined(g, n, lanes)) is not None}
    if not scores and not joins and not any(_row_splat(g, n, lanes) for n in g.nodes()):
        return g
    new = rebuilding(g)
    m: dict[int, int] = {}
    first: dict[int, int] = {}
    shared: dict = {}

    def once(key, make):
        if key not in shared:
            shared[key] = make()
        return shared[key]

    def chunk_of(src, idx, nrows, lo, hi, n):
        return new.add("slice", (m[src],), (nrows, hi - lo), g.node(src).dtype, {"index": idx + ((lo, hi),)},
                       n.line, n.col)

    def hilo_sum(n, x, out=lanes):
        """The sum of the f32 row x in each of `out` lanes ([1, out]): hi @ ones + lo @ ones."""
        xn = new.node(x)
        w = xn.shape[-1]
        ones = once(("ones", w, out), lambda: new.add("const", (), (w, out), "f16",
                                                       {"value": np.ones((w, out), np.float16)}, n.line, n.col))
        hi = new.add("cast", (x,), xn.shape, "f16", {"to": "f16"}, n.line, n.col)
        hi2 = new.add("cast", (x,), xn.shape, "f16", {"to": "f16"}, n.line, n.col)   # (hi: the join's alone)
        lo = new.add("cast", (new.add("sub", (x, hi2), xn.shape, "f32", {}, n.line, n.col),), xn.shape, "f16",
                     {"to": "f16"}, n.line, n.col)
        hl = new.add("concat", (hi, lo), (2, w), "f16", {"axis": 0}, n.line, n.col)
        y = new.add("matmul", (hl, ones), (2, out), "f32", {"hilo": True}, n.line, n.col)
        a = new.add("slice", (y,), (1, out), "f32", {"index": ((0, 1), (0, out))}, n.line, n.col)
        b = new.add("slice", (y,), (1, out), "f32", {"index": ((1, 2), (0, out))}, n.line, n.col)
        return new.add("add", (a, b), (1, out), "f32", {}, n.line, n.col)

    def row_splat(n, x):
        xn = new.node(x)
        if n.op == "sum" and xn.dtype == "f32":     # hi @ ones + lo @ ones: one MXM trip
            wide = hilo_sum(n, x)
            if n.dtype != "f32":
                wide = new.add("cast", (wide,), (1, lanes), n.dtype, {"to": n.dtype}, n.line, n.col)
            return new.add("slice", (wide,), (1, 1), n.dtype, {"index": ((0, 1), (0, 1)), "splat": True}, n.line, n.col)
        filled = {"filled": True} if n.op == "max" and x in rows_of_filled else {}
        wide = new.add(n.op, (x,), (1, lanes), n.dtype, {**n.attrs, "splat": True, "window": True, **filled},
                       n.line, n.col)
        return new.add("slice", (wide,), (1, 1), n.dtype, {"index": ((0, 1), (0, 1)), "splat": True}, n.line, n.col)

    def query(q, rope, n):
        qn = g.node(q)
        if rope is None:
            return m[q]
        pos, theta, hd = rope
        return once(("rope", q, rope), lambda: new.add(
            "rope", (m[q],), qn.shape, qn.dtype, {"pos": pos, "theta": theta, "hd": hd}, n.line, n.col))

    def masks(h, width, spans, dtype, n, one=1.0):
        v = np.zeros((h, width), NP_DTYPE[dtype])
        for r, (a, b) in enumerate(spans):
            v[r, a:b] = one
        return once(("masks", width, tuple(spans), dtype, one),
                    lambda: new.add("const", (), (h, width), dtype, {"value": v}, n.line, n.col))

    def stacked(n, lo, hi, heads, chains):
        """The heads of chunk [lo, hi) as the rows of one score matmul, softmax and output."""
        h, w = len(heads), hi - lo
        q, rope, k, rows = info[chains[0][0]][:4]
        qn, s0 = g.node(q), g.node(chains[0][0])
        spans = [(c0 - lo, c1 - lo) for *_, c0, c1 in heads]
        qc = new.add("slice", (query(q, rope, s0),), (1, w), qn.dtype, {"index": ((0, 1), (lo, hi))}, s0.line, s0.col)
        fold = _scale(g, chains[0][0])
        qm = new.add("mul", (qc, masks(h, w, spans, qn.dtype, s0, fold or 1.0)), (h, w), qn.dtype, {}, s0.line, s0.col)
        nk = s0.shape[1]
        kt = new.add("transpose", (chunk_of(k, rows, nk, lo, hi, s0),), (w, nk), g.node(k).dtype, {"perm": (1, 0)},
                     s0.line, s0.col)
        scaled = {g.users(c[0])[0] for c in chains} if fold else set()     # (scores * c)
        fill = {"fill": True} if fold and all(_fillable(g, x) for x in scaled) else {}
        sc = new.add("matmul", (qm, kt), (h, nk), s0.dtype, {"heads": h, **fill}, s0.line, s0.col)
        ps, wides = [], []
        late = _late_div(g, chains[0], lanes)
        for r, chain in enumerate(chains):       # each head's softmax on its own row (views)
            sm = {chain[0]: new.add("slice", (sc,), (1, nk), s0.dtype, {"index": ((r, r + 1), (0, nk))},
                                    s0.line, s0.col)}
            if fill:
                rows_of_filled.add(sm[chain[0]])
            for x in chain[1:]:
                xn = g.node(x)
                if x in scaled:                  # (the scale is in the queries' masks)
                    sm[x] = sm[chain[0]]
                    continue
                if late and x == chain[late[1]]:     # the sum, divided by after p @ v
                    wides.append(hilo_sum(xn, sm[xn.inputs[0]], w))
                    continue
                if late and x == chain[-1]:          # e rounded to f16 (as the MXM takes p)
                    e = sm[chain[late[0]]]
                    ps.append(new.add("cast", (e,), (1, nk), "f16", {"to": "f16"}, xn.line, xn.col))
                    continue
                sm[x] = row_splat(xn, sm[xn.inputs[0]]) if _row_splat(g, xn, lanes) else copied(new, xn, {**m, **sm})
            if not late:
                ps.append(sm[chain[-1]])
        pn = g.node(chains[0][-1])
        pdt = "f16" if late else pn.dtype
        pj = new.add("concat", tuple(ps), (h, pn.shape[1]), pdt, {"axis": 0}, pn.line, pn.col) if h > 1 else ps[0]
        mm, cast, v, vrows = heads[0][:4]
        mn = g.node(mm)
        y = new.add("matmul", (pj, chunk_of(v, vrows, pn.shape[1], lo, hi, n)), (h, w), mn.dtype, {"heads": h},
                    mn.line, mn.col)
        sums = None
        if late:
            sums = new.add("concat", tuple(wides), (h, w), "f32", {"axis": 0}, pn.line, pn.col) if h > 1 else wides[0]
        if h > 1 or spans[0] != (0, w):
            # (the heads' spans cover the chunk: every lane takes one head's value and zeros)
            y = new.add("mul", (y, masks(h, w, spans, mn.dtype, mn)), (h, w), mn.dtype, {}, mn.line, mn.col)
            y = new.add("sum", (y,), (1, w), mn.dtype, {"axis": 0}, mn.line, mn.col)
            if sums is not None:        # each lane's head's sum, joined the same way: one division
                sums = new.add("mul", (sums, masks(h, w, spans, "f32", mn)), (h, w), "f32", {}, mn.line, mn.col)
                sums = new.add("sum", (sums,), (1, w), "f32", {"axis": 0}, mn.line, mn.col)
        if sums is not None:
            y = new.add("div", (y, sums), new.node(y).shape, mn.dtype, {}, mn.line, mn.col)
        if cast is not None:
            y = new.add("cast", (y,), (1, w), cast, {"to": cast}, n.line, n.col)
        return y

    stacks, info = {}, dict(scores)
    lone_p = {}                                 # a lone head's p = e / sum(e) -> its p @ v
    joined = {h[0] for chunks in joins.values() for *_, heads in chunks for h in heads}   # (their own products)
    for n in g.nodes():
        if n.op == "matmul" and len(n.shape) == 2 and n.shape[0] == 1 and g.node(n.inputs[0]).op == "div" \
                and n.id not in joined:
            p = g.node(n.inputs[0])
            lt = _late_div(g, [p.inputs[0], p.inputs[1], p.id], lanes)
            if lt is not None and g.users(p.id) == [n.id] and n.dtype == "f32":
                lone_p[p.id] = n.id
    lone_mm = set(lone_p.values())
    lone_sums = {g.node(p).inputs[1] for p in lone_p}
    rows_of_filled: set = set()
    folded: dict = {}
    for jid, chunks in joins.items():
        for lo, hi, heads in chunks:
            chains = _stackable(g, scores, heads)
            if chains is not None:
                stacks[jid, lo] = chains
                for c in chains:
                    scores.pop(c[0])
    for n in g.nodes():
        first[n.id] = len(new)
        if n.id in scores:                      # a head's score alone (its output is not joined)
            q, rope, k, rows, c0, c1 = scores[n.id]
            qn = g.node(q)
            lo, hi = _chunk(c0, qn.shape[1], lanes)
            qc = new.add("slice", (query(q, rope, n),), (1, hi - lo), qn.dtype, {"index": ((0, 1), (lo, hi))},
                         n.line, n.col)
            us = g.users(n.id)
            fold = _scale(g, n.id)
            qm = new.add("mul", (qc, masks(1, hi - lo, [(c0 - lo, c1 - lo)], qn.dtype, n, fold or 1.0)), (1, hi - lo),
                         qn.dtype, {}, n.line, n.col)
            nk = n.shape[1]
            kt = new.add("transpose", (chunk_of(k, rows, nk, lo, hi, n),), (hi - lo, nk), g.node(k).dtype,
                         {"perm": (1, 0)}, n.line, n.col)
            fill = {"fill": True} if fold and _fillable(g, us[0]) else {}
            m[n.id] = new.add("matmul", (qm, kt), n.shape, n.dtype, fill, n.line, n.col)
            if fold:
                folded[us[0]] = n.id
            if fill:
                rows_of_filled.add(m[n.id])
        elif n.id in folded:                    # (scores * c: c is in the queries' masks)
            m[n.id] = m[folded[n.id]]
        elif n.id in joins:
            parts = []
            for lo, hi, heads in joins[n.id]:
                chains = stacks.get((n.id, lo))
                if chains is not None:
                    parts.append(stacked(n, lo, hi, heads, chains))
                    continue
                acc = None
                for mm, cast, v, rows, c0, c1 in heads:
                    mn = g.node(mm)
                    vr = g.node(mn.inputs[0]).shape[1]
                    y = new.add("matmul", (m[mn.inputs[0]], chunk_of(v, rows, vr, lo, hi, n)), (1, hi - lo), mn.dtype,
                                {}, mn.line, mn.col)
                    if (c0, c1) != (lo, hi):
                        y = new.add("mul", (y, masks(1, hi - lo, [(c0 - lo, c1 - lo)], mn.dtype, n)), (1, hi - lo),
                                    mn.dtype, {}, mn.line, mn.col)
                    acc = y if acc is None else new.add("add", (acc, y), (1, hi - lo), mn.dtype, {}, mn.line, mn.col)
                if cast is not None:
                    acc = new.add("cast", (acc,), (1, hi - lo), cast, {"to": cast}, n.line, n.col)
                parts.append(acc)
            m[n.id] = parts[0] if len(parts) == 1 else new.add("concat", tuple(parts), n.shape, n.dtype,
                                                                dict(n.attrs), n.line, n.col)
        elif n.id in lone_sums:                 # (made with the product it divides)
            continue
        elif n.id in lone_p:                    # p = e / sum(e) taken as f16(e)
            e = m[n.inputs[0]]
            m[n.id] = new.add("cast", (e,), n.shape, "f16", {"to": "f16"}, n.line, n.col)
        elif n.id in lone_mm:                   # (f16(e) @ v) / sum(e)
            p = g.node(n.inputs[0])
            y = copied(new, n, m)
            sn = g.node(p.inputs[1])
            m[n.id] = new.add("div", (y, hilo_sum(sn, m[sn.inputs[0]], n.shape[-1])), n.shape, n.dtype, {},
                              n.line, n.col)
        elif _row_splat(g, n, lanes):
            m[n.id] = row_splat(n, m[n.inputs[0]])
        else:
            m[n.id] = copied(new, n, m)
    return rebuilt(g, new, m, first)
