"""Fused elementwise ops: a chain of elementwise ops (x - mu, * r, * g, + b, cast ...) whose
intermediate results have one user each runs as one chain per output vector: the leaves are
READ once, each op feeds the next over a VXM-to-VXM stream link, and only the last result is
written. Unfused, every op is its own READ -> VXM -> WRITE trip between a MEM slice and the
VXM (tens of cycles each way), which is what a one-row (decode) program waits on.

The plan (plan.py) marks such producers "fused": they get no storage and no code of their own;
the op that uses them lowers the whole tree here (a producer broadcast along the leading axis,
f16(Q) under the packed heads' masks, computed again for each copy). A small producer with several elementwise
users (layernorm's x - mean) is fused into each of them: computed again, never stored. In
small ops an operand broadcast along the lanes is spread by the SXM (DISTRIBUTE) inside the
chain too, instead of through a temporary. Each op keeps its dtype, its opcode and its
rounding (a link carries the producer's result dtype), so results are bit for bit the unfused
ones. A vector whose chain cannot be placed (two leaves on one bank in one cycle, or more stream
planes on one diagonal than the machine has) copies one leaf to other slices first and runs as
one chain after all (`STAGE_RATE`), or is computed op by op through temporaries: a clash had
made the last rows of a softmax pass stragglers, one trip per op behind the others.
"""
from __future__ import annotations

import numpy as np

from lpu.compiler import lower_reduce, ops
from lpu.compiler.chains import ChainBuilder
from lpu.compiler.lower_common import copy_outside, imm_bits, nv_chunks, sxm_chain, vxm_chain
from lpu.isa import opcodes as O
from lpu.isa.dtypes import DTYPE_CODE, FLOATS, dtype_width
from lpu.isa.machine import EAST, WEST

MAX_FUSED = 3          # producers folded into one consumer: the chain's width stays small
MAX_FUSED_SMALL = 4    # the same for a consumer of at most DUP_MAX_VECTORS vectors: a decode step's
#                        residual x + f16((p1 + p2) * s + b) after a K-split product
#                        (rewrite_latency.split_gemv) is one chain, not two trips through SRAM
#                        (measured: gpt2_small_decode 29,256 -> 28,784; 5, 6 and 8 the same); 4 for
#                        every consumer made bert_base faster (166,659 -> 165,765) but the wide rows of
#                        tests/test_schedule_quality.py's FUSE on tiny slower (556 -> 680: clashes)
GROUP = 8              # output vectors per chain at most when they share a broadcast operand (a folded
#                        p.T's division in chains of 7 rows, branch attn13za: 790 -> 787 before attn13zb's
#                        roundings after the division, 740 -> 745 with them; dropped)
STAGE_RATE = 16        # a vector whose operands clash on a bank is computed in one chain after a
#                        copy of one operand (`_staged_chain`) while at most one vector in this many
#                        of the node has clashed, else op by op. Measured (cycles, op by op -> staged):
#                        bert_base 216,340 -> 212,175, gpt2_small_prefill 220,250 -> 214,563,
#                        attention_prefill 2,237 -> 2,153, mlp 714 -> 671; where clashes are frequent
#                        (mlp on tiny: 320 of 2,048 vectors) copying every one was slower (33,435 -> 33,455)
DUP_SUBTREE = 1        # fused producers that a producer computed again in each user may carry: a decode
#                        head's e = exp(s - max) is computed in each of the casts that make its hi and lo
#                        rows, not stored and read back (measured: gpt2_small_decode 28,196 -> 28,005,
#                        llama_block_decode 1,721 -> 1,701, gpt2_block_decode 1,773 -> 1,765,
#                        attention_decode 915 -> 904; 2 the same; 0 as before)
DUP_MAX_VECTORS = 16   # a producer computed again in each of its users only up to this size: in
#                        a one-row (decode) program its trip is latency; in a prefill its operands'
#                        lane broadcasts, done again per user, cost more SXM time than it saves
#                        (measured: gpt2_block_prefill slower, gpt2_block_decode faster)


def _vectors(shape, lanes) -> int:
    return int(np.prod(shape[:-1], dtype=np.int64)) * -(-(shape[-1] if shape else 1) // lanes)


def _elementwise(n) -> bool:
    return bool(ops.OPS[n.op].vxm)


def _max_fused(u, lanes: int) -> int:
    return MAX_FUSED_SMALL if _vectors(u.shape, lanes) <= DUP_MAX_VECTORS else MAX_FUSED


def _fits(ps, us) -> bool:
    """A producer of shape ps fused into a user of shape us: the same shape, or broadcast along
    the leading axis (computed again for each of its copies)."""
    return ps == us or len(ps) == len(us) > 2 and ps[0] == 1 and ps[1:] == us[1:]


def fusable(graph, kind: dict, lanes: int) -> set:
    """Producers to fuse into their one elementwise user (see the module doc)."""
    fused: set = set()
    size: dict = {}
    for u in graph.nodes():
        if kind.get(u.id) != "temp" or not _elementwise(u):
            continue
        size[u.id] = 0
        for p in u.inputs:
            pn = graph.node(p)
            if (kind.get(p) == "temp" and _elementwise(pn) and graph.users(p) == [u.id]
                    and _fits(pn.shape, u.shape) and u.inputs.count(p) == 1 and p not in graph.outputs.values()
                    and size[u.id] + size.get(p, 0) + 1 <= _max_fused(u, lanes)):
                fused.add(p)
                size[u.id] += size.get(p, 0) + 1
    for p in graph.nodes():       # a small producer of several elementwise users: recomputed in each
        users = graph.users(p.id)
        if (p.id in fused or kind.get(p.id) != "temp" or not _elementwise(p) or len(users) < 2
                or _vectors(p.shape, lanes) > DUP_MAX_VECTORS
                or p.id in graph.outputs.values() or size.get(p.id, 0) > DUP_SUBTREE):
            continue
        own = size.get(p.id, 0) + 1
        if all(kind.get(u) == "temp" and _elementwise(graph.node(u)) and graph.node(u).shape == p.shape
               and graph.node(u).inputs.count(p.id) <= 2 and size.get(u, 0) + own <= _max_fused(graph.node(u), lanes) for u in users):
            fused.add(p.id)
            for u in users:
                size[u] += own
    return fused


def lower_fused(lw, n, operand):
    """Lower elementwise node n together with its fused producers; `operand` is lower_ops'
    operand resolver ((grid, dtype) broadcast to n's grid, or an immediate)."""
    out = lw.grid[n.id]
    lw.pending_free = []
    tree = _tree(lw, n, out, operand)
    flat_out = out.reshape(-1)
    nvs = nv_chunks(n.shape, lw.lanes, out.shape[-1])
    nvs = [int(x) for x in np.broadcast_to(nvs, out.shape).reshape(-1)]
    group = _group_size(lw, tree, len(flat_out)) if _row_of_reduction(lw, n) else 1
    done = _block_chains(lw, n, tree, out, nvs, group)
    _rows(lw, n, tree, [j for j in range(len(flat_out)) if j not in done], flat_out, nvs, group)
    for r in lw.pending_free:
        lw.free_temp(r)


def _rows(lw, n, tree, todo, flat_out, nvs, group):
    """Output vectors `todo` (flat indexes) in chains of up to `group`, halved where one cannot
    be placed; a vector alone that still cannot be is staged or made op by op."""
    i = 0
    clashes = 0
    while i < len(todo):
        g = min(group, len(todo) - i)
        while g > 1 and not _fused_chain(lw, n, tree, [(j, int(flat_out[j]), nvs[j]) for j in todo[i:i + g]]):
            g //= 2
        k = todo[i]
        if g == 1 and not _fused_chain(lw, n, tree, [(k, int(flat_out[k]), nvs[k])]):
            clashes += 1
            rare = clashes <= 1 + i // STAGE_RATE
            if not (rare and _staged_chain(lw, n, tree, k, int(flat_out[k]), nvs[k])):
                _unfused(lw, n, tree, k, (int(flat_out[k]), n.dtype), nvs[k])
        i += g


def small(lw, n) -> bool:
    """Few enough output vectors that a lane broadcast rides in the op's own chain."""
    return _vectors(n.shape, lw.lanes) <= DUP_MAX_VECTORS


def needs_spread(lw, nid, shape) -> bool:
    """Operand nid is broadcast along the last axis of `shape`: lane 0 spread by DISTRIBUTE."""
    sh = lw.g.node(nid).shape
    return (lw.plan.kind[nid] != "imm" and (sh[-1] if sh else 1) == 1 and (shape[-1] if shape else 1) > 1
            and not splat(lw, nid))


def splat(lw, nid) -> bool:
    """Node nid is a view of a value held in every lane of its vectors (compiler/rewrite.py):
    read as it is wherever it is broadcast along the lanes."""
    n = lw.g.node(nid)
    return n.op == "slice" and bool(n.attrs.get("splat")) and lw.plan.kind[nid] == "view"


def _tree(lw, n, out, operand):
    kids = []
    for i in n.inputs:
        if lw.plan.kind[i] == "fused":
            kids.append(("op", _tree(lw, lw.g.node(i), out, operand)))
        elif needs_spread(lw, i, n.shape) and small(lw, n) and (lw.plan.kind[n.id] != "fused"
                                                                or len(lw.g.users(n.id)) == 1):
            # (not in a producer computed again per user: its SXM trip would be too)
            kids.append(("spread", ("grid", np.broadcast_to(lw.grid[i], out.shape), lw.g.node(i).dtype)))
        else:
            kids.append(("leaf", operand(lw, i, n.shape, out, n)))
    return n, kids


def _fields(node, vals):
    """(a, b, imm, bimm) of a node's VXM instruction from its operands: ('g', (group, code), dt)
    or ('imm', value, dt)."""
    cfloat = node.dtype in FLOATS or any(v[2] in FLOATS for v in vals)
    if len(vals) == 2 and vals[1][0] == "imm":
        return vals[0][1], None, imm_bits(vals[1][1], cfloat), 1
    if len(vals) == 2 and vals[0][0] == "imm":
        return None, vals[1][1], imm_bits(vals[0][1], cfloat), 2
    return vals[0][1], (vals[1][1] if len(vals) > 1 else None), 0, 0


def _opcode(node) -> int:
    return O.BY_NAME[ops.OPS[node.op].vxm].code


def _row_of_reduction(lw, n) -> bool:
    """An operand of n (or of its fused producers) is a reduction over axis 0 broadcast back
    over the rows (measured: grouping rows that share other operands, a bias say, was slower)."""
    for i in n.inputs:
        x = lw.g.node(i)
        if lw.plan.kind[i] == "fused" and _row_of_reduction(lw, x):
            return True
        if x.op in ("max", "sum", "mean") and x.attrs.get("axis") == 0 and len(x.shape) == 2 and x.shape[0] == 1:
            return True
    return False


def _ops(tree) -> int:
    return 1 + sum(_ops(x) for kind_, x in tree[1] if kind_ == "op")


def _group_size(lw, tree, nvec) -> int:
    """Output vectors per chain: one, unless a leaf operand is one vector broadcast over the
    rows (softmax's x - max and e / sum over transposed scores): then a chain computes up to
    GROUP of them and READs that vector once, so its bank, which serves one access a cycle,
    does not make the rows queue behind each other (up to as many ops as the VXM has ALUs)."""
    def shared(t):
        for kind_, x in t[1]:
            if kind_ == "spread":
                return False
        for kind_, x in t[1]:
            if kind_ == "op" and shared(x):
                return True
            if kind_ == "leaf" and x[0] == "grid" and nvec > 1:
                flat = x[1].reshape(-1)
                if flat[0] == flat[1]:
                    return True
        return False

    one = nvec < 2 or not shared(tree)
    shared = None   # a recursive closure is a reference cycle
    if one:
        return 1
    return max(1, min(GROUP, lw.m.vxm_alus // _ops(tree)))


def _block_chains(lw, n, tree, out, nvs, group) -> set:
    """Rows of n whose sum across vectors is a lone reduction (a packed softmax's exponentials):
    each aligned block of the sum's first level (lower_reduce.first_blocks) in one chain that
    writes the block's rows and, from the same streams, their sum, which the reduction takes as
    its first level (its own pairwise order): the sum's tree starts as the rows come out, not
    after the pass. A block whose chain cannot be placed (operands on one bank) makes its rows
    as the others are made and its sum read back from them right after (the same tree). Returns
    the flat output indexes done."""
    spec = lower_reduce.first_blocks(lw, n, "sum", _ops(tree), lower_reduce.SUM_ROWS,
                                       lower_reduce.SUM_GROUPS) if len(n.shape) == 2 else None
    if spec is None:
        return set()
    red, rows, slots = spec
    done, held, ncol = set(), [], out.shape[-1]
    flat_out = out.reshape(-1)
    for (blk, col), slot in slots.items():
        ks = [r * ncol + col for r in range(blk * rows, (blk + 1) * rows)]
        lw.first_level[red]["pre"][blk, col] = (slot, "f32")
        items = [(k, int(flat_out[k]), nvs[k]) for k in ks]
        if not _fused_chain(lw, n, tree, items, slot) and not _staged_block(lw, n, tree, items, slot):
            _rows(lw, n, tree, ks, flat_out, nvs, group)
            lower_reduce.tree_chain(lw, n, O.VXM_BINARY["ADD"], [(int(flat_out[k]), n.dtype) for k in ks],
                                    (slot, "f32"), lw.lanes, held)
        done.update(ks)
    lw.pending_free += held
    return done


def _staged_block(lw, n, tree, items, slot) -> bool:
    """A block's chain (_block_chains) whose operands clash on a bank, after a copy of one row's
    operand to slices no other operand of the block uses (as _staged_chain for one vector):
    gpt2_block_prefill 3,422 -> 3,412, attention_prefill 891 -> 890 (with SUM_GROUPS 7). False (nothing added) when
    no copy makes it fit."""
    nsl = lw.ctx.nslices
    leaves = [(k, p, v) for k, _, _ in items for p, v in _leaves(tree, k)]
    bad = {(v[0] + i) % nsl for _, _, v in leaves for i in range(dtype_width(v[1]))}
    for k, path, v in leaves:
        mark = len(lw.chains)
        got = copy_outside(lw, n, v, bad)
        if got is None:
            continue
        slot0, region = got
        t = tree
        for i in path[:-1]:
            t = t[1][i][1]
        copy = np.array(t[1][path[-1]][1][1]).reshape(-1)        # (row k's operand taken from the copy)
        copy[k] = slot0
        staged = _replaced(tree, path, ("grid", copy, v[1]))
        if _fused_chain(lw, n, staged, items, slot):
            lw.pending_free.append(region)
            return True
        del lw.chains[mark:]
        lw.free_temp(region)
    return False


def _fused_chain(lw, n, tree, items, total=None) -> bool:
    """One chain computing the output vectors `items` ((k, out slot, nv) each); operands they
    share are READ once; with `total` (a slot), the pairwise sum of the items too (f32)."""
    c = lw.ctx
    vpos = c.m.vxm_pos
    cb = ChainBuilder(c, n.line, n.id)
    reads: dict = {}
    k = 0

    def emit(t, off, out_grp, nv_):
        node, kids = t
        vals = []
        for kind_, x in kids:
            if kind_ == "op":
                child = x[0]
                w = dtype_width(child.dtype)
                g = (cb.link(vpos, vpos, off, w), DTYPE_CODE[child.dtype])
                emit(x, off - c.lat[_opcode(child)], g, None)
                vals.append(("g", g, child.dtype))
            elif kind_ == "spread":           # READ -> SXM DISTRIBUTE -> the op, one trip
                slot, dt = int(x[1].reshape(-1)[k]), x[2]
                w = dtype_width(dt)
                h = c.sxm_near(slot)
                spos = c.m.sxm_pos(h)
                ts = off - (c.lat[O.DISTRIBUTE] + abs(vpos - spos))
                gi = cb.read(slot, w, spos, ts)
                g = (cb.link(spos, vpos, off, w), DTYPE_CODE[dt])
                cb.sxm(O.DISTRIBUTE, h, ts, (gi, DTYPE_CODE[dt]), g, 0)
                vals.append(("g", g, dt))
            elif x[0] == "imm":
                vals.append(("imm", x[1], x[2]))
            else:
                slot, dt = int(x[1].reshape(-1)[k]), x[2]
                key = (slot, dtype_width(dt), off)
                if key not in reads:
                    reads[key] = cb.read(slot, dtype_width(dt), vpos, off)
                vals.append(("g", (reads[key], DTYPE_CODE[dt]), dt))
        a, b, imm, bimm = _fields(node, vals)
        cb.vxm(_opcode(node), off, a, b, out_grp, nv=nv_, imm=imm, bimm=bimm)

    lat = c.lat[_opcode(n)]
    level = []
    for k, out_slot, nv in items:
        go = (cb.write(out_slot, dtype_width(n.dtype), vpos, lat), DTYPE_CODE[n.dtype])
        emit(tree, 0, go, nv)
        level.append(go)
    emit = None     # a recursive closure is a reference cycle: left, it holds the chain until a GC pass
    add, turn, t = O.VXM_BINARY["ADD"], 0, lat
    while total is not None and len(level) > 1:     # pairwise, an odd last item carried up
        nxt = []
        for i in range(0, len(level) - 1, 2):
            turn ^= 1                  # (links alternate direction: half the planes each way)
            d = EAST if turn else WEST
            o = (cb.write(total, 4, vpos, t + c.lat[add]) if len(level) == 2 else
                 cb.f.add_group(d, t + c.lat[add] - vpos if d == EAST else t + c.lat[add] + vpos, 4),
                 DTYPE_CODE["f32"])
            cb.vxm(add, t, level[i], level[i + 1], o, nv=c.lanes)
            nxt.append(o)
        level = nxt + level[len(level) - len(level) % 2:]
        t += c.lat[add]
    if cb.mem_conflict():
        return False
    need: dict = {}
    for d, koff, w in cb.groups:
        need[d, koff] = need.get((d, koff), 0) + w
    if max(need.values()) > c.m.streams_per_direction:
        return False
    lw.chains.append(cb.chain())
    return True


def _leaves(tree, k, path=()):
    """(path, (slot, dtype)) of each SRAM operand of vector k in the tree (path: kid indexes)."""
    out = []
    for i, (kind_, x) in enumerate(tree[1]):
        if kind_ == "op":
            out += _leaves(x, k, path + (i,))
        elif kind_ == "leaf" and x[0] == "grid":
            flat = x[1].reshape(-1)
            out.append((path + (i,), (int(flat[k]), x[2])))
    return out


def _replaced(tree, path, leaf):
    node, kids = tree
    kids = list(kids)
    i = path[0]
    kids[i] = (kids[i][0], _replaced(kids[i][1], path[1:], leaf)) if len(path) > 1 else ("leaf", leaf)
    return node, kids


def _staged_chain(lw, n, tree, k, out_slot, nv) -> bool:
    """Vector k in one chain after all, its operands' banks clashing: one operand copied first
    to slices none of the others use (one more trip for that operand, where the op-by-op form
    takes one per op of the tree). Every read of that operand takes the copy: in layernorm's
    (x - mu) * (x - mu) x is read by both subtrees, and a copy in one left the other's read
    clashing with mu (the staging failed, op by op: gpt2_small_decode 28,784 -> 28,196)."""
    leaves = _leaves(tree, k)
    nsl = lw.ctx.nslices
    for path, v in leaves:
        same = [p for p, o in leaves if o == v]    # every read of that operand (x in (x - mu) * (x - mu))
        if path != same[0]:
            continue
        bad = {(o[0] + i) % nsl for p, o in leaves if o != v for i in range(dtype_width(o[1]))}
        mark = len(lw.chains)
        got = copy_outside(lw, n, v, bad)
        if got is None:
            continue
        slot0, region = got
        copy = np.full(k + 1, slot0, np.int64)
        staged = tree
        for p in same:
            staged = _replaced(staged, p, ("grid", copy, v[1]))
        if _fused_chain(lw, n, staged, [(k, out_slot, nv)]):
            lw.pending_free.append(region)
            return True
        del lw.chains[mark:]
        lw.free_temp(region)
    return False


def _unfused(lw, n, tree, k, dst, nv):
    """Vector k of the tree op by op: each fused producer into a temporary vector."""
    node, kids = tree
    vals, held = [], []
    for kind_, x in kids:
        if kind_ == "op":
            child = x[0]
            grid, region = lw.temp((1, lw.lanes), child.dtype)
            held.append(region)
            _unfused(lw, n, x, k, (int(grid.reshape(-1)[0]), child.dtype), lw.lanes)
            vals.append(("g", (int(grid.reshape(-1)[0]), child.dtype), child.dtype))
        elif kind_ == "spread":
            grid, region = lw.temp((1, lw.lanes), x[2])
            held.append(region)
            sxm_chain(lw, n, O.DISTRIBUTE, int(x[1].reshape(-1)[k]), int(grid.reshape(-1)[0]), x[2], 0)
            vals.append(("g", (int(grid.reshape(-1)[0]), x[2]), x[2]))
        elif x[0] == "imm":
            vals.append(("imm", x[1], x[2]))
        else:
            vals.append(("g", (int(x[1].reshape(-1)[k]), x[2]), x[2]))
    a, b, imm, bimm = _fields(node, vals)
    vxm_chain(lw, n, _opcode(node), dst[0], dst[1], nv, a, b, imm=imm, bimm=bimm)
    for r in held:
        lw.pending_free.append(r)

