"""Chain builders shared by the lowering routines (lower_ops, lower_reduce, lower_mxm,
movement): one VXM instruction between SRAM reads and a write, one SXM lane move, an SXM move
feeding the VXM, SXM moves gathered by a VXM tree (lane-reduction steps, lane assembly), and a
converting copy. See chains.py for the building blocks."""
from __future__ import annotations

import numpy as np

from lpu.compiler.chains import ChainBuilder
from lpu.compiler.chainspec import INS_COLS, Rows
from lpu.compiler.schedule import Ins
from lpu.isa import opcodes as O
from lpu.isa.dtypes import DTYPE_CODE, dtype_width
from lpu.isa.machine import EAST, WEST
from lpu.isa.opcodes import NARGS

NEG_INF_BITS = int(np.float32(-np.inf).view(np.int32))   # MASK's fill for max


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


def copy_outside(lw, node, v, bad):
    """Copy vector v = (base, dtype) to a temporary whose slices are not in `bad` (slice numbers):
    (its base, the temporary's region, still held), or None (nothing added or held) where none
    of 12 temporary vectors lies outside."""
    nsl = lw.ctx.nslices
    grid, region = lw.temp((1, 12 * lw.lanes), v[1])      # 12 vectors: some miss bad's slices
    free = [int(b) for b in grid.reshape(-1) if not {(int(b) + i) % nsl for i in range(dtype_width(v[1]))} & bad]
    if not free:
        lw.free_temp(region)
        return None
    vxm_chain(lw, node, O.VXM_UNARY["CONV"], free[0], v[1], lw.lanes, v)
    return free[0], region


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
    if post[0] == "fold":
        return _fold_write(cb, c, dst, out_dt, off, post)
    g = (cb.link(vpos, vpos, off, dtype_width(out_dt)), DTYPE_CODE[out_dt])
    go = (cb.write(dst, dtype_width(post[2]), vpos, off + c.lat[post[0]]), DTYPE_CODE[post[2]])
    return g, lambda: cb.vxm(post[0], off, g, None, go, nv=nv, imm=post[1], bimm=1)


def _fold_write(cb, c, dst, out_dt, off, post):
    """_post_write for post = ("fold", scale bits, cut) (op `lanefold`, lower_reduce): z = root *
    scale, hi = f16(z clamped to f16's range), f16(z - MASK(hi, cut)) written: z - hi = lo below
    lane `cut` (an infinite z stays infinite, not inf - inf), f16(z) from it on. z meets the
    MASK's result through CONVs (delays) of the same latency as the clamps, CONV and MASK."""
    vpos, f32, f16 = c.m.vxm_pos, DTYPE_CODE["f32"], DTYPE_CODE["f16"]
    conv, lat = O.VXM_UNARY["CONV"], c.lat
    steps = ((O.VXM_BINARY["MIN"], imm_bits(65504.0, True), f32), (O.VXM_BINARY["MAX"], imm_bits(-65504.0, True), f32),
             (conv, 0, f16), (O.MASK, 0, f16))
    assert all(lat[op] == lat[conv] for op, _, _ in steps)
    g = (cb.link(vpos, vpos, off, 4), f32)
    t = off + lat[O.VXM_BINARY["MUL"]]
    z = (cb.link(vpos, vpos, t, 4), f32)
    ins = [(O.VXM_BINARY["MUL"], off, g, z, post[1], 1)]
    a, b = z, z
    for op, imm, dt in steps:
        t2 = t + lat[op]
        a2, b2 = (cb.link(vpos, vpos, t2, dtype_width("f16" if dt == f16 else "f32")), dt), (cb.link(vpos, vpos, t2, 4), f32)
        ins += [(op, t, a, a2, imm, 1 if op != O.MASK else 0), (conv, t, b, b2, 0, 0)]
        a, b, t = a2, b2, t2
    sub = O.VXM_BINARY["SUB"]
    go = (cb.write(dst, dtype_width(out_dt), vpos, t + lat[sub]), DTYPE_CODE[out_dt])

    def tail():
        for op, at, x, y, imm, bimm in ins:
            if op == O.MASK:
                cb.vxm(op, at, x, None, y, cut=post[2], imm=0)
            else:
                cb.vxm(op, at, x, None, y, imm=imm, bimm=bimm)
        cb.vxm(sub, t, b, a, go)
    return g, tail


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


def copy(lw, srcn, src_grid, dst_grid, dtype, node):
    """Copy (converting to `dtype`) every vector of src_grid into dst_grid. A few vectors of
    the same dtype go from slice to slice on a stream (no unit between: the hops between the
    slices only), the others through the VXM (CONV)."""
    src_grid = np.broadcast_to(src_grid, dst_grid.shape).reshape(-1)
    dst = dst_grid.reshape(-1)
    nvs = np.broadcast_to(nv_chunks(srcn.shape, lw.lanes, dst_grid.shape[-1]), dst_grid.shape).reshape(-1)
    if dtype == srcn.dtype and len(dst) <= DIRECT_MAX:
        todo = [i for i in range(len(dst)) if not stream_copy(lw, node, int(src_grid[i]), int(dst[i]), dtype)]
        if not todo:
            return
        src_grid, dst, nvs = src_grid[todo], dst[todo], nvs[todo]
    vxm_rows(lw, node, O.VXM_UNARY["CONV"], dst, dtype, nvs, (src_grid, srcn.dtype))


DIRECT_MAX = 16      # vectors: larger copies (prefill) are batched through the VXM


def stream_copy(lw, node, src, dst, dtype) -> bool:
    """One vector READ onto a stream and WRITTEN where it passes, every plane flowing the same
    way; False (nothing added) where the planes would flow both ways, or meet a bank twice."""
    c = lw.ctx
    w = dtype_width(dtype)
    ns, nb, spos = c.nslices, c.banks, c.slice_pos
    ps = [spos[(src + b) % ns] for b in range(w)]
    qs = [spos[(dst + b) % ns] for b in range(w)]
    if all(q > p for p, q in zip(ps, qs)):
        d = EAST
    elif all(q < p for p, q in zip(ps, qs)):
        d = WEST
    else:
        return False
    cb = ChainBuilder(c, node.line, node.id)
    f = cb.f
    koff = -qs[0] if d == EAST else qs[0]           # plane 0 written at offset 0
    g = f.add_group(d, koff, w)
    for slot, pos, op, tail, lat in ((src, ps, O.READ, c.read_tail, c.lat_read), (dst, qs, O.WRITE, c.write_tail, 0)):
        for b in range(w):
            at = koff + pos[b] if d == EAST else koff - pos[b]
            s, row = (slot + b) % ns, (slot + b) // ns
            f.ins.extend((c.mem_qg[s], at - lat, op, s * nb + row % nb, row % nb, row // nb) + tail)
            f.p_data.extend((2, g, b, 0))
        (f.r_data if op == O.READ else f.w_data).extend(range(slot, slot + w))
    if cb.mem_conflict():
        return False
    lw.chains.append(cb.chain())
    return True


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


def gather_chain(lw, node, direct, moved, vop, dst, cdt, out_dt, nv, post=None) -> bool:
    """One chain: the vectors `direct` ((slot, dtype) each, read straight to the VXM when the
    tree needs them) and the SXM moves `moved` ((slot, dtype, sop, param) each, on the SXM
    nearest the slot, as many a cycle as it has queues and the streams take) combined by a
    tree of VXM `vop` (in cdt), the root (or `post`, see _post_write) written to dst in
    out_dt. A stream value is read in the cycle it arrives, so the tree is built cycle by
    cycle: the values arriving in a cycle are paired, the moves fed in every `lat` cycles (the
    VXM op's latency: values that arrive in other cycles would never meet) as many as the
    queues take, a direct read or else a CONV (a delay) taking an odd one. False, with nothing
    added, where it cannot be placed (two accesses on one bank in one cycle, or more streams
    on a diagonal than the machine has)."""
    c = lw.ctx
    m = c.m
    vpos, lat, wc = m.vxm_pos, c.lat[vop], dtype_width(cdt)
    conv = O.VXM_UNARY["CONV"]
    nstreams = m.streams_per_direction
    cb = ChainBuilder(c, node.line, node.id)
    use: dict = {}

    def count(d, koff, w):
        use[d, koff] = use.get((d, koff), 0) + w

    def room(d, koff, w):
        return use.get((d, koff), 0) + w <= nstreams

    def read(slot, w, pos, at):
        g = cb.read(slot, w, pos, at)
        count(*cb.groups[g])
        return g

    nq = m.sxm_queues_per_hemisphere
    todo, direct = list(moved), list(direct)
    reads = {}                                    # (slot, hemisphere, cycle) -> READ group
    arrive: dict = {}                             # cycle -> values: ("g", group, dt) or ("op", i)
    ops = []                                      # (op, cycle, a, b)
    t, budget = 0, 8 * (len(moved) + len(direct)) + 64
    while True:
        vals = arrive.pop(t, [])
        used = {}
        for item in list(todo) if t % lat == 0 else ():   # SXM moves, queues permitting
            slot, dt, sop, param = item
            h = c.sxm_near(slot)
            spos, w = m.sxm_pos(h), dtype_width(dt)
            d = EAST if vpos > spos else WEST
            if used.get(h, 0) >= nq or not room(d, _koff_at(d, t, vpos), w):
                continue
            ts = t - (c.lat[sop] + abs(vpos - spos))
            if (slot, h, ts) not in reads:
                reads[slot, h, ts] = read(slot, w, spos, ts)
            count(d, _koff_at(d, t, vpos), w)
            g = cb.f.add_group(d, _koff_at(d, t, vpos), w)
            cb.ins.append(Ins((c.sxm_q[h][used.get(h, 0)],), ts, sop, [0, 0, param],
                              ((0, reads[slot, h, ts], 0, DTYPE_CODE[dt]), (1, g, 0, DTYPE_CODE[dt]))))
            used[h] = used.get(h, 0) + 1
            vals.append(("g", g, DTYPE_CODE[dt]))
            todo.remove(item)
        if len(vals) % 2 and direct:              # an odd count: a direct read evens it
            slot, dt = direct.pop()
            vals.append(("g", read(slot, dtype_width(dt), vpos, t), DTYPE_CODE[dt]))
        if len(vals) == 1 and not todo and not direct and not arrive:
            break
        if len(vals) % 2:                         # the odd one waits a CONV for the others
            ops.append((conv, t, vals.pop(), None))
            arrive.setdefault(t + c.lat[conv], []).append(("op", len(ops) - 1))
        if len(vals) // 2 + (len(vals) % 2) > m.vxm_alus:
            return False
        for i in range(0, len(vals), 2):
            ops.append((vop, t, vals[i], vals[i + 1]))
            arrive.setdefault(t + lat, []).append(("op", len(ops) - 1))
        t += 1
        budget -= 1
        if budget < 0:
            return False
    if cb.mem_conflict():
        return False
    out = [None] * len(ops)                       # each op's output: (group, dtype code)
    tail = None
    cdc = DTYPE_CODE[cdt]
    for i, (op, at, x, y) in enumerate(ops):
        ready = at + c.lat[op]
        if i == len(ops) - 1:
            go, tail = _post_write(cb, c, dst, out_dt, ready, nv, post)
        else:
            d = next((d for d in (WEST, EAST) if room(d, _koff_at(d, ready, vpos), wc)), None)
            if d is None:
                return False
            count(d, _koff_at(d, ready, vpos), wc)
            go = (cb.f.add_group(d, _koff_at(d, ready, vpos), wc), cdc)
        out[i] = go
        ga, gb = ((v[1], v[2]) if v[0] == "g" else out[v[1]] for v in (x, y or x))
        last = i == len(ops) - 1 and post is None
        cb.vxm(op, at, ga, gb if y is not None else None, go, nv=nv if last else c.lanes)
    if tail:
        tail()
    need = {}
    for d, koff, w in cb.groups:
        need[d, koff] = need.get((d, koff), 0) + w
    if max(need.values()) > nstreams or cb.mem_conflict():
        return False
    lw.chains.append(cb.chain())
    return True


def _koff_at(d, arrive, pos):
    """The diagonal offset of a group arriving at position `pos` at offset `arrive`."""
    return arrive - pos if d == EAST else arrive + pos
