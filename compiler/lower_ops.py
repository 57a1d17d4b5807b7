"""Lowering of each op family to chains (see chains.py for the building blocks).

  elementwise   READ operands -> VXM op -> WRITE, one chain per output vector; a scalar
                constant rides along as the instruction's immediate; an operand broadcast
                along the last axis is first spread over the lanes by the SXM (DISTRIBUTE)
  reductions    over the last axis: chunks combined on the VXM, then a lane tree
                (SXM SHIFT or ROTATE by 1, 2, 4, ... feeding VXM ADD or MAX); over other axes:
                VXM ops across vectors
  matmul        per output chunk and block of rows, on one MXM plane (i8) or plane pair (f16):
                for each K-tile, LW its rows, IW, then one ABC per row accumulating in place;
                ACC and WRITE each row at the end
  lane moves    slices, concats and reshapes that move data between lanes: per output vector,
                one SXM PERMUTE per source vector, summed on the VXM
  transpose     the SXM transpose buffers: TPIN rows, TPOUT columns
"""
from __future__ import annotations

import numpy as np

from lpu.compiler import lower_mxm
from lpu.compiler.chains import ChainBuilder
from lpu.compiler.schedule import Ins
from lpu.compiler.movement import assemble, source_map, transpose_any
from lpu.isa import opcodes as O
from lpu.isa.opcodes import DTYPE_CODE, dtype_width

NP_DTYPE = {"i8": np.int8, "i32": np.int32, "f16": np.float16, "f32": np.float32, "bf16": np.float32}
FLOATS = ("f16", "f32", "bf16")
UNARY = {"neg": "NEG", "abs": "ABS", "relu": "RELU", "exp": "EXP", "log": "LOG", "sqrt": "SQRT",
         "rsqrt": "RSQRT", "tanh": "TANH", "sigmoid": "SIGMOID", "silu": "SILU", "gelu": "GELU"}
BINARY = {"add": "ADD", "sub": "SUB", "mul": "MUL", "div": "DIV", "maximum": "MAX", "minimum": "MIN"}
NEG_INF_BITS = int(np.float32(-np.inf).view(np.int32))


def imm_bits(value, compute_float: bool) -> int:
    if compute_float:
        return int(np.float32(value).view(np.int32))
    return int(np.clip(int(value), -2**31, 2**31 - 1))


def nv_of(shape, lanes, chunk) -> int:
    c = shape[-1] if shape else 1
    return max(0, min(lanes, c - chunk * lanes))


def vxm_chain(lw, node, op, out_base, out_dt, nv, a=None, b=None, imm=0, bimm=0, cut=0):
    """One VXM instruction fed from SRAM and written back: a, b are (base slot, dtype) or None.
    Operands in one vector share one READ; operands on one bank at the same distance cannot
    be read in one cycle, so b is first copied elsewhere."""
    c = lw.ctx
    cb = ChainBuilder(c, node.line, node.id)
    vpos = c.m.vxm_pos
    ga = (cb.read(a[0], dtype_width(a[1]), vpos, 0), DTYPE_CODE[a[1]]) if a is not None else None
    if b is not None and a is not None and b[0] == a[0] and dtype_width(b[1]) == dtype_width(a[1]):
        gb = (ga[0], DTYPE_CODE[b[1]])
    else:
        gb = (cb.read(b[0], dtype_width(b[1]), vpos, 0), DTYPE_CODE[b[1]]) if b is not None else None
    if cb.mem_conflict():
        b = _stage(lw, node, b, a)
        return vxm_chain(lw, node, op, out_base, out_dt, nv, a, b, imm, bimm, cut)
    go = (cb.write(out_base, dtype_width(out_dt), vpos, c.lat[op]), DTYPE_CODE[out_dt])
    cb.vxm(op, 0, ga, gb, go, nv=nv, imm=imm, bimm=bimm, cut=cut)
    lw.chains.append(cb.chain())


def _stage(lw, node, v, avoid):
    """Copy vector v = (base, dtype) to a temporary in other slices than `avoid`'s planes."""
    w = dtype_width(v[1])
    nsl = lw.ctx.nslices
    bad = {(avoid[0] + i) % nsl for i in range(dtype_width(avoid[1]))}
    grid, region = lw.temp((1, 12 * lw.lanes), v[1])      # 12 vectors: some miss avoid's slices
    lw.free_temp(region)
    for base in grid.reshape(-1):
        if not ({(int(base) + i) % nsl for i in range(w)} & bad):
            vxm_chain(lw, node, O.VXM_UNARY["CONV"], int(base), v[1], lw.lanes, v)
            return int(base), v[1]
    raise AssertionError("no staging slot")


def sxm_chain(lw, node, op, src, dst, dtype, param, h=None):
    """READ -> one SXM op -> WRITE (lane moves that keep the dtype)."""
    c = lw.ctx
    h = c.sxm_near(src) if h is None else h
    spos = c.m.sxm_pos(h)
    w, dt = dtype_width(dtype), DTYPE_CODE[dtype]
    # consecutive lane moves through one SXM land in increasing cycles: search from the last
    # one's cycle, less the chip's width in slack (a hint for speed; any cycle found is valid)
    cb = ChainBuilder(c, node.line, node.id, hint=(("sxm", h), -c.m.n_positions))
    gi = cb.read(src, w, spos, 0)
    go = cb.write(dst, w, spos, c.lat[op])
    cb.sxm(op, h, 0, (gi, dt), (go, dt), param)
    lw.chains.append(cb.chain())


def sxm_vxm_chain(lw, node, sop, sparam, src, vop, other, dst, dtype, out_dt, nv):
    """READ src -> SXM sop -> VXM vop (with `other` read from SRAM) -> WRITE dst."""
    c = lw.ctx
    h = c.sxm_near(src)
    spos, vpos = c.m.sxm_pos(h), c.m.vxm_pos
    w, dt = dtype_width(dtype), DTYPE_CODE[dtype]
    cb = ChainBuilder(c, node.line, node.id)
    ts = -(c.lat[sop] + abs(vpos - spos))          # SXM issue offset; VXM at 0
    gi = cb.read(src, w, spos, ts)
    g_s = cb.link(spos, vpos, 0, w)
    cb.sxm(sop, h, ts, (gi, dt), (g_s, dt), sparam)
    g_o = cb.read(other[0], dtype_width(other[1]), vpos, 0)
    if cb.mem_conflict():
        other = _stage(lw, node, other, (src, dtype))
        return sxm_vxm_chain(lw, node, sop, sparam, src, vop, other, dst, dtype, out_dt, nv)
    go = cb.write(dst, dtype_width(out_dt), vpos, c.lat[vop])
    cb.vxm(vop, 0, (g_o, DTYPE_CODE[other[1]]), (g_s, dt), (go, DTYPE_CODE[out_dt]), nv=nv)
    lw.chains.append(cb.chain())


def lane_step_chain(lw, node, sop, shifts, src, vop, dst, cdt, out_dt, nv):
    """One step of a lane reduction, radix len(shifts)+1: the SXM makes the shifted copies of
    src in one cycle (one queue each), the VXM combines them with src in a small tree fed
    straight from the streams, and the result is written to dst."""
    c = lw.ctx
    h = c.sxm_near(src[0])
    spos, vpos = c.m.sxm_pos(h), c.m.vxm_pos
    w, dt = dtype_width(src[1]), DTYPE_CODE[src[1]]
    cb = ChainBuilder(c, node.line, node.id)
    ts = -(c.lat[sop] + abs(vpos - spos))          # SXM issue offset; VXM at 0
    gi = cb.read(src[0], w, spos, ts)
    terms = [(cb.read(src[0], w, vpos, 0), dt)]
    for i, k in enumerate(shifts):
        g = cb.link(spos, vpos, 0, w)
        cb.ins.append(Ins((c.sxm_q[h][i],), ts, sop, [0, 0, -k], ((0, gi, 0, dt), (1, g, 0, dt))))
        terms.append((g, dt))
    off, lat, wc = 0, c.lat[vop], dtype_width(cdt)
    while len(terms) > 1:
        nxt = []
        last = len(terms) <= 2
        for j in range(0, len(terms) - 1, 2):
            if last:
                go = (cb.write(dst, dtype_width(out_dt), vpos, off + lat), DTYPE_CODE[out_dt])
            else:
                go = (cb.link(vpos, vpos, off + lat, wc), DTYPE_CODE[cdt])
            cb.vxm(vop, off, terms[j], terms[j + 1], go, nv=nv if last else c.lanes)
            nxt.append(go)
        if len(terms) % 2:
            raise AssertionError("lane step radix must be a power of two")
        terms, off = nxt, off + lat
    lw.chains.append(cb.chain())


# ---- elementwise ---------------------------------------------------------------------------
def _operand(lw, nid, out_shape, out_grid, node):
    """(grid broadcast to the output grid, dtype) or ('imm', value) for a scalar constant."""
    n = lw.g.node(nid)
    if lw.plan.kind[nid] == "imm":
        return "imm", float(np.asarray(n.attrs["value"]).reshape(-1)[0]), n.dtype
    grid = lw.grid[nid]
    last = n.shape[-1] if n.shape else 1
    if last == 1 and (out_shape[-1] if out_shape else 1) > 1:
        tgrid, region = lw.temp(n.shape if n.shape else (1,), n.dtype)
        for idx in np.ndindex(grid.shape):
            sxm_chain(lw, node, O.DISTRIBUTE, int(grid[idx]), int(tgrid[idx]), n.dtype, 0)
        lw.pending_free.append(region)
        grid = tgrid
    return "grid", np.broadcast_to(grid, out_grid.shape), n.dtype


def lower_elementwise(lw, n):
    out = lw.grid[n.id]
    lw.pending_free = []
    ops = [_operand(lw, i, n.shape, out, n) for i in n.inputs]
    if n.op in BINARY:
        op = O.VXM_BINARY[BINARY[n.op]]
    elif n.op in UNARY:
        op = O.VXM_UNARY[UNARY[n.op]]
    elif n.op == "cast":
        op = O.VXM_UNARY["CONV"]
    else:
        raise AssertionError(n.op)
    cfloat = n.dtype in FLOATS or any(o[2] in FLOATS for o in ops)
    lanes = lw.lanes
    bimm, imm = 0, 0
    if len(ops) == 2 and ops[1][0] == "imm":
        bimm, imm = 1, imm_bits(ops[1][1], cfloat)
    elif len(ops) == 2 and ops[0][0] == "imm":
        bimm, imm = 2, imm_bits(ops[0][1], cfloat)
    for idx in np.ndindex(out.shape):
        nv = nv_of(n.shape, lanes, idx[-1])
        srcs = [(int(o[1][idx]), o[2]) if o[0] == "grid" else None for o in ops]
        if bimm == 2:          # imm op b: the tensor goes in field b
            srcs = [None, srcs[1]]
        elif bimm == 1:
            srcs = [srcs[0], None]
        vxm_chain(lw, n, op, int(out[idx]), n.dtype, nv, *(srcs + [None])[:2], imm=imm, bimm=bimm)
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


def copy(lw, srcn, src_grid, dst_grid, dtype, node):
    """Copy (converting to `dtype`) every vector of src_grid into dst_grid."""
    conv = O.VXM_UNARY["CONV"]
    src_grid = np.broadcast_to(src_grid, dst_grid.shape)
    shape = srcn.shape
    for idx in np.ndindex(dst_grid.shape):
        vxm_chain(lw, node, conv, int(dst_grid[idx]), dtype, nv_of(shape, lw.lanes, idx[-1]),
                  (int(src_grid[idx]), srcn.dtype))


def lower_store(lw, n):
    state = lw.g.node(n.inputs[0])
    val = lw.g.node(n.inputs[1])
    home = lw.grid[n.inputs[0]]
    idx = n.attrs["index"]
    shape = state.shape if state.shape else (1,)
    nd = len(shape)
    bounds = [(e, e + 1) if isinstance(e, int) else tuple(e) for e in idx] + [(0, d) for d in shape[len(idx):]]
    start, stop = bounds[-1]
    lead = tuple(slice(a, b) for a, b in bounds[:-1]) if nd > 1 else (slice(None),)
    vgrid = lw.grid[n.inputs[1]]          # (the language stores tensors only, never a literal)
    if start % lw.lanes == 0 and (stop == shape[-1] or stop % lw.lanes == 0):   # whole chunks
        region = home[lead + (slice(start // lw.lanes, -(-stop // lw.lanes)),)]
        if vgrid.ndim != region.ndim:
            vgrid = vgrid.reshape((1,) * (region.ndim - vgrid.ndim) + vgrid.shape)
        copy(lw, val, vgrid, region, state.dtype, n)
        return
    _store_lanes(lw, n, state, val, home[lead], bounds, vgrid)


def _store_lanes(lw, n, state, val, rows_grid, bounds, vgrid):
    """A store into part of a chunk: rebuild the touched rows from their old contents (copied
    aside first) and the value (converted to the state's dtype), lane by lane."""
    from lpu.compiler.movement import assemble
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
    assemble(lw, n, ([(old, row_shape, state.dtype), (newv, rshape, state.dtype)],
                     src_in.reshape(-1), src_flat.reshape(-1)), dst=rows_grid.reshape(old.shape),
             dtype=state.dtype, shape=row_shape)
    lw.free_temp(r1)
    lw.free_temp(r2)


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
    if n.op == "mean":
        mgrid, mregion = lw.temp(n.shape, cdt)
    else:
        mgrid, mregion = out, None
    if axis == len(src_n.shape) - 1 or not src_n.shape:
        _reduce_lanes(lw, n, src_n, src, mgrid, cdt, final_dt, vop)
    else:
        _reduce_vectors(lw, n, src_n, src, mgrid, axis, cdt, final_dt, vop)
    if n.op == "mean":
        div = O.VXM_BINARY["DIV"]
        for idx in np.ndindex(out.shape):
            vxm_chain(lw, n, div, int(out[idx]), n.dtype, nv_of(n.shape, lw.lanes, idx[-1]),
                      (int(mgrid[idx]), cdt), imm=imm_bits(count, cdt == "f32"), bimm=1)
        lw.free_temp(mregion)


def _reduce_vectors(lw, n, src_n, src, out, axis, cdt, final_dt, vop):
    cur = np.moveaxis(src, axis, 0)
    outv = np.moveaxis(out, axis, 0)[0]
    count = cur.shape[0]
    tmp, region = lw.temp(n.shape, cdt)
    tmpv = np.moveaxis(tmp, axis, 0)[0]
    conv = O.VXM_UNARY["CONV"]
    for idx in np.ndindex(outv.shape):
        nv = nv_of(n.shape, lw.lanes, idx[-1])
        if count == 1:
            vxm_chain(lw, n, conv, int(outv[idx]), final_dt, nv, (int(cur[(0,) + idx]), src_n.dtype))
            continue
        acc = (int(cur[(0,) + idx]), src_n.dtype)
        for i in range(1, count):
            last = i == count - 1
            dst, dt = (int(outv[idx]), final_dt) if last else (int(tmpv[idx]), cdt)
            vxm_chain(lw, n, vop, dst, dt, nv, acc, (int(cur[(i,) + idx]), src_n.dtype))
            acc = (dst, dt)
    lw.free_temp(region)


def _reduce_lanes(lw, n, src_n, src, out, cdt, final_dt, vop):
    """Per row: combine the chunks into one vector (in a temp), then a lane tree in place, radix
    4 where the SXM has the queues: t = t op SHIFT(t, -s) op SHIFT(t, -2s) op SHIFT(t, -3s),
    s = 1, 4, 16, ... (ROTATE for max, whose padding lanes are first set to -inf)."""
    lanes = lw.lanes
    c = src_n.shape[-1] if src_n.shape else 1
    is_max = n.op == "max"
    sop = O.ROTATE if is_max else O.SHIFT
    chunks = src.shape[-1]
    lead_shape = src.shape[:-1]
    nrows = int(np.prod(lead_shape, dtype=np.int64))
    t1, r1 = lw.temp((nrows, 2 * lanes), cdt)       # two scratch vectors per row: rows pipeline
    t1 = t1.reshape(lead_shape + (2,))
    width = min(c, lanes)
    # radix 4 needs three SXM queues and four f32 stream groups on one diagonal
    radix = 4 if lw.m.sxm_queues_per_hemisphere >= 3 and lw.m.streams_per_direction >= 16 else 2
    plan = []                         # the shifts of each step: radix-1 copies, 1, r, r^2, ...
    span = 1
    while span < width:
        plan.append([span * j for j in range(1, radix) if span * j < width])
        span *= radix
    steps = len(plan)
    for lead in np.ndindex(src.shape[:-1]):
        ta, tb = int(t1[lead + (0,)]), int(t1[lead + (1,)])
        dst = int(out[lead + (0,)])
        vecs = [(int(src[lead + (j,)]), src_n.dtype) for j in range(chunks)]
        if is_max and c % lanes:
            vxm_chain(lw, n, O.MASK, tb, cdt, lanes, vecs[-1], imm=NEG_INF_BITS, cut=c - (chunks - 1) * lanes)
            vecs[-1] = (tb, cdt)
        cur = vecs[0]
        for j in range(1, chunks):
            vxm_chain(lw, n, vop, ta, cdt, lanes, cur, vecs[j])
            cur = (ta, cdt)
        if steps == 0:
            vxm_chain(lw, n, O.VXM_UNARY["CONV"], dst, final_dt, 1, cur)
            continue
        for si, shifts in enumerate(plan):
            d, ddt, nv = (dst, final_dt, 1) if si == steps - 1 else (ta, cdt, lanes)
            if len(shifts) == 1:
                sxm_vxm_chain(lw, n, sop, -shifts[0], cur[0], vop, cur, d, cur[1], ddt, nv)
            else:
                if len(shifts) == 2:      # pad to a power of two with a shift that adds nothing
                    shifts = shifts + [lanes] if sop == O.SHIFT else shifts + [shifts[0]]
                lane_step_chain(lw, n, sop, shifts, cur, vop, d, cdt, ddt, nv)
            cur = (d, ddt)
    lw.free_temp(r1)


# ---- data movement -------------------------------------------------------------------------
def lower_move(lw, n):
    """slice / concat / reshape that move data between lanes."""
    assemble(lw, n, source_map(lw, n))


def lower_transpose(lw, n):
    transpose_any(lw, n)


def lower_rope(lw, n):
    from lpu.compiler.movement import rope
    rope(lw, n)


LOWER = {op: lower_elementwise for op in list(UNARY) + list(BINARY) + ["cast"]}
LOWER.update({"causal": lower_causal, "sum": lower_reduce, "max": lower_reduce, "mean": lower_reduce,
              "matmul": lower_mxm.lower_matmul, "slice": lower_move, "concat": lower_move,
              "reshape": lower_move, "transpose": lower_transpose, "rope": lower_rope})
