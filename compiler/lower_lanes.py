"""Lowering of reductions over the last axis (see lower_reduce for the dispatch and the
reductions across vectors): the chunks of a row combined on the VXM, then a lane tree: each
step one chain in which the SXM makes shifted copies of the row (as many a cycle as it has
queues) and a VXM tree adds them to it as they arrive (ROTATE and MAX for max); the steps' radix
chosen by the latency of the trips between the VXM and the SXM against the SXM's issue cycles;
a reduction marked `splat` (compiler/rewrite.py) rotates over all the lanes instead (radices
that multiply to the lanes): its result in every lane; marked `window` too (a decode row of
w <= lanes / 2, whose users read its own lanes: compiler/rewrite_decode.py), by -(w-1) .. w: its
result in each of the row's lanes, in fewer rotations. Also `lanefold` (lower_lanefold).
"""
from __future__ import annotations

import math

import numpy as np

from lpu.compiler.reduce_tree import _tree_leaves, tree_chain
from lpu.compiler.lower_common import NEG_INF_BITS, gather_chain, imm_bits, sxm_chain, sxm_vxm_chain, vxm_chain
from lpu.isa import opcodes as O
from lpu.isa.dtypes import dtype_width


def reduce_lanes(lw, n, src_n, src, out, cdt, final_dt, vop, post=None):
    """Per row: combine the chunks into one vector (in a temp; one pairwise tree chain when a
    chain takes them all, else in turn), then the lane steps of `lane_plan` in place (ROTATE
    for max, whose padding lanes are first set to -inf where lane 0 would see them)."""
    lanes = lw.lanes
    c = src_n.shape[-1] if src_n.shape else 1
    is_max = n.op == "max"
    wide = bool(n.attrs.get("splat"))       # the result in every lane: rotations over all lanes
    sop = O.ROTATE if is_max or wide else O.SHIFT
    chunks = src.shape[-1]
    lead_shape = src.shape[:-1]
    nrows = int(np.prod(lead_shape, dtype=np.int64))
    width = min(c, lanes)
    window = wide and bool(n.attrs.get("window")) and chunks == 1 and 2 * width <= lanes + 1
    side = None
    if window and lw.near_side is not None:   # a decode head's row: its scratch near the VXM on
        side = _side(lw, n, src)               # the side of the SXM its lane steps use
    t1, r1 = lw.temp((nrows, 2 * lanes), cdt, side)   # two scratch vectors per row: rows pipeline
    t1 = t1.reshape(lead_shape + (2,))
    plan = lane_plan(lw, width, nrows * _peers(lw, n), cdt, exact=wide, window=window)
    steps = len(plan)
    # lanes past the row's end reach lane 0 only if the plan's shifts add up past it
    pad_seen = chunks > 1 or window or sum(max(s) for s in plan) >= width
    held, tree = [], _tree_leaves(lw, src_n.dtype)
    for lead in np.ndindex(src.shape[:-1]):
        ta, tb = int(t1[lead + (0,)]), int(t1[lead + (1,)])
        dst = int(out[lead + (0,)])
        vecs = [(int(src[lead + (j,)]), src_n.dtype) for j in range(chunks)]
        if is_max and c % lanes and pad_seen and not n.attrs.get("filled"):
            vxm_chain(lw, n, O.MASK, tb, cdt, lanes, vecs[-1], imm=NEG_INF_BITS, cut=c - (chunks - 1) * lanes)
            vecs[-1] = (tb, cdt)
        cur = vecs[0]
        if 1 < chunks <= tree:            # the chunks in one pairwise tree chain
            tree_chain(lw, n, vop, vecs, (ta, cdt), lanes, held)
            cur = (ta, cdt)
        for j in range(1, chunks if chunks > tree else 0):   # (more than a chain takes: in turn)
            vxm_chain(lw, n, vop, ta, cdt, lanes, cur, vecs[j])
            cur = (ta, cdt)
        if steps == 0:
            if post is None:
                vxm_chain(lw, n, O.VXM_UNARY["CONV"], dst, final_dt, 1, cur)
            else:                         # (a mean of one lane: the division alone)
                vxm_chain(lw, n, post[0], dst, post[2], 1, cur, imm=post[1], bimm=1)
            continue
        for si, shifts in enumerate(plan):
            d, ddt, nv = (dst, final_dt, lanes if wide else 1) if si == steps - 1 else (ta, cdt, lanes)
            pst = post if si == steps - 1 else None
            moved = [(cur[0], cur[1], sop, -k) for k in shifts]
            gather(lw, n, [cur], moved, vop, d, cdt, ddt, nv, pst, held)
            cur = (d, ddt)
    for r in held + [r1]:
        lw.free_scratch(r)


def lower_lanefold(lw, n):
    """Op `lanefold` (compiler/rewrite.py), one chain a row: its chunks (lanes past the row's end
    are zero) and their rotations by lanes / 2 (one trip to the SXM) added by a VXM tree, and
    on the way back to SRAM (lower_common._fold_write) the sum's halves in f16: z = sum *
    attrs['scale'], lo = f16(z - f16(z)) below lanes / 2, hi = f16(z) from there. (Two chains,
    the chunks' sum and then it with its rotation, measured: gpt2_small_prefill 181,315
    cycles, one chain 178,921.)"""
    src_n = lw.g.node(n.inputs[0])
    src = lw.grid[n.inputs[0]]
    out = lw.grid[n.id]
    lanes, cdt = lw.lanes, "f32"
    vop = O.VXM_BINARY["ADD"]
    chunks, half = src.shape[-1], lanes // 2
    held, t1 = [], None
    post = ("fold", imm_bits(n.attrs["scale"], True), half)
    for r in range(src.shape[0]):
        vecs = [(int(src[r, j]), src_n.dtype) for j in range(chunks)]
        dst = int(out[r, 0])
        if gather_chain(lw, n, vecs, [(v[0], v[1], O.ROTATE, -half) for v in vecs], vop, dst, cdt, n.dtype,
                        lanes, post):
            continue                       # one chain: each chunk and its rotation added
        if t1 is None:                     # else the chunks' sum first, then it and its rotation
            t1, region = lw.temp((1, lanes), cdt)
            held.append(region)
        ta = int(t1[0, 0])
        tree_chain(lw, n, vop, vecs, (ta, cdt), lanes, held)
        gather(lw, n, [(ta, cdt)], [(ta, cdt, O.ROTATE, -half)], vop, dst, cdt, n.dtype, lanes, post, held)
    for region in held:
        lw.free_scratch(region)


def _side(lw, n, src) -> int:
    """The hemisphere whose SXM a decode head's row reduction uses, the heads' rows balanced
    between the two: a row filled past its end (attr `filled`: no MASK, the first step rotates
    the row where its product wrote it) keeps its later steps on the row's side unless that side
    has more rows; the others alternate, east first. Measured (first fit had put 60 of
    attention_decode's 88 rotations on one SXM): attention_decode 1,054 -> 1,048; west first
    1,067, the filled rule for every row 1,041; the filled rows alternating instead:
    llama_block_decode 1,925 against 1,917, gpt2_block_decode 2,024 against 1,977."""
    load = lw.sxm_rows
    if n.attrs.get("filled"):
        near = lw.ctx.sxm_near(int(src.reshape(-1)[0]))
        side = near if load[near] <= load[near ^ 1] else near ^ 1
    else:
        side = 1 if load[1] <= load[0] else 0
    load[side] += 1
    return side


MAX_RADIX = 1 << 30      # (a cap on the shifts of one lane step, for measurements)
SXM_WEIGHT = 0.5
# rotations over all the lanes (splats) weigh their SXM cycles twice as much: bert_base's
# layernorm mean (128 rows of 320 lanes) then takes radices 5,4,4,4 (13 rotations a row, 4 steps)
# instead of 8,8,5 (18, 3 steps): L=1 17,003 -> 16,898 cycles; the weight raised for shifts too
# made llama_block_decode slower (2,520 -> 2,541)
SXM_WEIGHT_ROTATE = 1.0


def _peers(lw, n) -> int:
    """Lane reductions of n's op and input shape that neither feed n nor depend on it (n
    included): e.g. the heads of one layer, which share the SXMs while their rows reduce."""
    cache = lw.__dict__.setdefault("_lane_reduce_peers", {})
    if n.id not in cache:
        g = lw.g
        shape = g.node(n.inputs[0]).shape
        same = [m.id for m in g.nodes() if m.op == n.op and m.attrs.get("axis") == len(shape) - 1
                and g.node(m.inputs[0]).shape == shape]
        bit = {i: 1 << k for k, i in enumerate(same)}
        below: dict[int, int] = {}    # node -> bitmask of the reductions among its ancestors
        for v in sorted(g.g.nodes):   # program order: inputs first
            b = 0
            for u in g.g.predecessors(v):
                b |= below[u] | bit.get(u, 0)
            below[v] = b
        for i in same:
            cache[i] = sum(1 for j in same if j == i or not (below[i] & bit[j] or below[j] & bit[i]))
    return cache[n.id]


def _factors(n: int, s: int) -> list | None:
    """n as a product of s factors >= 2, as even as the primes allow (largest first), or None."""
    primes, k, p = [], n, 2
    while p * p <= k:
        while k % p == 0:
            primes.append(p)
            k //= p
        p += 1
    if k > 1:
        primes.append(k)
    if len(primes) < s:
        return None
    out = [1] * s
    for q in sorted(primes, reverse=True):
        out[out.index(min(out))] *= q
    return sorted(out, reverse=True)


def lane_plan(lw, width: int, nrows: int, cdt: str, exact: bool = False, window: bool = False) -> list:
    """The shifts of each lane step that brings the reduction of lanes 0 .. width-1 to lane
    0: step j shifts by span_j * i for i = 1 .. r-1 (those below width), span_{j+1} = r *
    span_j. Fewer steps mean fewer trips between the VXM and the SXM (about their distance
    twice each); more shifts per step cost SXM issue cycles (the queues of one SXM, as the
    streams take them) and VXM tree levels. The number of steps is the one of least latency,
    the SXM cycles of all rows counted too (rows share the SXMs). exact: rotations whose
    radices multiply to the lanes (the result in every lane); window: rotations by -(width-1)
    .. width in all (radices multiplying to 2 width, step j's offsets centred on digit j of
    width - 1 in that mixed radix): every lane of the row sees each of its lanes once and
    otherwise only lanes past the row (2 width <= lanes + 1), so the result is in each."""
    m, lat = lw.m, lw.ctx.lat
    if width <= 1:
        return []
    trip = 2 * abs(m.vxm_pos - m.sxm_pos(0)) + lat[O.SHIFT] + lat[O.READ] + 2
    per_cycle = max(1, min(m.sxm_queues_per_hemisphere, m.streams_per_direction // dtype_width(cdt) - 1))
    best = None
    for s in range(1, max(1, math.ceil(math.log2(width))) + 1):
        if window:          # (rotations by -(width-1) .. width: radices multiplying to 2 width)
            radices = _factors(2 * width, s)
            if radices is None:
                break
            plan, span, rest = [], 1, width - 1
            for r in radices:   # step j's offsets centred on digit c of width - 1 in the mixed radix
                c, rest = rest % r, rest // r
                plan.append([span * (i - c) for i in range(r) if i != c])
                span *= r
            radices = ()
        elif exact:         # (rotations: the radices multiply to the lanes, every lane seen once)
            radices = _factors(m.lanes, s)
            if radices is None:
                break
        else:
            r = max(2, math.ceil(width ** (1.0 / s) - 1e-9))
            while r ** s < width:
                r += 1
            radices = [min(r, MAX_RADIX)] * s
        if radices:
            plan, span = [], 1
        for r in radices:
            if span >= (m.lanes if exact else width):
                break
            plan.append([span * i for i in range(1, r) if exact or span * i < width])
            span *= r
        issue = sum(-(-len(p) // per_cycle) for p in plan)
        v = lat[O.VXM_BINARY["ADD"]]
        cost = sum(trip + v * (-(-len(p) // per_cycle) - 1) + v * math.ceil(math.log2(len(p) + 1))
                   for p in plan) + (SXM_WEIGHT_ROTATE if exact else SXM_WEIGHT) * nrows * issue
        if best is None or cost < best[0]:
            best = (cost, plan)
    return best[1]


def gather(lw, n, direct, moved, vop, dst, cdt, out_dt, nv, post, held):
    """gather_chain, or where it cannot be placed, its halves into temporaries and their
    combination (post applied at the end)."""
    if len(direct) + len(moved) >= 2 and gather_chain(lw, n, direct, moved, vop, dst, cdt, out_dt, nv, post):
        return
    if len(direct) == 1 and len(moved) == 1:
        slot, dt, sop, param = moved[0]
        sxm_vxm_chain(lw, n, sop, param, slot, vop, direct[0], dst, dt, out_dt, nv, post)
        return
    parts = []
    h = max(1, (len(direct) + len(moved)) // 2 - len(direct))
    for dd, mm in ((direct, moved[:h]), ([], moved[h:])):
        if not dd and not mm:
            continue
        tg, region = lw.temp((1, lw.lanes), cdt)
        held.append(region)
        t = int(tg.reshape(-1)[0])
        if not dd and len(mm) == 1:
            slot, dt, sop, param = mm[0]
            sxm_chain(lw, n, sop, slot, t, dt, param)
            parts.append((t, dt))
            continue
        gather(lw, n, dd, mm, vop, t, cdt, cdt, lw.lanes, None, held)
        parts.append((t, cdt))
    if post is None:
        vxm_chain(lw, n, vop, dst, out_dt, nv, parts[0], parts[1])
        return
    tg, region = lw.temp((1, lw.lanes), cdt)
    held.append(region)
    t = int(tg.reshape(-1)[0])
    vxm_chain(lw, n, vop, t, cdt, lw.lanes, parts[0], parts[1])
    vxm_chain(lw, n, post[0], dst, post[2], nv, (t, cdt), imm=post[1], bimm=1)
