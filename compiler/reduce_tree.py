"""One chain of a pairwise tree of VXM ops across vectors (`tree_chain`), and how many vectors
one takes (`_tree_leaves`): the building block of the reductions across vectors (lower_reduce)
and of a lane reduction's chunks (lower_lanes).
"""
from __future__ import annotations

from lpu.compiler.chains import ChainBuilder
from lpu.compiler.lower_common import stage, vxm_chain
from lpu.isa import opcodes as O
from lpu.isa.dtypes import DTYPE_CODE, FLOATS, dtype_width
from lpu.isa.machine import EAST, WEST


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
