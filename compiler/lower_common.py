"""Chain builders shared by the lowering routines (lower_ops, lower_mxm, movement): one VXM
instruction between SRAM reads and a write, one SXM lane move, an SXM move feeding the VXM, a
step of a lane-reduction tree, and a converting copy. See chains.py for the building blocks."""
from __future__ import annotations

import numpy as np

from lpu.compiler.chains import ChainBuilder
from lpu.compiler.chainspec import INS_COLS, Rows
from lpu.compiler.schedule import Ins
from lpu.isa import opcodes as O
from lpu.isa.dtypes import DTYPE_CODE, dtype_width
from lpu.isa.machine import EAST, WEST
from lpu.isa.opcodes import NARGS


def imm_bits(value, compute_float: bool) -> int:
    if compute_float:
        return int(np.float32(value).view(np.int32))
    return int(np.clip(int(value), -2**31, 2**31 - 1))


def nv_of(shape, lanes, chunk) -> int:
    c = shape[-1] if shape else 1
    return max(0, min(lanes, c - chunk * lanes))


def nv_chunks(shape, lanes, chunks) -> np.ndarray:
    """nv_of for chunks 0 .. chunks-1."""
    c = shape[-1] if shape else 1
    return np.minimum(np.maximum(c - np.arange(chunks) * lanes, 0), lanes)


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
        b = stage(lw, node, b, a)
        return vxm_chain(lw, node, op, out_base, out_dt, nv, a, b, imm, bimm, cut)
    go = (cb.write(out_base, dtype_width(out_dt), vpos, c.lat[op]), DTYPE_CODE[out_dt])
    cb.vxm(op, 0, ga, gb, go, nv=nv, imm=imm, bimm=bimm, cut=cut)
    lw.chains.append(cb.chain())


def stage(lw, node, v, avoid):
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


def _post_write(cb, c, dst, out_dt, off, nv, post):
    """The output (dtype out_dt) of a chain's last VXM op issued at `off`: WRITE dst, or with
    post = (op, imm, dtype) a link to one more VXM op with that immediate (mean's division)
    whose result, in that dtype, is written instead."""
    vpos = c.m.vxm_pos
    if post is None:
        return (cb.write(dst, dtype_width(out_dt), vpos, off), DTYPE_CODE[out_dt]), None
    g = (cb.link(vpos, vpos, off, dtype_width(out_dt)), DTYPE_CODE[out_dt])
    go = (cb.write(dst, dtype_width(post[2]), vpos, off + c.lat[post[0]]), DTYPE_CODE[post[2]])
    return g, lambda: cb.vxm(post[0], off, g, None, go, nv=nv, imm=post[1], bimm=1)


def sxm_vxm_chain(lw, node, sop, sparam, src, vop, other, dst, dtype, out_dt, nv, post=None):
    """READ src -> SXM sop -> VXM vop (with `other` read from SRAM) -> WRITE dst (post: one
    more VXM op with an immediate on the way, see _post_write)."""
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
        other = stage(lw, node, other, (src, dtype))
        return sxm_vxm_chain(lw, node, sop, sparam, src, vop, other, dst, dtype, out_dt, nv, post)
    go, tail = _post_write(cb, c, dst, out_dt, c.lat[vop], nv, post)
    cb.vxm(vop, 0, (g_o, DTYPE_CODE[other[1]]), (g_s, dt), go, nv=nv if post is None else c.lanes)
    if tail:
        tail()
    lw.chains.append(cb.chain())


def lane_step_chain(lw, node, sop, shifts, src, vop, dst, cdt, out_dt, nv, post=None):
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
    tail = None
    while len(terms) > 1:
        nxt = []
        last = len(terms) <= 2
        for j in range(0, len(terms) - 1, 2):
            if last:
                go, tail = _post_write(cb, c, dst, out_dt, off + lat, nv, post)
            else:
                go = (cb.link(vpos, vpos, off + lat, wc), DTYPE_CODE[cdt])
            cb.vxm(vop, off, terms[j], terms[j + 1], go, nv=nv if last and post is None else c.lanes)
            nxt.append(go)
        if len(terms) % 2:
            raise AssertionError("lane step radix must be a power of two")
        terms, off = nxt, off + lat
    if tail:
        tail()
    lw.chains.append(cb.chain())


def copy(lw, srcn, src_grid, dst_grid, dtype, node):
    """Copy (converting to `dtype`) every vector of src_grid into dst_grid."""
    src_grid = np.broadcast_to(src_grid, dst_grid.shape).reshape(-1)
    nvs = np.broadcast_to(nv_chunks(srcn.shape, lw.lanes, dst_grid.shape[-1]), dst_grid.shape).reshape(-1)
    vxm_rows(lw, node, O.VXM_UNARY["CONV"], dst_grid.reshape(-1), dtype, nvs, (src_grid, srcn.dtype))


FEW = 24       # below this many vectors, vxm_rows builds them one by one


def vxm_rows(lw, node, op, outs, out_dt, nvs, a=None, b=None, imm=0, bimm=0, cut=0):
    """vxm_chain for many vectors at once, built with numpy: outs and nvs per vector, a and
    b (slots per vector, dtype) or None. Vectors whose operands share one READ or meet on a
    bank in the same cycle take vxm_chain one by one, in their place in the order."""
    c = lw.ctx
    outs = np.asarray(outs, np.int64)
    n = len(outs)
    nvs = np.asarray(nvs, np.int64)
    if n < FEW:                  # numpy's fixed costs would outweigh the work: one by one
        for i in range(n):
            vxm_chain(lw, node, op, int(outs[i]), out_dt, int(nvs[i]),
                      None if a is None else (int(a[0][i]), a[1]), None if b is None else (int(b[0][i]), b[1]),
                      imm, bimm, cut)
        return
    opnds = [(np.asarray(x[0], np.int64), x[1]) for x in (a, b) if x is not None]
    special = np.zeros(n, bool)
    if a is not None and b is not None and dtype_width(a[1]) == dtype_width(b[1]):
        special |= opnds[0][0] == opnds[1][0]
    vpos, ns, nb = c.m.vxm_pos, c.nslices, c.banks
    spos, mem_qg = c.slice_pos_a, c.mem_qg_a
    lat = c.lat[op]
    wo, dto = dtype_width(out_dt), DTYPE_CODE[out_dt]
    ins, grp, pat, rd = [], [], [], []
    for gi, (slots, dt) in enumerate(opnds):            # READ every operand, arriving at offset 0
        w = dtype_width(dt)
        g = slots[:, None] + np.arange(w)[None, :]
        s, row = g % ns, g // ns
        x = np.zeros((n, w, INS_COLS), np.int64)
        x[:, :, 0], x[:, :, 1], x[:, :, 2] = mem_qg[s], -np.abs(vpos - spos[s]) - c.lat_read, O.READ
        x[:, :, 3], x[:, :, 4], x[:, :, 5] = s * nb + row % nb, row % nb, row // nb
        x[:, :, 4 + NARGS], x[:, :, 5 + NARGS] = 1, 1
        ins.append(x)
        east = vpos > spos[slots % ns]
        grp.append(np.stack([np.where(east, EAST, WEST), np.where(east, -vpos, vpos), np.full(n, w)], 1)[:, None])
        p = np.zeros((n, w, 4), np.int64)
        p[:, :, 0], p[:, :, 1], p[:, :, 2] = 2, gi, np.arange(w)[None, :]
        pat.append(p)
        rd.append(g)
    go = len(opnds)
    g = outs[:, None] + np.arange(wo)[None, :]          # WRITE the result
    s, row = g % ns, g // ns
    x = np.zeros((n, wo, INS_COLS), np.int64)
    x[:, :, 0], x[:, :, 1], x[:, :, 2] = mem_qg[s], lat + np.abs(spos[s] - vpos), O.WRITE
    x[:, :, 3], x[:, :, 4], x[:, :, 5] = s * nb + row % nb, row % nb, row // nb
    x[:, :, 4 + NARGS], x[:, :, 6 + NARGS] = 1, 1
    ins.append(x)
    east = spos[outs % ns] > vpos
    grp.append(np.stack([np.where(east, EAST, WEST), np.where(east, lat - vpos, lat + vpos),
                         np.full(n, wo)], 1)[:, None])
    p = np.zeros((n, wo, 4), np.int64)
    p[:, :, 0], p[:, :, 1], p[:, :, 2] = 2, go, np.arange(wo)[None, :]
    pat.append(p)
    ia, ib, io, inv, iimm, ibimm, icut = c.vxm_fields[op]   # the VXM instruction
    x = np.zeros((n, 1, INS_COLS), np.int64)
    x[:, 0, 0], x[:, 0, 2], x[:, 0, 3] = c.vxm_qg, op, -1
    for i, val in ((inv, nvs), (iimm, imm), (ibimm, bimm), (icut, cut)):
        if i >= 0:
            x[:, 0, 4 + i] = val
    present = [(i, DTYPE_CODE[v[1]]) for i, v in ((ia, a), (ib, b)) if v is not None]   # group = position
    vp = [(i, gi, dt) for gi, (i, dt) in enumerate(present) if i >= 0] + ([(io, go, dto)] if io >= 0 else [])
    x[:, 0, 4 + NARGS] = len(vp)
    ins.append(x)
    if vp:
        pat.append(np.broadcast_to(np.asarray([(i, gi, 0, dt) for i, gi, dt in vp], np.int64), (n, len(vp), 4)))
    ins = np.concatenate(ins, 1)
    key = np.where(ins[:, :, 3] >= 0, ins[:, :, 3] * (1 << 32) + ins[:, :, 1] + (1 << 31), -1 - np.arange(ins.shape[1]))
    key.sort(axis=1)
    special |= (np.diff(key, axis=1) == 0).any(axis=1)    # two accesses to one bank in one cycle
    k = ins.shape[1]
    chains = np.tile(np.array([k, go + 1, -1, 0, node.line, node.id], np.int64), (n, 1))
    grp, pat = np.concatenate(grp, 1), np.concatenate(pat, 1)
    rd = np.concatenate(rd, 1) if rd else np.zeros((n, 0), np.int64)
    i = 0
    sp = special.tolist()
    while i < n:
        if sp[i]:
            ops = [None, None]
            if a is not None:
                ops[0] = (int(a[0][i]), a[1])
            if b is not None:
                ops[1] = (int(b[0][i]), b[1])
            vxm_chain(lw, node, op, int(outs[i]), out_dt, int(nvs[i]), ops[0], ops[1], imm, bimm, cut)
            i += 1
            continue
        j = i
        while j < n and not sp[j]:
            j += 1
        lw.chains.append(Rows(chains=chains[i:j], groups=grp[i:j], ins=ins[i:j], p_data=pat[i:j],
                              r_data=rd[i:j], w_data=g[i:j]))
        i = j
