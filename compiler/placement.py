"""Where a tensor's vectors lie in SRAM, when first fit (consecutive slots over every slice) is
not what its trips want: on the hemisphere of the unit that makes or takes it (`side_of`), in
the slices nearest the VXM (`near_region`: a packed softmax's rows, an output made on the VXM),
at the edge of the plane pair that installs it (`edge_weights`). The decisions, with what each
measured, are in the functions' notes; `temp_region` applies them to a temporary."""
from __future__ import annotations

import numpy as np

from lpu.compiler import lower_reduce, ops
from lpu.compiler.alloc import grid_shape
from lpu.compiler.lower_mxm import output_side
from lpu.compiler.movement import tfold_sxm
from lpu.compiler.partition import LINK_PREFIX
from lpu.isa.opcodes import dtype_width

NEAR_SLICES = 30     # slices a side that near_region uses (vxm_to_vxm)
FOLDED_SLICES = 8    # the same for a tensor folded through both SXMs (folded)
OUTPUT_SLICES = 2    # the same for an output made on the VXM (vxm_output)
EDGE_SLICES = 16     # slices at an edge that a weight installed whole lies in (edge_weights)
EDGE_SHARE = 0.125   # of the SRAM those weights may take so laid
FOLDED_DEPTH = 2     # rows of slots a folded tensor's near_region fills at one distance (folded)
FOLD_SLICES = 8      # slices at an edge that a tfold's rows lie in (between its SXM and its plane pair)


def temp_region(lw, n, aliased):
    """The grid of temporary n (aliased: an output's value, its region never freed) where one of
    the rules places it, else None (first fit)."""
    what = f"'{n.op}' at line {n.line}"
    side = None if aliased else side_of(lw, n)
    if side is not None and n.op == "tfold":
        k, ns = min(FOLD_SLICES, lw.m.mem_slices_per_hemisphere), lw.m.mem_slices
        return window_region(lw, n.shape, n.dtype, ((0, k),) if side == 0 else ((ns - k, k),), n.id, what)
    if side is not None and n.op == "matmul" and n.inputs[0] in lw.fold_feeds:
        # (a fed fold's product, lowered with the fold's TPINs: its f32 rows on its side, not in
        # the slices of p.T, whose reads for the other fold they crowded: movement.fed)
        half, f = lw.m.mem_slices_per_hemisphere, FOLDED_SLICES
        return window_region(lw, n.shape, n.dtype, ((0, half - f),) if side == 0 else ((half + f, half - f),), n.id, what)
    if side is not None:
        return side_region(lw, n.shape, n.dtype, side, n.id, what)
    if vxm_output(lw, n) if aliased else vxm_to_vxm(lw, n):
        k = OUTPUT_SLICES if aliased else FOLDED_SLICES if folded(lw, n) else NEAR_SLICES
        return near_region(lw, n.shape, n.dtype, None if aliased else n.id, what, k,
                           FOLDED_DEPTH if not aliased and folded(lw, n) else 1)
    return None


def joined_region(lw, n):
    """The grid of a joined concat n (its parts computed into their rows of its region) that a
    product installs as its weights (weights_of: a folded softmax's p @ concat(f16(v_h @ W_h)),
    rewrite_pack.split_joins and rewrite_pair) on that product's hemisphere (side_region), else
    None (first fit). First fit had spread its rows over every slice, and an LW of a row on the
    far side came up to 90 hops: the fold's products waited for their installs. Measured on
    attention_prefill (tsp-v1): 793 -> 788; 784 -> 763 with the roundings lowered after the sum
    (rewrite_pack.ROUND_AFTER); every other golden figure unchanged."""
    if lw.near_vxm is not None or lw.in_loop(n):
        return None
    w = weights_of(lw, n)
    side = output_side(lw, w) if w is not None else None
    if side is None:
        return None
    return side_region(lw, n.shape, n.dtype, side, n.id, f"'{n.op}' at line {n.line}")


def side_of(lw, n):
    """The hemisphere whose slices n's region lies on (`side_region`), else None (anywhere):
    the side of the unit that makes it (a product's plane pair: lower_mxm.output_side) or
    takes it (a transpose through the SXM buffers, which then takes the SXM of its source's
    side: movement.transpose_grid). A vector between the VXM and a unit at the chip's edge
    then travels the VXM's distance to that unit through SRAM, where slices on the far
    side made it up to three times that (the last vector of each pass came that much later).
    Measured (tsp-v1, with the accumulated heads of rewrite_pack): attention_prefill
    1,635 -> 1,445, matmul 384 -> 321, gpt2_block_prefill 3,995 -> 3,676,
    llama_block_prefill 6,343 -> 6,239, bert_base L=1 14,901 -> 14,803. Not in decode steps
    (their temporaries lie near the VXM), nor in the trips of a loop of several (a trip
    replays its twin, compiler/replay.py; measured there: gpt2_small_prefill L=3 46,716 ->
    46,903, L=12 182,368 -> 183,115, though bert_base L=12 166,659 -> 165,946)."""
    if lw.near_vxm is not None or lw.in_loop(n):
        return None
    if n.op == "matmul":
        return output_side(lw, n)
    w = weights_of(lw, n) if n.op != "slice" else None     # (not a lane move's copy: see there)
    if w is not None:
        return output_side(lw, w)
    # a transpose of one block, through the SXM of its source's side (movement.transpose_grid),
    # to that side's slices: first fit spread a softmax's p over both sides, and the rows for
    # the near plane pair went up to 89 hops away and came back (attention_prefill 1,342 ->
    # 1,279, llama_block_prefill 6,187 -> 6,179; of several blocks: tiny's 28,804 -> 28,939)
    if n.op == "tfold":
        return tfold_sxm(lw.g, n)
    if n.op == "transpose" and n.inputs[0] in lw.grid and max(n.shape[-2:]) <= lw.lanes:
        sides = {lw.ctx.sxm_near(int(x)) for x in np.asarray(lw.grid[n.inputs[0]]).reshape(-1)}
        if len(sides) == 1:
            return sides.pop()
    r = rows_of(lw, n) if n.op not in ("slice", "transpose") else None
    if r is not None:
        return output_side(lw, r)
    us = lw.g.users(n.id)
    if len(us) != 1 or lw.g.node(us[0]).op not in ("transpose", "tfold") or lw.plan.kind[us[0]] != "temp":
        return None
    return lw.ctx.next_sxm()


def weights_of(lw, n):
    """The product that installs n as its weights (n its only user's right operand, through
    reshapes and transposes), else None: its rows travel from the VXM to that product's
    plane pair through SRAM, as a product's output rows do the other way. Measured (the
    packed heads' masked queries, a softmax's p installed for p @ v): attention_prefill
    1,442 -> 1,342 (a masked query row on the far side's slot 0 had been the install's last,
    90 hops from its pair), gpt2_block_prefill 3,676 -> 3,615, llama_block_prefill 6,196 ->
    6,187; slices' copies too made llama_block_prefill 6,286 and bert_base L=1 14,836."""
    r = _product_of(lw, n, ("reshape", "transpose"), ("view", "mxm_t"))
    if r is None:
        return None
    x, u = r
    return u if len(u.inputs) == 2 and u.inputs[1] == x.id and u.inputs[0] != x.id else None


def _product_of(lw, n, views, kinds):
    """(x, u): the product u that n reaches, each step through its one user, over views whose op
    is in `views` and plan kind in `kinds`, and x the node u reads; None where the walk stops."""
    x = n
    while True:
        us = lw.g.users(x.id)
        if len(us) != 1:
            return None
        u = lw.g.node(us[0])
        if u.op == "matmul":
            return x, u
        if u.op not in views or lw.plan.kind[u.id] not in kinds:
            return None
        x = u


def rows_of(lw, n):
    """The product that takes n as its rows (n, through views, its one user's left operand),
    else None: its rows travel from the VXM to that product's plane pair through SRAM, as its
    weights do (weights_of). First fit had put the packed heads' keys (f16(k), the score
    product's rows) on both sides: the far side's rows came 90 hops later, out of order, and
    so did their masked scores' max blocks. Measured: attention_prefill 823 -> 840 alone,
    821 with the max's last items raw (lower_reduce._raw_last); gpt2_block_prefill 3,411 ->
    3,269 alone, 3,252 with it (its ffn's and its heads' rows); the others unchanged."""
    r = _product_of(lw, n, ("reshape", "slice"), ("view",))
    if r is None:
        return None
    x, u = r                   # (one accumulating into another's sum: its side once that is lowered)
    ok = u.inputs[0] == x.id and x.id not in u.inputs[1:]
    return u if ok and (len(u.inputs) == 2 or u.inputs[2] in lw.ctx.acc_jobs) else None


def reduced_across(lw, nid) -> bool:
    """A reduction across vectors (a packed softmax's max or sum over its keys): its few
    vectors are made on the VXM and read there by every row of its users, so they lie in
    the slices nearest it (alone at its depth, as its partials: lower_reduce._partials).
    Measured: attention_prefill 1,279 -> 1,234 (first fit had put the max 16 hops away: 32
    cycles from its last op to the first read of it), gpt2_block_prefill 3,613 -> 3,570;
    with a margin of 4 hops, or with peers: llama_block_prefill 6,179 -> 6,235 or 6,181."""
    n = lw.g.node(nid)
    return n.op in ("max", "sum", "mean") and len(n.shape) > 1 and \
        n.attrs["axis"] % len(n.shape) != len(n.shape) - 1 and lower_reduce.peers_across(lw, n) == 1


def side_region(lw, shape, dtype, h, owner, what):
    """A region whose vectors all lie on hemisphere h's slices (whole rows of slots taken,
    the other side's slots of those rows left unused)."""
    half = lw.m.mem_slices_per_hemisphere
    return window_region(lw, shape, dtype, ((h * half, half),), owner, what)


def vxm_to_vxm(lw, n) -> bool:
    """n is made on the VXM and read only by VXM ops, one of them a lone reduction across
    vectors (a packed softmax's masked scores and exponentials): `near_region`. First fit
    spread them over every slice, the farthest 46 hops away, and each trip to SRAM and back
    cost up to 92 cycles. Measured (NEAR_SLICES 8, 12, 16, 20, 24, 32, 44): attention_prefill
    1,234 -> 1,326, 1,417, 1,191, 1,177, 1,189, 1,203, 1,242; gpt2_block_prefill 3,570 ->
    3,669, 3,622, 3,503, 3,495, 3,507, 3,536, 3,566 (few slices: their banks crowd). After the
    streamed folds and the softmax's anchored products (attn13w + attn13x), NEAR_SLICES 4, 8, 12,
    16, 18, 20, 22, 24, 30: attention_prefill 962, 871, 913, 820, 820, 817, 817, 815, 816;
    gpt2_block_prefill 3,376, 3,371, 3,282, 3,244, 3,244, 3,241, 3,241, 3,262, 3,237; first fit
    instead: 814 and 3,260."""
    if lw.near_vxm is not None or lw.in_loop(n) or n.op not in ops.ELEMENTWISE:
        return False
    if folded(lw, n):
        return True          # (folded through both SXMs: the VXM's slices are halfway to each)
    us = [lw.g.node(u) for u in lw.g.users(n.id)]
    vxm = all(u.op in ops.ELEMENTWISE or reduced_across(lw, u.id) for u in us)
    return vxm and any(reduced_across(lw, u.id) for u in us)


def folded(lw, n) -> bool:
    """n is folded through both SXMs (its users tfolds: rewrite_pair): every row goes to both,
    from the FOLDED_SLICES slices a side nearest the VXM, not NEAR_SLICES. Measured (with the
    streamed folds, movement._fold_streamed; 4, 6, 8, 12, 16, 20): attention_prefill 848, 845,
    849, 851, 856, 864 (2: 899, their banks crowd); with near_region's sides from the VXM out
    (4, 6, 8, 10): 822, 819, 816, 817; with the fed folds (movement.fed; 6, 8, 9, 10, 12): 808,
    806, 806, 805, 809.
    Its rows lie FOLDED_DEPTH rows of slots deep at each distance from the VXM (near_region's
    depth: rows 0-3 one slice pair from it, west, east, west, east, rows 4-7 the next pair...):
    each fold reads the rows in order, and a row on the far side of the VXM from its SXM comes
    twice its distance later (one row of slots: rows 2k and 2k + 1 at distance 2k + 1, row 6
    14 hops late where it was needed 6 cycles after row 0; the second fold's columns 2-6
    waited on them). Measured with the paired TPINs (movement._fold_tpins), FOLDED_DEPTH 1, 2,
    3, 4: attention_prefill 792, 790, 793, 793; with the division's chains of 6-8 rows (branch
    attn13za), rows a chain, FOLDED_DEPTH, FOLDED_SLICES (group, depth: slices 6, 8, 10):
    6, 1: 789, 793, 794; 6, 2: 790, 789, 790; 6, 3: 792, 788, 788; 7, 1: 790, 792, 794;
    7, 2: 794, 787, 790; 7, 3: 791, 792, 794; 8, 1: 789, 792, 794; 8, 2: 792, 790, 792;
    8, 3: 795, 793, 792 (the folds' last columns read out at 703/700 -> 700/699). Merged with
    attn13zb (the roundings after the division, 4-row max blocks), chains of 8 rows (the 7-row
    chains were dropped): FOLDED_DEPTH 1, 2 x SUM_GROUPS 5, 6, 7 x FOLDED_SLICES 8, 10 ->
    1: 744, 746 / 740, 744 / 750, 753; 2: 741, 740 / 740, 740 / 747, 746 (gpt2_block_prefill
    3,226, 3,225, 3,233 by SUM_GROUPS)."""
    us = [lw.g.node(u) for u in lw.g.users(n.id)]
    return len(us) > 1 and all(u.op == "tfold" for u in us)


def vxm_output(lw, n) -> bool:
    """n, an output's value, is made on the VXM: `near_region`, in the OUTPUT_SLICES slices a
    side nearest it (its last writes are the program's end; 20 slices a side had put the last
    rows up to 20 hops away; with 2, 4, 8, 16: attention_prefill 864 -> 849, 851, 855, 863,
    gpt2_block_prefill 3,411 -> 3,405, 3,407, 3,411, llama_block_prefill 6,106 -> 6,090,
    6,090, 6,094, mlp 594 -> 580, 582, 582, matmul 257 -> 242, 244, 248). Not a value a pipeline stage sends over a link (named LINK_PREFIX...): its
    SENDs read it a vector per link slot, and the near slices' banks spaced them further apart."""
    outs = [lw.g.node(u).attrs.get("name", "") for u in lw.g.users(n.id) if lw.g.node(u).op == "output"]
    return lw.near_vxm is None and not lw.in_loop(n) and n.op in ops.ELEMENTWISE and \
        not any(o.startswith(LINK_PREFIX) for o in outs)


def near_region(lw, shape, dtype, owner, what, k, depth=1):
    """A region whose vectors lie in the k slices (at least a vector's planes) nearest the VXM
    on each side, alternating west and east, each side's from the VXM out (`window_region`; the
    west side's had gone from its far end in: attention_prefill 830 -> 819, gpt2_block_prefill
    3,405 -> 3,399)."""
    half = lw.m.mem_slices_per_hemisphere
    k = min(max(k, dtype_width(dtype)), half)
    return window_region(lw, shape, dtype, ((half - k, k, -1), (half, k)), owner, what, depth)


def window_region(lw, shape, dtype, windows, owner, what, depth=1):
    """A region whose vectors lie in the given windows of slices ((first slice, count) each,
    none across the hemispheres' boundary; (first, count, -1): filled from its last slice
    down), vector j in window j % len(windows): whole rows of slots taken, the slots outside
    the windows left unused."""
    w = dtype_width(dtype)
    ns = lw.m.mem_slices
    g = grid_shape(shape, lw.lanes)
    nvec = int(np.prod(g))
    per_win = [cnt // w for _, cnt, *_ in windows]
    nw = len(windows)
    per_row = min(per_win) * nw
    block = per_row * depth
    size = (-(-nvec // block) * depth + 1) * ns
    start = lw.alloc.alloc(size, what)
    base = -(-start // ns) * ns
    j = np.arange(nvec, dtype=np.int64)
    first = np.asarray([f for f, *_ in windows], np.int64)
    down = np.asarray([len(x) > 2 and x[2] < 0 for x in windows])[j % nw]
    i = j % block
    k = i // nw // depth * w
    arow = (j // block) * depth + (i // nw) % depth
    off = np.where(down, first[j % nw] + np.asarray([c for _, c, *_ in windows])[j % nw] - w - k, first[j % nw] + k)
    if owner is not None:         # (an output's region is never freed)
        lw.regions[owner] = lw.placed[owner] = (start, size)
    return (base + arow * ns + off).reshape(g)


def edge_weights(lw, persistent) -> dict:
    """Weights that one product of a declared tensor installs whole, one tile (its right
    operand, at most lanes x lanes: one job, on one plane pair; not in a decode step): the
    program's first installs, on its critical path from cycle 0. When all of them fit in
    EDGE_SHARE of the SRAM so laid: weight id -> the window of the EDGE_SLICES slices at one
    edge of the chip, west and east by turns, and the product runs on that edge's plane pair
    (lower_mxm._weight_units, from `lw.weight_side`). First fit spread a weight over every slice,
    and its install took the farthest slice's distance (attention_prefill: wq and wk installed
    at cycle 94, now 27). Measured with EDGE_SLICES 8, 12, 16, 24: attention_prefill 1,121,
    1,099, 1,099, 1,113; matmul 265, 258, 257, 260 (317 before). Weights wider than the lanes
    (their product's chunks on both pairs) or of a product later in the program (installed
    while earlier work runs) made gpt2_block_prefill slower: 3,475 -> 3,611, 3,538."""
    if lw.near_vxm is not None:
        return {}
    m = lw.m
    half, ns = m.mem_slices_per_hemisphere, m.mem_slices
    k = min(EDGE_SLICES, half)
    out, turn, size = {}, 0, 0
    for n in persistent:
        us = lw.g.users(n.id)
        if n.op != "weight" or len(us) != 1 or lw.g.node(us[0]).op != "matmul" or len(n.shape) != 2 or \
                max(n.shape) > lw.lanes or list(lw.g.node(us[0]).inputs[1:]) != [n.id] or lw.in_loop(n) or \
                lw.g.node(lw.g.node(us[0]).inputs[0]).op not in ("input", "weight", "state"):
            continue
        w = dtype_width(n.dtype)
        size += (-(-int(np.prod(grid_shape(n.shape, lw.lanes))) // (k // w)) + 1) * ns
        out[n.id] = (0, k) if turn == 0 else (ns - k, k)
        lw.weight_side[us[0]] = turn
        turn ^= 1
    if size * lw.lanes > m.sram_bytes * EDGE_SHARE:
        lw.weight_side.clear()
        return {}
    return out
