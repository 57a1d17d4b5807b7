"""Pass `rewrite` (before `plan`): layout choices made as graph rewrites, into ops the back end
already lowers, so that lane reductions become reductions across vectors.

Transposed attention scores. A row softmax of scores s = a @ b.T ([Nq, Nk]) reduces each row
over the lanes: a tree of SXM shifts and VXM ops per row, the SXM's queues the bottleneck and
every step a trip to the chip's edge. Computed transposed, sT = b @ a.T ([Nk, Nq]: a row per
key, the queries across the lanes), the same reductions run across vectors (VXM trees fed from
the streams, no SXM), and the reduced [Nq, 1] columns become [1, Nq] rows that broadcast over
sT's vectors for free. The region rewritten is s and every op downstream of it that is
elementwise (its other operands scalars), a causal mask (transposed: `where` with a constant
mask, shared by the heads) or a reduction over the last axis, up to matmuls that
take a region tensor p as their left operand: p @ v becomes (v.T @ pT).T, v.T through the SXM
transpose buffers (one transpose of v's source when v is a slice of its last axis, the heads'
slices then rows of it: views), the result transposed back the same way; where the heads'
results are joined along the lanes (concat(heads, axis=1), each perhaps cast), they are joined
as rows instead and the join transposed back once (`_joins`). Every op keeps its
dtype and its rounding; sums are added in another order (the reference's tolerance).

A region is rewritten only where it pays: it holds a reduction over rows of at least
`MIN_ROW` lanes, and there are at least 2 query rows (a single row is one vector either way).

Sums over the lanes of f16 tensors. sum(x) and mean(x) of an f16 x [R, C] become x @ ones[C, 1]
(the mean then divided by C in f32, and either cast to its dtype): the MXM's f16 products with
1.0 are exact and it adds in f32, as the lane tree does, in one trip instead of a chain of SXM
steps. (An f32 x would be rounded to f16 on its way into the MXM: those stay lane trees.) Each
sum has its own ones column, a vector per element (C * 2 * lanes bytes of SRAM: 480 KiB for
C = 768): one column shared by every sum of a width, or a ones row installed transposed, were
measured slower on the bundled programs (their installs meet in the same banks, or zero the
weight buffer's stale rows).

Splats. A sum is x @ ones[C, lanes] instead: the same SRAM
(a vector per element either way) and MXM work (one output vector per row), but the sum lands
in every lane. Mean's division and cast, and the ops that only combine such values with scalars
(layernorm's var + eps and rsqrt), run on the [R, lanes] vectors too, and the [R, 1] value is a
`slice` marked `splat`: a view (plan.py) that the elementwise ops broadcasting it read as it is,
with no SXM DISTRIBUTE, i.e. no trip to the chip's edge and back (two per layernorm, one per
rmsnorm). Measured: gpt2_block_decode 2,804 -> 2,456 cycles; in prefill (rows of up to 16 were
splats before, more stayed [R, 1] columns): gpt2_block_prefill 4,581 -> 4,201, llama_block_prefill
7,172 -> 7,042. The f32 sums of bert_base's layernorms (x + a, f32) as two f16 halves (hi = f16(x),
lo = f16(x - hi)) multiplied by ones, the lane tiles added on the VXM first, were measured slower:
bert_base L=1 18,469 -> 18,756, L=2 36,459 -> 37,379 (hi alone, 17,862, would round the f32 input
to 11 bits); the lane trees stay. Instead, the mean that layernorm centres its f32 rows by (rows
as wide as the lanes or wider) is a lane tree of rotations, `_rotated`: the same shifts, the sum
in every lane, a splat (bert_base 218,871 -> 216,292 cycles).

Folded sums. An f16 row wider than 2 chunks (gpt2's 768: K-tiles of 320, 320 and 128 lanes, 5
f16 passes of a plane pair) is first folded on the VXM (op `lanefold`, one chain a row): its
chunks and their rotations by lanes / 2 added in f32 (one trip to the SXM), scaled by 1/8,
and split into f16 lo = f16(z - hi) in the lower half of the lanes and hi = f16(z) in the
upper; that vector @ 8 * ones[lanes, lanes] is the sum in 2 passes (an f32 sum to ~22 bits,
the lane tree's and the 5-pass product's are to 24; hi is clamped to f16's range so that an
infinite sum stays infinite). gpt2's layernorms wait on their two sums' MXM passes: 5 -> 2
a row took gpt2_small_prefill 182,368 -> 178,921 cycles (L=1 16,243 -> 15,601, L=2 31,450 ->
30,511). Not for rows of 2 chunks or fewer (llama_block_prefill's
512-wide rmsnorm, 4 passes: 6,343 -> 6,660) nor for fewer than FOLD_ROWS rows (decode).
"""
from __future__ import annotations

import numpy as np

from lpu.compiler import ops
from lpu.compiler.ir import IRGraph
from lpu.isa.dtypes import NP_DTYPE

SPLAT_OPS = frozenset(("add", "sub", "mul", "div", "rsqrt", "sqrt", "exp", "neg", "cast"))
MIN_Q = 2         # one query row is one vector either way (decode): left as it is
MIN_ROW = 16      # rows narrower than this reduce in a few lane steps: not worth two transposes
P_BACK_Q = 64     # up to this many query rows, p is transposed back instead (measured: faster
#                   for attention_prefill and the gpt2/llama blocks, slower for bert_base's 128)


def _scalar(n) -> bool:
    return n.op == "const" and n.size == 1


def _region(g: IRGraph, s) -> tuple[set, list] | None:
    """(region node ids, exit matmul ids) grown from the score matmul s, or None."""
    nq, nk = s.shape
    region, exits, todo = {s.id}, [], [s.id]
    has_reduce = False
    while todo:
        nid = todo.pop()
        for u in g.users(nid):
            if u in region or u in exits:
                continue
            un = g.node(u)
            if un.op == "matmul" and un.inputs[0] == nid and un.inputs[1] not in region \
                    and len(g.node(un.inputs[1]).shape) == 2:
                exits.append(u)
                continue
            ok = un.op in ops.ELEMENTWISE and un.op != "where" or un.op == "causal" or (
                un.op in ops.REDUCE and un.attrs["axis"] == 1 and len(un.shape) == 2)
            if not ok or un.shape not in ((nq, nk), (nq, 1)):
                return None
            if any(i not in region and not _scalar(g.node(i)) for i in un.inputs):
                return None
            has_reduce |= un.op in ops.REDUCE
            region.add(u)
            todo.append(u)
    if not has_reduce or not exits:
        return None
    return region, exits


def _candidates(g: IRGraph) -> dict[int, tuple[set, list]]:
    out = {}
    taken: set = set()
    for n in g.nodes():
        if n.op != "matmul" or len(n.shape) != 2 or n.shape[0] < MIN_Q or n.shape[1] < MIN_ROW:
            continue
        a, t = (g.node(i) for i in n.inputs)
        if t.op != "transpose" or list(t.attrs["perm"]) != [1, 0] or len(a.shape) != 2:
            continue
        r = _region(g, n)
        if r is None or r[0] & taken:
            continue
        taken |= r[0]
        out[n.id] = r
    return out


def _mxm_sum(g, n) -> bool:
    """A sum or mean over the lanes of an f16 tensor (layernorm's mean of an f16 activation,
    rmsnorm's mean of x * x): as a matmul with a ones column the
    products are exact and the f32 sum one trip to the MXM, where a lane tree is a chain of SXM
    trips (the order of the f32 additions differs, as the lane tree's does from numpy's)."""
    if n.op not in ("sum", "mean") or len(n.shape) != 2 or n.attrs["axis"] != 1:
        return False
    x = g.node(n.inputs[0])
    return x.dtype == "f16" and x.shape[-1] > 1


FOLD_SCALE = 0.125   # z adds 2 values a chunk, at most 4 chunks: |z| <= 8 * 65504 / 8, hi never overflows
FOLD_ROWS = 32       # at least this many rows (a decode row would wait on the fold's trip to the SXM)


def _foldable(x, xn, lanes) -> bool:
    """A lane sum of f16 rows of 4 to 8 half-lanes' passes, computed (not a view: every chunk
    zero past the row's end), of prefill rows: folded first (rewrite's `folded`)."""
    return lanes is not None and x.dtype == "f16" and len(x.shape) == 2 and x.shape[0] >= FOLD_ROWS \
        and 2 * lanes < x.shape[-1] <= 4 * lanes \
        and xn.op not in ("slice", "concat", "reshape", "transpose")


def _rotated(g, n, lanes) -> bool:
    """A sum or mean over the lanes that stays a lane tree (f32 rows) as wide as the lanes or
    wider, that its input is centred by (x - mean(x), layernorm's: the difference is computed
    again in each of its users, lower_fuse, each reading the mean) or of the squares of such an
    input (a one-pass variance's): its steps rotate
    instead of shifting (as many shifts: the radices multiply to the lanes), so the result lands
    in every lane, a splat read as it is (lower_reduce). Measured on bert_base: L=1 18,469 ->
    18,434, L=2 36,459 -> 36,234; the variance's mean rotated too (its rsqrt read once) was
    slower then: L=2 36,849. Since the variance is mean(x * x) - mu * mu (rewrite_latency), the
    mean of the squares runs beside the mean and is rotated too: var, + eps and rsqrt are then
    splats and the rsqrt needs no DISTRIBUTE (a trip to the SXM after it, on every row's
    critical path): bert_base 166,659 -> 164,327 (L=1 14,796 -> 14,586, L=2 28,489 -> 28,157)."""
    if lanes is None or n.op not in ("sum", "mean") or len(n.shape) != 2 or n.attrs["axis"] not in (1, -1):
        return False
    x = g.node(n.inputs[0])
    centred = any(g.node(u).op == "sub" and tuple(g.node(u).inputs) == (x.id, n.id) for u in g.users(n.id))
    return x.dtype == "f32" and x.shape[-1] >= lanes and (centred or _square_of_centred(g, x))


def _square_of_centred(g, x) -> bool:
    """x = y * y of a y that a mean centres (y - mean(y)): the one-pass variance's squares."""
    if x.op != "mul" or x.inputs[0] != x.inputs[1]:
        return False
    y = x.inputs[0]
    return any(g.node(u).op == "mean" and any(g.node(w).op == "sub" and tuple(g.node(w).inputs) == (y, u)
                                              for w in g.users(u)) for u in g.users(y))


def _joins(g: IRGraph, exits: set) -> set:
    """Concats along the last axis of 2-D exits computed transposed (or their casts, used only
    there): the heads' outputs joined. Each exit's result would be transposed back on its own and
    its columns moved to their lanes by the join; joined as rows (whole vectors) and transposed
    once, the SXM moves every value once (measured: 12 heads of [64, 128] joined in half the
    cycles and a third of the instructions)."""
    out = set()
    for n in g.nodes():
        if n.op != "concat" or len(n.shape) != 2 or n.attrs["axis"] not in (1, -1):
            continue
        ok = True
        for i in n.inputs:
            x = g.node(i)
            if x.op == "cast" and x.inputs[0] in exits and g.users(x.id) == [n.id] \
                    and g.users(x.inputs[0]) == [x.id]:
                continue
            ok &= i in exits and g.users(i) == [n.id]
        if ok:
            out.add(n.id)
    return out


def _splat_ok(g, n, lanes) -> bool:
    """A [R, 1] value computed across all the lanes (see the module doc)."""
    return lanes is not None and len(n.shape) == 2 and n.shape[-1] == 1


def _trip_ordinals(g: IRGraph, nodes: set) -> dict:
    """{node: key}: the k-th of `nodes` in each trip of a loop gets (loop, k), so that the trips'
    constants for it are one node and the trips stay alike (replay.py); others their own id."""
    out = {n: ("node", n) for n in nodes}
    for li, trips in enumerate(g.loops):
        for s, e in trips:
            for k, n in enumerate(sorted(x for x in nodes if s <= x < e)):
                out[n] = ("trip", li, k)
    return out


def rewrite(g: IRGraph, lanes: int | None = None) -> IRGraph:
    """The graph with every profitable score region computed transposed (g itself if none);
    with `lanes`, the lane sums of f16 rows are splats (see the module doc)."""
    cands = _candidates(g)
    sums = {n.id for n in g.nodes() if _mxm_sum(g, n)}
    if not cands and not sums and not any(_rotated(g, n, lanes) for n in g.nodes()):
        return g
    region_of = {nid: s for s, (r, _) in cands.items() for nid in r}
    exit_of = {e: s for s, (_, ex) in cands.items() for e in ex}
    new = rebuilding(g)
    m: dict[int, int] = {}          # old id -> new id (region nodes: their transposed version)
    tcache: dict[int, int] = {}     # old id -> new id of its transpose
    masks: dict = {}                # (shape, offset, dtype) -> new ids of a causal mask's constants
    ones_of: dict = {}              # (rows, columns, sum_key) -> new id of a sum's ones constant
    sum_key = _trip_ordinals(g, sums)

    def add(op, inputs, shape, dtype, attrs, like):
        return new.add(op, inputs, shape, dtype, attrs, like.line, like.col)

    def transposed(nid, like):
        """New id of old node nid transposed (2-D), a row slice of a shared transpose when nid
        is a slice of its source's last axis only."""
        if nid in tcache:
            return tcache[nid]
        n = g.node(nid)
        idx = n.attrs.get("index") if n.op == "slice" else None
        src = g.node(n.inputs[0]) if idx is not None else None
        if idx is not None and len(idx) == 2 and len(src.shape) == 2 and tuple(idx[0]) == (0, src.shape[0]) \
                and not isinstance(idx[1], int):
            if n.inputs[0] not in tcache:
                tcache[n.inputs[0]] = add("transpose", (m[n.inputs[0]],), src.shape[::-1], src.dtype,
                                          {"perm": (1, 0)}, like)
            r = add("slice", (tcache[n.inputs[0]],), n.shape[::-1], n.dtype,
                    {"index": ((idx[1][0], idx[1][1]), (0, src.shape[0]))}, like)
        else:
            r = add("transpose", (m[nid],), n.shape[::-1], n.dtype, {"perm": (1, 0)}, like)
        tcache[nid] = r
        return r

    wide_of: dict[int, int] = {}    # new id of a splat [R, 1] -> new id of its [R, lanes] source

    def splat(r, like):
        rn = new.node(r)
        s = add("slice", (r,), (rn.shape[0], 1), rn.dtype,
                {"index": ((0, rn.shape[0]), (0, 1)), "splat": True}, like)
        wide_of[s] = r
        return s

    def folded(xid, x, skey, like):
        """x @ ones[C, lanes] of a wide f16 x as v @ 8 * ones[lanes, lanes], v = lanefold(x) (f16: a
        sum of x / 8 split into lo and hi halves, semantics.lanefold): the sum to f32's precision
        in 2 f16 passes a row instead of C / (lanes / 2)."""
        key = ("fold", skey)
        if key not in ones_of:
            ones_of[key] = add("const", (), (lanes, lanes), "f16",
                               {"value": np.full((lanes, lanes), 1 / FOLD_SCALE, np.float16)}, like)
        v = add("lanefold", (xid,), (x.shape[0], lanes), "f16", {"lanes": lanes, "scale": FOLD_SCALE}, like)
        return add("matmul", (v, ones_of[key]), (x.shape[0], lanes), "f32", {}, like)

    back: dict[int, int] = {}       # exit (p @ v computed transposed) -> new id of its transposed result
    joins = _joins(g, {e for e, sc in exit_of.items() if g.node(sc).shape[0] > P_BACK_Q})
    first: dict[int, int] = {}      # old id -> the first new id made for it or after it
    for n in g.nodes():
        first[n.id] = len(new)
        if n.id in cands:                       # sT = b @ a.T
            a, t = n.inputs
            b = g.node(t).inputs[0]
            at = add("transpose", (m[a],), g.node(a).shape[::-1], g.node(a).dtype, {"perm": (1, 0)}, n)
            m[n.id] = add("matmul", (m[b], at), n.shape[::-1], n.dtype, {}, n)
        elif n.id in region_of and n.op == "causal":     # -inf where key > query + offset
            off = n.attrs.get("offset", 0)
            key = (n.shape, off, n.dtype)
            if key not in masks:
                nq, nk = n.shape
                keep = (np.arange(nk)[:, None] <= np.arange(nq)[None, :] + off).astype(np.int8)
                masks[key] = (add("const", (), (nk, nq), "i8", {"value": keep}, n),
                              add("const", (), (), n.dtype, {"value": np.array(-np.inf, NP_DTYPE[n.dtype])}, n))
            c, ninf = masks[key]
            m[n.id] = add("where", (c, m[n.inputs[0]], ninf), n.shape[::-1], n.dtype, {}, n)
        elif n.id in region_of:
            attrs = dict(n.attrs)
            if n.op in ops.REDUCE:
                attrs["axis"] = 0
            m[n.id] = add(n.op, tuple(m[i] for i in n.inputs), n.shape[::-1], n.dtype, attrs, n)
        elif n.id in exit_of and g.node(exit_of[n.id]).shape[0] <= P_BACK_Q:   # p @ v = f16(pT).T @ v
            p, v = n.inputs
            pn = g.node(p)
            pt = m[p]
            if pn.dtype == "f32":
                pt = add("cast", (pt,), pn.shape[::-1], "f16", {"to": "f16"}, n)
            pp = add("transpose", (pt,), pn.shape, "f16" if pn.dtype == "f32" else pn.dtype, {"perm": (1, 0)}, n)
            m[n.id] = add("matmul", (pp, m[v]), n.shape, n.dtype, {}, n)
        elif n.id in exit_of:                   # p @ v = (v.T @ pT).T
            p, v = n.inputs
            vt = transposed(v, n)
            ot = add("matmul", (vt, m[p]), n.shape[::-1], n.dtype, {}, n)
            m[n.id] = add("transpose", (ot,), n.shape, n.dtype, {"perm": (1, 0)}, n)
            back[n.id] = ot
        elif n.id in joins:                     # concat(o_h, axis=1) = concat(o_h.T, axis=0).T
            parts = []
            for i in n.inputs:
                x = g.node(i)
                parts.append(back[i] if i in back else
                             add("cast", (back[x.inputs[0]],), x.shape[::-1], x.dtype, dict(x.attrs), x))
            cat = add("concat", tuple(parts), n.shape[::-1], n.dtype, {"axis": 0}, n)
            m[n.id] = add("transpose", (cat,), n.shape, n.dtype, {"perm": (1, 0)}, n)
        elif n.id in sums:                      # sum(x) = x @ ones: one MXM trip, no lane tree
            x = g.node(n.inputs[0])
            wide = _splat_ok(g, n, lanes)
            shape = (n.shape[0], lanes) if wide else n.shape
            key = (x.shape[-1], shape[-1], sum_key[n.id])     # the k-th sum of each loop trip: one constant
            if wide and _foldable(x, new.node(m[x.id]), lanes):
                r = folded(m[x.id], x, sum_key[n.id], n)
            else:
                if key not in ones_of:
                    ones_of[key] = add("const", (), (x.shape[-1], shape[-1]), "f16",
                                       {"value": np.ones((x.shape[-1], shape[-1]), np.float16)}, n)
                r = add("matmul", (m[x.id], ones_of[key]), shape, "f32", {}, n)
            if n.op == "mean":
                c = add("const", (), (), "f32", {"value": np.array(x.shape[-1], np.float32)}, n)
                r = add("div", (r, c), shape, "f32", {}, n)
            if n.dtype != "f32":
                r = add("cast", (r,), shape, n.dtype, {"to": n.dtype}, n)
            m[n.id] = splat(r, n) if wide else r
        elif _rotated(g, n, lanes):               # a lane tree of rotations: the sum in every lane
            r = add(n.op, (m[n.inputs[0]],), (n.shape[0], lanes), n.dtype, {**n.attrs, "splat": True}, n)
            m[n.id] = splat(r, n)
        elif _splat_ok(g, n, lanes) and n.op in SPLAT_OPS and any(m[i] in wide_of for i in n.inputs) \
                and all(m[i] in wide_of or _scalar(g.node(i)) for i in n.inputs):
            # an op on splats (rsqrt(var + eps)) runs on their wide sources: a splat too
            r = add(n.op, tuple(wide_of.get(m[i], m[i]) for i in n.inputs), (n.shape[0], lanes), n.dtype,
                    dict(n.attrs), n)
            m[n.id] = splat(r, n)
        else:
            m[n.id] = add(n.op, tuple(m[i] for i in n.inputs), n.shape, n.dtype, dict(n.attrs), n)
    return rebuilt(g, new, m, first)


def rebuilding(g: IRGraph) -> IRGraph:
    """The empty graph a pass copies g into (same source and params; finish with `rebuilt`)."""
    new = IRGraph(g.source_name, g.source)
    new.params = dict(g.params)
    return new


DROP = -1          # rebuild's node function: n is not copied (only its replacement read it)


def rebuild(g: IRGraph, node) -> IRGraph:
    """g copied node by node into a new graph: node(new, n, m) adds n's replacement and returns
    its id, returns None to copy n as it is, or DROP to leave n out (m maps old ids to new ones;
    it may set m itself). The rest as `rebuilt`."""
    new = rebuilding(g)
    m: dict[int, int] = {}
    first: dict[int, int] = {}
    for n in g.nodes():
        first[n.id] = len(new)
        r = node(new, n, m)
        if r is None:
            m[n.id] = copied(new, n, m)
        elif r != DROP:
            m[n.id] = r
    return rebuilt(g, new, m, first)


def copied(new: IRGraph, n, m: dict) -> int:
    """Node n added to new as it is, its inputs (and the node its attribute `after` names,
    compiler/plan.level_order) mapped through m (old id -> new id)."""
    ins = tuple(m[i] for i in n.inputs)
    after = n.attrs.get("after")
    if n.id == len(new) and ins == n.inputs and m.get(after, after) == after:
        return new.append(n)          # same id, same inputs: the Node itself (Nodes do not change)
    attrs = dict(n.attrs)
    if after is not None:
        attrs["after"] = m[after]
    return new.add(n.op, ins, n.shape, n.dtype, attrs, n.line, n.col)


def rebuilt(g: IRGraph, new: IRGraph, m: dict, first: dict) -> IRGraph:
    """The end of a pass that copies g into new (m: old id -> new id; first: old id -> the first
    new id made at or after it): names, outputs, states and loop trips mapped, dead nodes pruned."""
    return _prune(_mapped(g, new, m, first))


def _mapped(g: IRGraph, new: IRGraph, m: dict, first: dict) -> IRGraph:
    new.decls = {k: m[v] for k, v in g.decls.items()}
    new.outputs = {k: m[v] for k, v in g.outputs.items()}
    new.final_states = {k: m[v] for k, v in g.final_states.items()}
    new.loops = _loops(g.loops, first, len(new))
    return new


def _loops(loops, first, end) -> list:
    """Loop trips' node ranges ([start, stop) of old ids) in the new ids (`first`: old id -> the
    first new id made at or after it; `end`: the new graph's size)."""
    def at(old):
        return first.get(old, end)
    return [[(at(s), at(e)) for s, e in trips] for trips in loops]


def _prune(g: IRGraph) -> IRGraph:
    """g without the nodes nothing needs (no output, store or state depends on them); leaves stay."""
    live = set()
    todo = [n.id for n in g.nodes() if n.op in ("output", "store") or n.op in ops.LEAVES and n.op != "const"]
    todo += list(g.final_states.values())
    while todo:
        nid = todo.pop()
        if nid in live:
            continue
        live.add(nid)
        todo.extend(g.node(nid).inputs)
    if len(live) == len(g):
        return g
    new = rebuilding(g)
    m, first = {}, {}
    for n in g.nodes():
        first[n.id] = len(new)
        if n.id in live:
            m[n.id] = copied(new, n, m)
    return _mapped(g, new, m, first)
