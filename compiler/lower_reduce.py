"""Lowering of reductions (see lower_ops for the other op families).

  over the last axis   the chunks of a row combined on the VXM, then a lane tree: each step
                       one chain in which the SXM makes shifted copies of the row (as many a
                       cycle as it has queues) and a VXM tree adds them to it as they arrive
                       (ROTATE and MAX for max); the steps' radix chosen by the latency of
                       the trips between the VXM and the SXM against the SXM's issue cycles;
                       a reduction marked `splat` (compiler/rewrite.py) rotates over all the
                       lanes instead (radices that multiply to the lanes): its result in every lane;
                       marked `window` too (a decode row of w <= lanes / 2, whose users read its
                       own lanes: compiler/rewrite_decode.py), by -(w-1) .. w: its result in each
                       of the row's lanes, in fewer rotations
  over other axes      pairwise trees of VXM ops across vectors, fed from the streams, one
                       chain per block of vectors (as many as the ALUs and streams allow),
                       then over the blocks
"""
from __future__ import annotations

import math

import numpy as np

from lpu.compiler.chains import ChainBuilder
from lpu.compiler.lower_common import (
    NEG_INF_BITS, gather_chain, imm_bits, nv_of, stage, sxm_chain, sxm_vxm_chain, vxm_chain,
)
from lpu.isa import opcodes as O
from lpu.isa.dtypes import DTYPE_CODE, FLOATS, dtype_width
from lpu.isa.machine import EAST, WEST

# ---- reductions ----------------------------------------------------------------------------
def lower_reduce(lw, n):
    src_n = lw.g.node(n.inputs[0])
    src = lw.grid[n.inputs[0]]
    out = lw.grid[n.id]
    axis = n.attrs["axis"]
    cdt = "f32" if n.dtype in FLOATS or src_n.dtype in FLOATS or n.op == "mean" else "i32"
    vop = O.VXM_BINARY["MAX" if n.op == "max" else "ADD"]
    count = src_n.shape[axis]
    final_dt = n.dtype if n.op != "mean" else cdt
    if axis != len(src_n.shape) - 1 and src_n.shape:     # across vectors: mean divides in the last chain
        post = (O.VXM_BINARY["DIV"], imm_bits(count, cdt == "f32")) if n.op == "mean" else None
        _reduce_vectors(lw, n, src_n, src, out, axis, cdt, n.dtype, vop, post)
        return
    post = (O.VXM_BINARY["DIV"], imm_bits(count, cdt == "f32"), n.dtype) if n.op == "mean" else None
    _reduce_lanes(lw, n, src_n, src, out, cdt, final_dt, vop, post)


def _reduce_vectors(lw, n, src_n, src, out, axis, cdt, final_dt, vop, post=None):
    """Across vectors, in the pairwise order of `semantics.pairwise` (adjacent pairs, level by
    level, an odd last item carried up): aligned blocks of `_tree_leaves` vectors are each
    reduced by one chain, a tree of VXM ops fed straight from the streams; the blocks' partial
    results (f32/i32 temps) are reduced the same way, level by level, until one is left. Blocks
    of a level are independent chains, so they overlap on the ALUs."""
    cur = np.moveaxis(src, axis, 0)
    outv = np.moveaxis(out, axis, 0)[0]
    count = cur.shape[0]
    nvec = max(1, outv.size)
    items = [[(int(cur[(i,) + idx]), src_n.dtype) for i in range(count)] for idx in np.ndindex(outv.shape)]
    idxs = list(np.ndindex(outv.shape))
    first = lw.first_level.pop(n.id, None)       # a max's first level made by its source (first_blocks)
    if first and all((b, idx[-1]) in first["pre"] for idx in idxs for b in range(count // first["B"])):
        B = first["B"]
        items = [[first["pre"][b, idx[-1]] for b in range(count // B)] + items[j][count // B * B:]
                 for j, idx in enumerate(idxs)]
        count = len(items[0])
    both = first is None and nvec == 1 and peers_across(lw, n) == 1 and not lw.in_loop(n) \
        and len({lw.ctx.sxm_near(int(x)) for x in cur.reshape(-1)}) == 2      # (rows on both sides)
    levels, k = [], count                 # partial results per level, until one is left
    while k > 1:
        k = -(-k // _tree_leaves(lw, items[0][0][1] if not levels else cdt, both))
        levels.append(k)
    nt = sum(levels[:-1])
    # one row of partials per output vector: a block's partials lie in consecutive slots, on
    # different slices, so one chain can read them together
    tmp, region = _partials(lw, n, nvec, nt, cdt) if nt else (None, None)
    held = []
    if count == 1:
        for j, idx in enumerate(idxs):
            nv = nv_of(n.shape, lw.lanes, idx[-1])
            tree_chain(lw, n, vop, items[j], (int(outv[idx]), final_dt), nv, held, post)
    leaves = _tree_leaves(lw, items[0][0][1], both)
    raw = _raw_last(vop, count, levels, leaves) if first else 0
    mark = len(lw.chains)
    if not raw or not _levels(lw, n, vop, items, [-(-(count - raw) // leaves), 1], raw, tmp, outv, idxs,
                              cdt, final_dt, post, both):
        del lw.chains[mark:]      # (its last chain could not be placed whole: the plain levels)
        _levels(lw, n, vop, items, levels, 0, tmp, outv, idxs, cdt, final_dt, post, both)
    for reg in held + [region, first and first["region"]]:
        if reg:
            lw.free_temp(reg)


def _levels(lw, n, vop, items, levels, raw, tmp, outv, idxs, cdt, final_dt, post, both) -> bool:
    """The chains of _reduce_vectors' levels (`raw` items skip the first: _raw_last); whether
    every last chain was placed whole (not halved through temporaries, nor staged)."""
    base, held, whole = 0, [], True
    for li, k in enumerate(levels):
        last = li == len(levels) - 1
        if li == len(levels) - 2 and k == 2 and not raw and not lw.in_loop(n) and peers_across(lw, n) == 1:
            if _top(lw, n, vop, items, tmp, base, outv, idxs, cdt, final_dt, post, both, held):
                break                     # (the last level made in the chains of the one before)
        nxt = []
        for j, idx in enumerate(idxs):
            nv = nv_of(n.shape, lw.lanes, idx[-1])
            leaves = _tree_leaves(lw, items[j][0][1], both)
            parts = []
            end = len(items[j]) - (raw if li == 0 else 0)
            for b in range(k):
                blk = items[j][b * leaves:min((b + 1) * leaves, end)]
                if len(blk) == 1 and not last:     # a lone vector joins the next level as it is
                    parts.append(blk[0])
                    continue
                d = (int(outv[idx]), final_dt) if last else (int(tmp[j, base + b]), cdt)
                mark = len(lw.chains)
                tree_chain(lw, n, vop, blk, d, nv if last else lw.lanes, held, post if last else None)
                whole = whole and (not last or len(lw.chains) == mark + 1)
                parts.append(d)
            nxt.append(parts + items[j][end:])
        items, base = nxt, base + k
        for r in held:                    # (the next level's fallbacks may reuse them)
            lw.free_temp(r)
        held.clear()
    return whole


def _top(lw, n, vop, items, tmp, base, outv, idxs, cdt, final_dt, post, both, held) -> bool:
    """The last two levels of a reduction across vectors as two chains, not three: the first
    block's tree into a partial, then the second block's tree and its op with that partial
    (the same pairwise order: the root is op(first half, second half)), written as the result:
    the first half is made while the second's items still come, and the result is a trip
    through SRAM nearer the last item. False (nothing added) where a last chain cannot be placed
    whole. Measured (with SUM_GROUPS 5): attention_prefill 821 -> 814 (its softmax's sum written
    by 520 -> 509), gpt2_block_prefill 3,252 -> 3,250. Only for a lone reduction at its depth
    outside loops' trips: with peers, attention_prefill on tiny 28,684 -> 28,694; in the trips,
    bert_base 163,630 -> 163,768 (L=1 14,628 -> 14,607)."""
    mark = len(lw.chains)
    for j, idx in enumerate(idxs):
        nv = nv_of(n.shape, lw.lanes, idx[-1])
        leaves = _tree_leaves(lw, items[j][0][1], both)
        blk0, blk1 = items[j][:leaves], items[j][leaves:2 * leaves]
        a = blk0[0] if len(blk0) == 1 else (int(tmp[j, base]), cdt)
        if len(blk0) > 1:
            tree_chain(lw, n, vop, blk0, a, lw.lanes, held)
        if not tree_chain(lw, n, vop, blk1, (int(outv[idx]), final_dt), nv, held, post, left=a):
            del lw.chains[mark:]
            return False
    return True


def _raw_last(vop, count, levels, leaves) -> int:
    """Items of a max of two levels that skip the first and join the last chain as they are
    (exact: a max in any order): the most that leave that chain at most `leaves` leaves. The
    source makes its items in order (a packed softmax's masked scores with their first level,
    first_blocks): the last ones are a trip through SRAM nearer the result. Measured with
    placement.rows_of: attention_prefill 840 -> 821 (the max written by 418 -> 409),
    gpt2_block_prefill 3,269 -> 3,252."""
    if vop != O.VXM_BINARY["MAX"] or len(levels) != 2:
        return 0
    f = 0
    while f + 1 < count and -(-(count - f - 1) // leaves) + f + 1 <= leaves:
        f += 1
    return f


FIRST_ROWS = 2      # rows of a where whose chain makes their max too (first_blocks; measured with
#                     FIRST_GROUPS 6: 2 -> attention_prefill 956, gpt2_block_prefill 3,441; 4 -> 984, 3,482)
FIRST_GROUPS = 6    # groups of 4 slices nearest the VXM those maxima lie in (measured with 2 rows: 3, 4,
#                     5, 6, 8, 10 -> attention_prefill 996, 965, 984, 956, 958, 956; gpt2_block_prefill
#                     3,484, 3,442, 3,440, 3,441, 3,458, 3,457; the reduction's own _partials: 992)
SUM_ROWS = 4        # the same for the rows of a fused elementwise tree and their sum (lower_fuse._block_chains;
#                     with SUM_GROUPS 6: 2 -> attention_prefill 898, gpt2_block_prefill 3,431; 4 -> 880, 3,411)
SUM_GROUPS = 5      # measured with 4 rows: 3, 4, 5, 6, 7, 8, 9, 10, 12 -> attention_prefill 979, 897, 896, 880,
#                     890, 875, 886, 886, 887; gpt2_block_prefill 3,427, 3,421, 3,409, 3,411, 3,412, 3,417, 3,417, 3,412, 3,412;
#                     with _top (and placement.rows_of): 4, 5, 6, 7, 8, 9 -> attention_prefill 815, 814, 811, 825,
#                     833, 822; gpt2_block_prefill 3,256, 3,250, 3,253, 3,260, 3,254, 3,249 (6 had it 1 slower)


def first_blocks(lw, src, op="max", row_ops=3, rows=FIRST_ROWS, groups=FIRST_GROUPS):
    """(reduction id, rows per block, {(block, chunk): slot}) when `src`, f32 rows of `row_ops`
    VXM ops each (a where: a packed softmax's masked scores; a fused elementwise tree: its
    exponentials), is read by a lone reduction `op` across its vectors (alone at its depth, 2-D,
    not in a loop's trips): the source's lowering makes the reduction of each aligned block of
    `rows` rows in the chain that makes the rows, from the same streams
    (lower_ops._where_max_blocks, lower_fuse._block_chains), into the `groups` groups of slices
    nearest the VXM, and the reduction starts from those partials, else None. A max is exact in
    any order; a sum's aligned blocks (a power of two dividing its rows) are a level of its own
    pairwise order (semantics.pairwise): the result is bit for bit the same. The rows' trip through SRAM and
    back is no longer ahead of the reduction: the where's max: attention_prefill 971 -> 956,
    gpt2_block_prefill 3,475 -> 3,441."""
    us = [lw.g.node(u) for u in lw.g.users(src.id)]
    red = [u for u in us if u.op == op and len(u.shape) == 2 and u.attrs["axis"] == 0]
    if src.dtype != "f32" or len(src.shape) != 2 or len(red) != 1 \
            or lw.in_loop(src) or peers_across(lw, red[0]) != 1:
        return None
    m, n, B = lw.m, red[0], rows
    nb = src.shape[0] // B
    if (row_ops + 1) * B - 1 > m.vxm_alus or B * 4 > m.streams_per_direction or nb < 2 \
            or op == "sum" and src.shape[0] % B:
        return None                    # (a row's ops and a reduction op; two f32 links)
    nvec = -(-n.shape[1] // lw.lanes)          # (its output vectors: one row of chunks)
    ns = m.mem_slices

    def dist(s0):
        return max(abs(m.slice_pos(s) - m.vxm_pos) for s in range(s0, s0 + 4))

    near = sorted(range(0, ns, 4), key=lambda s0: (dist(s0), s0))[:groups]
    size = (-(-nvec * nb // len(near)) + 1) * ns
    start = lw.alloc.alloc(size, "a max's first level")
    base = -(-start // ns) * ns
    lw.first_level[n.id] = {"region": (start, size), "pre": {}, "B": B}
    return n.id, B, {(b, j): base + (t // len(near)) * ns + near[t % len(near)]
                     for j in range(nvec) for b in range(nb) for t in [j * nb + b]}


def _partials(lw, n, nvec, nt, dt):
    """[nvec, nt] slots for the partial results of a reduction across vectors, and the region
    (start, size) to free. A reduction alone at its depth in the plan (a packed softmax's max,
    its sum) puts them in the groups of slices nearest the VXM, alternating west and east: the
    next level's chain reads them together, half the planes each way, a few hops away, where
    consecutive slots could put all 32 planes on one side's streams and up to 44 hops away.
    (Measured: reductions side by side at one depth crowd the same near slices: llama_block_prefill
    6,916 -> 6,977, bert_base L=1 18,045 -> 18,146 when they did.)"""
    if nvec > 1 or peers_across(lw, n) > 1:
        return lw.temp((nvec, nt * lw.lanes), dt)
    m = lw.m
    ns = m.mem_slices
    w = dtype_width(dt)
    per_group = 4 // w

    def dist(s0):
        return max(abs(m.slice_pos(s) - m.vxm_pos) for s in range(s0, s0 + 4))

    groups = np.asarray(sorted(range(0, ns, 4), key=lambda s0: (dist(s0), s0)), np.int64)
    per_row = len(groups) * per_group
    size = (-(-nt // per_row) + 1) * ns
    start = lw.alloc.alloc(size, "a reduction's partials")
    base = -(-start // ns) * ns          # (the first whole row of the region)
    j = np.arange(nt, dtype=np.int64)
    grid = base + (j // per_row) * ns + groups[(j % per_row) // per_group] + (j % per_group) * w
    return grid.reshape(1, nt), (start, size)


def peers_across(lw, n) -> int:
    """Reductions across vectors at n's depth in the plan (n among them); counted once per
    lowering."""
    count = lw.across_at_depth
    if count is None:
        depth = lw.plan.depth
        count = {}
        for x in lw.g.nodes():
            if x.op in ("max", "sum", "mean") and len(x.shape) > 1 and x.attrs["axis"] % len(x.shape) != len(x.shape) - 1:
                count[depth[x.id]] = count.get(depth[x.id], 0) + 1
        lw.across_at_depth = count
    return count.get(lw.plan.depth[n.id], 0)


def _tree_leaves(lw, leaf_dt, both=False) -> int:
    """Vectors one tree chain reduces: a power of two whose ops fit the ALUs and whose leaves
    and first-level results (f32, their links alternating direction) fit the streams; `both`:
    the leaves lie on both sides of the VXM (a lone reduction's rows and partials, near_region
    and _partials), half on each direction's streams: 16 f32 leaves a chain, not 8, one level
    less after the last row (attention_prefill 933 -> 917, gpt2_block_prefill 3,441 -> 3,436;
    a lone sum of 64 f32 rows all ready at the start: 235 -> 238)."""
    m = lw.m
    w, wc, k = dtype_width(leaf_dt), dtype_width("f32"), 2
    while (2 * k - 1 <= m.vxm_alus and 2 * k * w <= m.streams_per_direction * (1 + both)
           and k * wc <= m.streams_per_direction):
        k *= 2
    return k


def _too_wide(cb, streams) -> bool:
    """More stream planes on one diagonal of one direction than the machine has."""
    need = {}
    for d, koff, w in cb.groups:
        need[d, koff] = need.get((d, koff), 0) + w
    return max(need.values()) > streams


def tree_chain(lw, n, vop, leaves, dst, nv, held, post=None, left=None):
    """One chain: the pairwise tree of `leaves` ((slot, dtype) each) on the VXM, every op fed
    from the streams at the cycle its operands are ready; the root (or `post`, an op with an
    immediate applied to it, e.g. mean's division) is written to dst = (slot, dtype). With
    `left` (a vector), op(left, that tree) instead, or False (nothing added) where that chain
    cannot be placed whole."""
    c = lw.ctx
    lat = c.lat[vop]
    cdt = "f32" if dst[1] in FLOATS or leaves[0][1] in FLOATS else "i32"
    nodes = [("leaf", lf) for lf in leaves]
    while len(nodes) > 1:
        odd = nodes[-1:] if len(nodes) % 2 else []
        nodes = [("op", nodes[i], nodes[i + 1]) for i in range(0, len(nodes) - 1, 2)] + odd
    root = nodes[0] if left is None else ("op", ("leaf", left), nodes[0])
    if root[0] == "leaf":                 # one vector: a converting copy
        vxm_chain(lw, n, O.VXM_UNARY["CONV"], dst[0], dst[1], nv, root[1])
        return
    cb = ChainBuilder(c, n.line, n.id)
    vpos = c.m.vxm_pos
    wc = dtype_width(cdt)
    turn = [1]

    def emit(node, off, out):
        """node's op at `off`, its result going to the group `out`."""
        ops_ = []
        for ch in node[1:]:
            if ch[0] == "leaf":
                ops_.append((cb.read(ch[1][0], dtype_width(ch[1][1]), vpos, off), DTYPE_CODE[ch[1][1]]))
            else:
                turn[0] ^= 1
                d = EAST if turn[0] else WEST
                g = cb.f.add_group(d, off - vpos if d == EAST else off + vpos, wc)
                emit(ch, off - c.lat[vop], (g, DTYPE_CODE[cdt]))
                ops_.append((g, DTYPE_CODE[cdt]))
        cb.vxm(vop, off, ops_[0], ops_[1], out, nv=nv if node is root and post is None else c.lanes)

    if post is None:
        emit(root, 0, (cb.write(dst[0], dtype_width(dst[1]), vpos, lat), DTYPE_CODE[dst[1]]))
    else:
        pop, imm = post
        g = cb.f.add_group(WEST, lat + vpos, wc)
        emit(root, 0, (g, DTYPE_CODE[cdt]))
        go = (cb.write(dst[0], dtype_width(dst[1]), vpos, lat + c.lat[pop]), DTYPE_CODE[dst[1]])
        cb.vxm(pop, lat, (g, DTYPE_CODE[cdt]), None, go, nv=nv, imm=imm, bimm=1)
    emit = None     # a recursive closure is a reference cycle: left, it holds the chain until a GC pass
    conflict = cb.mem_conflict()
    if left is not None:
        if conflict or _too_wide(cb, c.m.streams_per_direction):
            return False
        lw.chains.append(cb.chain())
        return True
    if len(leaves) == 2 and conflict:     # two leaves on one bank in one cycle: copy one first
        tree_chain(lw, n, vop, [leaves[0], stage(lw, n, leaves[1], leaves[0])], dst, nv, held, post)
        return
    if len(leaves) > 2 and (conflict or _too_wide(cb, c.m.streams_per_direction)):   # halves, then join
        half = 1 << (len(leaves) - 1).bit_length() - 1
        tgrid, region = lw.temp((2, lw.lanes), cdt)
        held.append(region)               # freed after the level: no reuse, no waits within it
        a, b = (int(tgrid[0, 0]), cdt), (int(tgrid[1, 0]), cdt)
        tree_chain(lw, n, vop, leaves[:half], a, lw.lanes, held)
        tree_chain(lw, n, vop, leaves[half:], b, lw.lanes, held)
        tree_chain(lw, n, vop, [a, b], dst, nv, held, post)
        return
    lw.chains.append(cb.chain())


def _reduce_lanes(lw, n, src_n, src, out, cdt, final_dt, vop, post=None):
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
