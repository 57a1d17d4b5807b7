"""Lowering of each op family to chains (see chains.py and lower_common.py for the building
blocks). `LOWER` maps every op of the table (compiler/ops.py) to its routine.

  elementwise   READ operands -> VXM op (the table's opcode) -> WRITE, one chain per output
                vector; a scalar constant rides along as the instruction's immediate; an operand
                broadcast along the last axis is first spread over the lanes by the SXM
                (DISTRIBUTE)
  where         READ cond, a, b -> KEEP and DROP on two ALUs -> ADD -> WRITE
  reductions    over the last axis: chunks combined on the VXM, then a lane tree
                (SXM SHIFT or ROTATE by 1, 2, 4, ... feeding VXM ADD or MAX); over other axes:
                pairwise trees of VXM ops across vectors, fed from the streams, one chain per
                block of vectors (as many as the ALUs and streams allow), then over the blocks
  matmul        per output chunk and block of rows, on one MXM plane (i8) or plane pair (f16):
                for each K-tile, LW its rows, IW, then one ABC per row accumulating in place;
                ACC and WRITE each row at the end
  lane moves    slices, concats and reshapes that move data between lanes: per output vector,
                one SXM PERMUTE per source vector, summed on the VXM
  transpose     the SXM transpose buffers: TPIN rows, TPOUT columns
"""
from __future__ import annotations

import numpy as np

from lpu.compiler import lower_fuse, lower_lanes, lower_mxm, lower_reduce, movement, ops
from lpu.compiler.lower_common import (
    NEG_INF_BITS, copy, imm_bits, nv_of, stage, sxm_chain, vxm_chain,
)
from lpu.compiler.lower_common import nv_chunks, vxm_rows
from lpu.compiler.chains import ChainBuilder
from lpu.isa import opcodes as O
from lpu.isa.machine import EAST, WEST
from lpu.isa import dtypes
from lpu.isa.dtypes import DTYPE_CODE, FLOATS, dtype_width

NP_DTYPE = dtypes.NP_DTYPE          # (lower.py's constants)



# ---- elementwise ---------------------------------------------------------------------------
def _operand(lw, nid, out_shape, out_grid, node):
    """(grid broadcast to the output grid, dtype) or ('imm', value) for a scalar constant."""
    n = lw.g.node(nid)
    if lw.plan.kind[nid] == "imm":
        return "imm", float(np.asarray(n.attrs["value"]).reshape(-1)[0]), n.dtype
    grid = lw.grid[nid]
    last = n.shape[-1] if n.shape else 1
    if last == 1 and (out_shape[-1] if out_shape else 1) > 1 and not lower_fuse.splat(lw, nid):
        tgrid, region = lw.temp(n.shape if n.shape else (1,), n.dtype)
        for idx in np.ndindex(grid.shape):
            sxm_chain(lw, node, O.DISTRIBUTE, int(grid[idx]), int(tgrid[idx]), n.dtype, 0)
        lw.pending_free.append(region)
        grid = tgrid
    return "grid", np.broadcast_to(grid, out_grid.shape), n.dtype


def lower_elementwise(lw, n):
    if any(lw.plan.kind[i] == "fused" for i in n.inputs) or (
            lower_fuse.small(lw, n) and any(lower_fuse.needs_spread(lw, i, n.shape) for i in n.inputs)):
        lower_fuse.lower_fused(lw, n, _operand)
        return
    out = lw.grid[n.id]
    lw.pending_free = []
    args = [_operand(lw, i, n.shape, out, n) for i in n.inputs]
    op = O.BY_NAME[ops.OPS[n.op].vxm].code
    cfloat = n.dtype in FLOATS or any(o[2] in FLOATS for o in args)
    lanes = lw.lanes
    bimm, imm = 0, 0
    if len(args) == 2 and args[1][0] == "imm":
        bimm, imm = 1, imm_bits(args[1][1], cfloat)
    elif len(args) == 2 and args[0][0] == "imm":
        bimm, imm = 2, imm_bits(args[0][1], cfloat)
    srcs = [(np.broadcast_to(o[1], out.shape).reshape(-1), o[2]) if o[0] == "grid" else None for o in args]
    if bimm == 2:          # imm op b: the tensor goes in field b
        srcs = [None, srcs[1]]
    elif bimm == 1:
        srcs = [srcs[0], None]
    nvs = np.broadcast_to(nv_chunks(n.shape, lanes, out.shape[-1]), out.shape).reshape(-1)
    vxm_rows(lw, n, op, out.reshape(-1), n.dtype, nvs, *(srcs + [None])[:2], imm=imm, bimm=bimm)
    for r in lw.pending_free:
        lw.free_temp(r)


def lower_causal(lw, n):
    out, src = lw.grid[n.id], lw.grid[n.inputs[0]]
    off = n.attrs.get("offset", 0)
    rows_axis = len(out.shape) - 2
    for idx in np.ndindex(out.shape):
        row = idx[rows_axis] if len(n.shape) >= 2 else 0
        nv = nv_of(n.shape, lw.lanes, idx[-1])
        cut = max(0, min(lw.lanes, row + off + 1 - idx[-1] * lw.lanes))
        vxm_chain(lw, n, O.MASK, int(out[idx]), n.dtype, nv, (int(src[idx]), lw.g.node(n.inputs[0]).dtype),
                  imm=NEG_INF_BITS, cut=cut)


def _store_bounds(lw, n):
    """(state node, bounds of the stored region per axis, its whole-chunk grid or None)."""
    state = lw.g.node(n.inputs[0])
    home = lw.grid[n.inputs[0]]
    idx = n.attrs["index"]
    shape = state.shape if state.shape else (1,)
    bounds = [(e, e + 1) if isinstance(e, int) else tuple(e) for e in idx] + [(0, d) for d in shape[len(idx):]]
    start, stop = bounds[-1]
    lead = tuple(slice(a, b) for a, b in bounds[:-1]) if len(shape) > 1 else (slice(None),)
    region = None
    if start % lw.lanes == 0 and (stop == shape[-1] or stop % lw.lanes == 0):   # whole chunks
        region = home[lead + (slice(start // lw.lanes, -(-stop // lw.lanes)),)]
    return state, bounds, region


def lower_store(lw, n):
    if n.id in lw.__dict__.get("_stored_by_move", ()):
        return                            # (the value was assembled in place: lower_move)
    state, bounds, region = _store_bounds(lw, n)
    val = lw.g.node(n.inputs[1])
    vgrid = lw.grid[n.inputs[1]]          # (the language stores tensors only, never a literal)
    if region is not None:
        if vgrid.ndim != region.ndim:
            vgrid = vgrid.reshape((1,) * (region.ndim - vgrid.ndim) + vgrid.shape)
        copy(lw, val, vgrid, region, state.dtype, n)
        return
    lead = tuple(slice(a, b) for a, b in bounds[:-1]) if len(state.shape) > 1 else (slice(None),)
    _store_lanes(lw, n, state, val, lw.grid[n.inputs[0]][lead], bounds, vgrid)


def _store_lanes(lw, n, state, val, rows_grid, bounds, vgrid):
    """A store into part of a chunk: rebuild the touched rows from their old contents (copied
    aside first) and the value (converted to the state's dtype), lane by lane."""
    row_shape = tuple(b - a for a, b in bounds[:-1]) + (state.shape[-1],)
    rshape = tuple(b - a for a, b in bounds)
    start, stop = bounds[-1]
    old, r1 = lw.temp(row_shape, state.dtype)
    copy(lw, state, rows_grid.reshape(old.shape), old, state.dtype, n)
    newv, r2 = lw.temp(rshape, state.dtype)
    vg = vgrid.reshape((1,) * (newv.ndim - vgrid.ndim) + vgrid.shape) if vgrid.ndim != newv.ndim else vgrid
    copy(lw, val, vg, newv, state.dtype, n)
    flat_old = np.arange(int(np.prod(row_shape)), dtype=np.int64).reshape(row_shape)
    col = np.arange(row_shape[-1])
    inside = (col >= start) & (col < stop)
    vidx = np.arange(int(np.prod(rshape)), dtype=np.int64).reshape(rshape)
    src_in = np.where(inside, 1, 0) * np.ones(row_shape, np.int64)
    src_flat = np.where(inside, np.take(vidx, np.clip(col - start, 0, stop - start - 1), axis=-1), flat_old)
    movement.assemble(lw, n, ([(old, row_shape, state.dtype), (newv, rshape, state.dtype)],
                     src_in.reshape(-1), src_flat.reshape(-1)), dst=rows_grid.reshape(old.shape),
             dtype=state.dtype, shape=row_shape)
    lw.free_temp(r1)
    lw.free_temp(r2)


# ---- where ---------------------------------------------------------------------------------
def lower_where(lw, n):
    """where(c, a, b) per output vector: KEEP(a, c) and DROP(b, c) side by side on two ALUs, their
    sum (one of them is the zero -0.0, or 0: exact) on a third, in one chain fed from SRAM. Where
    that chain cannot be placed (one ALU, too few streams for the three operands on one
    diagonal, or two operands on one bank) the three go through SRAM temporaries."""
    out = lw.grid[n.id]
    lw.pending_free = []
    cond, a, b = (_operand(lw, i, n.shape, out, n) for i in n.inputs)
    assert cond[0] == "grid", "a `where` condition is a tensor"
    cfloat = n.dtype in FLOATS
    cdt = "f32" if cfloat else "i32"
    temps = None
    done = _where_max_blocks(lw, n, out, cond, a, b, cfloat, cdt)
    for idx in np.ndindex(out.shape):
        if idx in done:
            continue
        nv = nv_of(n.shape, lw.lanes, idx[-1])
        c, x, y = ((int(o[1][idx]), o[2]) if o[0] == "grid" else ("imm", imm_bits(o[1], cfloat))
                   for o in (cond, a, b))
        if _where_chain(lw, n, int(out[idx]), n.dtype, cdt, nv, c, x, y) or \
                _where_staged(lw, n, int(out[idx]), n.dtype, cdt, nv, c, x, y):
            continue
        temps = temps or [lw.temp(n.shape, cdt) for _ in range(2)]
        t1, t2 = (int(t[0][idx]) for t in temps)
        for op, t, v in (("KEEP", t1, x), ("DROP", t2, y)):
            imm, bimm, v = (v[1], 2, None) if v[0] == "imm" else (0, 0, v)
            vxm_chain(lw, n, O.VXM_BINARY[op], t, cdt, lw.lanes, v, c, imm=imm, bimm=bimm)
        vxm_chain(lw, n, O.VXM_BINARY["ADD"], int(out[idx]), n.dtype, nv, (t1, cdt), (t2, cdt))
    for r in lw.pending_free + [t[1] for t in temps or ()]:
        lw.free_temp(r)


def _where_max_blocks(lw, n, out, cond, a, b, cfloat, cdt) -> set:
    """where rows whose max across vectors is a lone reduction (a packed softmax's masked scores):
    each aligned block of the reduction's first level (lower_reduce.first_blocks) in one chain
    that writes the block's rows and, from the same streams, their max tree's partial, which the
    reduction takes as its first level (max is exact in any order): the rows' trip to SRAM and
    back to the VXM is no longer ahead of the max. Returns the output indexes done."""
    spec = lower_reduce.first_blocks(lw, n, "max", 3)
    if spec is None:
        return set()
    red, leaves, slots = spec
    done, pre = set(), {}
    for (blk, col), slot in slots.items():
        idxs = [(r, col) for r in range(blk * leaves, (blk + 1) * leaves)]
        rows = []
        for idx in idxs:
            c, x, y = ((int(o[1][idx]), o[2]) if o[0] == "grid" else ("imm", imm_bits(o[1], cfloat))
                       for o in (cond, a, b))
            rows.append((int(out[idx]), nv_of(n.shape, lw.lanes, idx[-1]), c, x, y))
        if not _where_max_chain(lw, n, rows, slot, n.dtype, cdt):
            if lw.g.node(n.inputs[0]).op != "const":
                continue
            rows = _staged_conds(lw, n, rows)
            if rows is None or not _where_max_chain(lw, n, rows, slot, n.dtype, cdt):
                continue
        done.update(idxs)
        pre[blk, col] = (slot, "f32")
    lw.first_level[red]["pre"] = pre
    return done


def _staged_conds(lw, n, rows):
    """The rows with each constant condition copied ahead to slices no operand of the block
    uses (as _where_staged does for one row; the copies held to the where's end), or None."""
    nsl = lw.ctx.nslices
    bad = {(v[0] + i) % nsl for r in rows for v in r[2:] if v[0] != "imm" for i in range(dtype_width(v[1]))}
    grid, region = lw.temp((1, 12 * lw.lanes), rows[0][2][1])
    lw.pending_free.append(region)
    out = []
    for o, nv, c, x, y in rows:
        w = dtype_width(c[1])
        free = [int(b) for b in grid.reshape(-1) if not {(int(b) + i) % nsl for i in range(w)} & bad]
        if not free:
            return None
        bad |= {(free[0] + i) % nsl for i in range(w)}
        vxm_chain(lw, n, O.VXM_UNARY["CONV"], free[0], c[1], lw.lanes, c)
        out.append((o, nv, (free[0], c[1]), x, y))
    return out


def _add_if_streams_fit(lw, cb) -> bool:
    """Add chain cb unless it needs more streams on some (direction, offset) than a direction has."""
    need = {}
    for d, koff, w in cb.groups:
        need[(d, koff)] = need.get((d, koff), 0) + w
    if max(need.values()) > lw.ctx.m.streams_per_direction:
        return False
    lw.chains.append(cb.chain())
    return True


def _reader(cb, vpos):
    """read(v) for chain cb: v = (base, dtype) read at the VXM once per (base, width), as
    (group, dtype code); None for an immediate."""
    groups = {}

    def read(v):
        if v[0] == "imm":
            return None
        key = (v[0], dtype_width(v[1]))
        if key not in groups:
            groups[key] = cb.read(v[0], key[1], vpos, 0)
        return groups[key], DTYPE_CODE[v[1]]
    return read


def _where_max_chain(lw, node, rows, slot, out_dt, cdt) -> bool:
    """One chain: the where of each row ((out base, nv, c, x, y) each) and the pairwise MAX tree
    of the results, the root written to `slot` (f32); False (nothing added) when it cannot be placed."""
    ctx = lw.ctx
    cb = ChainBuilder(ctx, node.line, node.id)
    vpos = ctx.m.vxm_pos
    read = _reader(cb, vpos)

    def link(off, w):             # VXM to VXM, the directions alternating (half the planes each way)
        turn[0] ^= 1
        return cb.f.add_group(EAST, off - vpos, w) if turn[0] else cb.f.add_group(WEST, off + vpos, w)

    turn = [0]
    keep, drop, add, mx = (O.VXM_BINARY[k] for k in ("KEEP", "DROP", "ADD", "MAX"))
    lat = ctx.lat[keep]
    level = []
    for out_base, nv, c, x, y in rows:
        gc, gx, gy = read(c), read(x), read(y)
        links = [(link(lat, dtype_width(cdt)), DTYPE_CODE[cdt]) for _ in range(2)]
        for op, v, g, t in ((keep, x, gx, links[0]), (drop, y, gy, links[1])):
            imm, bimm = (v[1], 2) if v[0] == "imm" else (0, 0)
            cb.vxm(op, 0, g, gc, t, nv=ctx.lanes, imm=imm, bimm=bimm)
        go = (cb.write(out_base, dtype_width(out_dt), vpos, lat + ctx.lat[add]), DTYPE_CODE[out_dt])
        cb.vxm(add, lat, links[0], links[1], go, nv=nv)
        level.append(go)
    t = lat + ctx.lat[add]
    f32 = DTYPE_CODE["f32"]
    while len(level) > 1:         # pairwise, an odd last item carried up (semantics.pairwise)
        last = len(level) == 2
        nxt = []
        for i in range(0, len(level) - 1, 2):
            o = (cb.write(slot, 4, vpos, t + ctx.lat[mx]) if last else link(t + ctx.lat[mx], 4), f32)
            cb.vxm(mx, t, level[i], level[i + 1], o, nv=ctx.lanes)
            nxt.append(o)
        level = nxt + level[len(level) - len(level) % 2:]
        t += ctx.lat[mx]
    if cb.mem_conflict() or 4 * len(rows) - 1 > ctx.m.vxm_alus:
        return False
    return _add_if_streams_fit(lw, cb)


def _where_staged(lw, node, out_base, out_dt, cdt, nv, c, x, y) -> bool:
    """The one-chain form with a copy of a constant condition `c` that shares a bank with x (the
    causal mask and a score row): the copy depends on nothing and is made any time before,
    where the three chains through temporaries ran after x was made (attention_prefill's masked
    scores: stragglers up to 84 cycles behind, the softmax's max waiting on them). Measured:
    attention_prefill 1,146 -> 1,099, llama_block_prefill 6,163 -> 6,106, tiny 28,804 -> 28,684."""
    if lw.g.node(node.inputs[0]).op != "const" or x[0] == "imm":
        return False
    return _where_chain(lw, node, out_base, out_dt, cdt, nv, stage(lw, node, c, x), x, y)


def _where_chain(lw, node, out_base, out_dt, cdt, nv, c, x, y) -> bool:
    """The one-chain form of lower_where; False (and nothing added) when it cannot be placed."""
    ctx = lw.ctx
    if ctx.m.vxm_alus < 2:
        return False
    cb = ChainBuilder(ctx, node.line, node.id)
    vpos = ctx.m.vxm_pos
    read = _reader(cb, vpos)

    gc, gx, gy = read(c), read(x), read(y)
    if cb.mem_conflict():
        return False
    keep, drop, add = (O.VXM_BINARY[k] for k in ("KEEP", "DROP", "ADD"))
    lat = ctx.lat[keep]
    links = [(cb.link(vpos, vpos, lat, dtype_width(cdt)), DTYPE_CODE[cdt]) for _ in range(2)]
    for op, v, g, t in ((keep, x, gx, links[0]), (drop, y, gy, links[1])):
        imm, bimm = (v[1], 2) if v[0] == "imm" else (0, 0)
        cb.vxm(op, 0, g, gc, t, nv=ctx.lanes, imm=imm, bimm=bimm)
    go = (cb.write(out_base, dtype_width(out_dt), vpos, lat + ctx.lat[add]), DTYPE_CODE[out_dt])
    cb.vxm(add, lat, links[0], links[1], go, nv=nv)
    return _add_if_streams_fit(lw, cb)


# ---- data movement -------------------------------------------------------------------------
def lower_move(lw, n):
    """slice / concat / reshape that move data between lanes; one whose only user stores it in
    whole chunks of a state (decode's new cache row) is assembled there in place, the store's
    copy left out, where nothing lowered later reads the state's old version."""
    smap = movement.source_map(lw, n)
    st = _store_in_place(lw, n, smap[0])
    if st is None:
        movement.assemble(lw, n, smap)
        return
    store, region, dtype = st
    movement.assemble(lw, n, smap, dst=region.reshape(-1, region.shape[-1]), dtype=dtype, shape=n.shape)
    lw.__dict__.setdefault("_stored_by_move", set()).add(store)


VIEWS = ("view", "mxm_t", "mxm_cvt", "alias")


def lower_rope(lw, n):
    """rope (movement.rope), in place in a state like lower_move's moves."""
    st = _store_in_place(lw, n, n.inputs)
    if st is None:
        movement.rope(lw, n)
        return
    store, region, _ = st
    movement.rope(lw, n, out=region.reshape(lw.grid[n.id].shape))
    lw.__dict__.setdefault("_stored_by_move", set()).add(store)


def _store_in_place(lw, n, src_ids):
    """(store id, its region, dtype) where n (of sources src_ids) can be written in the state
    it is stored in, else None."""
    g, plan = lw.g, lw.plan
    if any(a <= n.id < b for trips in g.loops for a, b in trips):
        return None                       # (a loop trip's twins are replayed: stores too)
    v = n
    while True:                           # (through reshapes that are views)
        users = g.users(v.id)
        if len(users) != 1 or v.id in g.outputs.values():
            return None
        st = g.node(users[0])
        if st.op != "reshape" or plan.kind.get(st.id) != "view":
            break
        v = st
    if st.op != "store" or st.inputs[1] != v.id or plan.kind.get(st.id) != "alias":
        return None
    state, _, region = _store_bounds(lw, st)
    srcs = [g.node(i) for i in src_ids]
    if region is None or any(x.dtype != state.dtype for x in srcs) or n.dtype != state.dtype \
            or region.size != lw.grid[n.id].size:
        return None
    pos = lw.__dict__.setdefault("_plan_pos", {nid: i for i, nid in enumerate(plan.order)})
    todo, seen = [st.inputs[0]], set()
    while todo:                           # every reader of the old version: lowered already
        x = todo.pop()
        for u in g.users(x):
            if u == st.id or u in seen:
                continue
            seen.add(u)
            if plan.kind.get(u) in VIEWS:
                todo.append(u)
            elif pos.get(u, -1) >= pos[n.id]:
                return None
    return st.id, region, state.dtype


ROUTINES = {"elementwise": lower_elementwise, "where": lower_where, "causal": lower_causal,
            "reduce": lower_reduce.lower_reduce,
            "lanefold": lower_lanes.lower_lanefold, "matmul": lower_mxm.lower_matmul, "move": lower_move,
            "transpose": movement.transpose_any, "tfold": movement.tfold, "rope": lower_rope, "store": lower_store}
# op -> lowering routine, from the op table: an op with a VXM opcode is elementwise
LOWER = {d.name: ROUTINES["elementwise" if d.vxm else d.lower] for d in ops.OPS.values() if d.vxm or d.lower}
