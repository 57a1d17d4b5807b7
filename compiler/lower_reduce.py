"""Lowering of reductions (see lower_ops for the other op families).

  over the last axis   the chunks of a row combined on the VXM, then a lane tree of SXM
                       shifts or rotations and VXM ops (compiler/lower_lanes.py)
  over other axes      pairwise trees of VXM ops across vectors, fed from the streams, one
                       chain per block of vectors (as many as the ALUs and streams allow),
                       then over the blocks
"""
from __future__ import annotations

import numpy as np

from lpu.compiler import lower_lanes
from lpu.compiler.lower_common import imm_bits, nv_of
from lpu.compiler.reduce_tree import _tree_leaves, tree_chain
from lpu.isa import opcodes as O
from lpu.isa.dtypes import FLOATS, dtype_width

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
    lower_lanes.reduce_lanes(lw, n, src_n, src, out, cdt, final_dt, vop, post)


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
    by 520 -> 513), gpt2_block_prefill 3,252 -> 3,250. Only for a lone reduction at its depth
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


FIRST_ROWS = 4      # rows of a where whose chain makes their max too (first_blocks; measured with
#                     FIRST_GROUPS 6: 2 -> attention_prefill 956, gpt2_block_prefill 3,441; 4 -> 984, 3,482;
#                     with the roundings after the division (rewrite_pack.ROUND_AFTER) and SUM_GROUPS 6,
#                     FIRST_GROUPS 4, 5, 6: 2 -> 758, 767, 753, gpt2_block_prefill 3,228 (6); 4 -> 746, 745, 754,
#                     gpt2_block_prefill 3,245, 3,225, -: 16 partials, not 32, their max's last chain takes
#                     the last blocks raw (_raw_last), one trip through SRAM less after the last row)
FIRST_GROUPS = 5    # groups of 4 slices nearest the VXM those maxima lie in (measured with 2 rows: 3, 4,
#                     5, 6, 8, 10 -> attention_prefill 996, 965, 984, 956, 958, 956; gpt2_block_prefill
#                     3,484, 3,442, 3,440, 3,441, 3,458, 3,457; the reduction's own _partials: 992; with 4 rows
#                     see FIRST_ROWS)
SUM_ROWS = 4        # the same for the rows of a fused elementwise tree and their sum (lower_fuse._block_chains;
#                     with SUM_GROUPS 6: 2 -> attention_prefill 898, gpt2_block_prefill 3,431; 4 -> 880, 3,411)
SUM_GROUPS = 6      # measured with 4 rows: 3, 4, 5, 6, 7, 8, 9, 10, 12 -> attention_prefill 979, 897, 896, 880,
#                     890, 875, 886, 886, 887; gpt2_block_prefill 3,427, 3,421, 3,409, 3,411, 3,412, 3,417, 3,417, 3,412, 3,412;
#                     with _top (and placement.rows_of): 4, 5, 6, 7, 8, 9 -> attention_prefill 815, 814, 811, 825,
#                     833, 822; gpt2_block_prefill 3,256, 3,250, 3,253, 3,260, 3,254, 3,249 (6 had it 1 slower);
#                     merged with attn13w's streamed folds: 2, 3, 4, 5, 6, 7 -> 847, 878, 817, 819, 820, 823;
#                     gpt2_block_prefill 3,264, 3,264, 3,241, 3,246, 3,239, 3,253;
#                     with attn13y's fed folds and the max anchor (rewrite_pack._anchor), NEAR_SLICES 30,
#                     FOLDED_SLICES 8: 4, 5, 6 -> 790, 793, 799; gpt2_block_prefill 3,237, 3,229, 3,228 (FOLDED 10: 792, 795, 801);
#                     with the roundings after the division (rewrite_pack.ROUND_AFTER), FIRST_ROWS 4, FIRST_GROUPS 5:
#                     5, 6, 7 -> 746, 745, 756; gpt2_block_prefill 3,226, 3,225, 3,233 (NEAR_SLICES 24, 36, 44 with 6:
#                     785, 752, 747; FOLDED_SLICES 12: 749)


def first_blocks(lw, src, op="max", row_ops=3, rows=None, groups=None):
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
    rows, groups = rows or FIRST_ROWS, groups or FIRST_GROUPS      # read when called (sweeps set them)
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
