"""Unit-state order checks of the schedule checker (compiler/verify.py): the MXM (weight
buffer, installed weights, plane occupancy, accumulator rows) and the SXM transpose buffers.

The rules, re-derived from isa/opcodes.py: LW loads a row of a plane's weight buffer, IW (phase
0, so it sees the LWs of earlier cycles only) installs the buffer; an ABC multiplies by the
installed weights (i8 on any plane, f16 on the even plane of a pair, holding both planes
`f16_pair_cycles` cycles) into an accumulator row, ready `mxm_abc` cycles later; ACC (phase 0)
puts a ready row on a stream. TPIN (phase 1) fills a transpose buffer row, TPOUT (phase 0) reads
a column of all rows.
"""
from __future__ import annotations

import numpy as np

from lpu.isa import opcodes as O

BIG = 1 << 40
WIDTH = np.array(O.DTYPE_WIDTH, np.int64)


def _dups(key, ev):
    """Pairs (earlier, later) of events with equal keys, the later in execution order."""
    order = np.lexsort((ev, key))
    k, v = key[order], ev[order]
    d = np.flatnonzero(k[1:] == k[:-1])
    return zip(v[d], v[d + 1])


def _mxm_dtype_ok(dt, plane):
    return (dt == O.DT_I8) | ((dt == O.DT_F16) & (plane % 2 == 0))


def check_mxm(c, e):
    m = c.m
    lw = np.flatnonzero(e.op == O.LW)
    iw = np.flatnonzero(e.op == O.IW)
    abc = np.flatnonzero(e.op == O.ABC)
    lw_dt, iw_dt, abc_dt = e.args[lw, 1] >> 8, e.args[iw, 0], e.args[abc, 0] >> 8
    cvt = e.args[lw, O.BY_NAME["LW"].field_index("cvt")] != 0
    bad_cvt = cvt & (lw_dt != O.DT_I8)
    for i in c.few(np.flatnonzero(bad_cvt)):
        c.add("operand", int(lw[i]), "LW cvt=1 widens an i8 row: its operand must be i8", e)
    lw_dt = np.where(cvt, O.DT_F16, lw_dt)    # the row lands in the f16 buffer
    for sel, dt, what in ((lw, lw_dt, "LW"), (iw, iw_dt, "IW"), (abc, abc_dt, "ABC")):
        for i in c.few(np.flatnonzero(~_mxm_dtype_ok(dt, e.unit[sel]))):
            c.add("operand", int(sel[i]), f"{what} dtype {int(dt[i])}: i8, or f16 on an even plane", e)
    for sel, f, hi, what in ((lw, 0, m.lanes, "weight row"), (abc, 1, m.acc_rows, "accumulator row")):
        for i in c.few(np.flatnonzero((e.args[sel, f] < 0) | (e.args[sel, f] >= hi))):
            c.add("operand", int(sel[i]), f"{what} {int(e.args[sel[i], f])} out of range 0..{hi - 1}", e)
    for i in c.few(np.flatnonzero((e.args[abc, 3] != 0) & (e.args[abc, 3] != 1))):
        c.add("operand", int(abc[i]), f"ABC half={int(e.args[abc[i], 3])}: 0 or 1", e)
    _busy(c, e, iw, abc, abc_dt)
    ok = (e.args[lw, 0] >= 0) & (e.args[lw, 0] < m.lanes)   # rows out of range: reported above
    lw, lw_dt = lw[ok], lw_dt[ok]
    # LW -> IW: each LW is installed by the first IW of its plane in its cycle or later
    iwkey = e.unit[iw] * BIG + e.cycle[iw]
    o = np.argsort(iwkey, kind="stable")
    iw, iwkey, iw_dt = iw[o], iwkey[o], iw_dt[o]
    gi = np.searchsorted(iwkey, e.unit[lw] * BIG + e.cycle[lw], "right")
    gic = np.minimum(gi, max(len(iw) - 1, 0))
    installed = (gi < len(iw)) & (e.unit[iw[gic]] == e.unit[lw]) if len(iw) else np.zeros(len(lw), bool)
    for i in c.few(np.flatnonzero(~installed)):
        c.add("mxm-order", int(lw[i]), f"weight row {int(e.args[lw[i], 0])} is loaded but no later IW on "
              f"plane {int(e.unit[lw[i]])} installs it", e)
    for i in c.few(np.flatnonzero(installed & (lw_dt != iw_dt[gic]))):
        c.add("mxm-order", int(lw[i]), f"LW of dtype {O.DTYPES[int(lw_dt[i])]} is installed by "
              f"{c.describe(e, iw[gic[i]])} as {O.DTYPES[int(iw_dt[gic[i]])]}", e)
    for a, b in c.few(_dups((gi * (1 << 20) + e.unit[lw]) * m.lanes * 2 + e.args[lw, 0], lw)):
        c.add("mxm-order", int(b), f"weight row {int(e.args[b, 0])} of plane {int(e.unit[b])} is loaded again "
              f"before {c.describe(e, a)} was installed", e)
    # the rows an install loads are 0..n-1: a row skipped below the last one loaded would keep
    # the previous install's weights (rows past n only meet lanes that the operand leaves 0)
    ins = gi[installed]
    cnt = np.bincount(ins, minlength=len(iw))
    top = np.full(len(iw), -1, np.int64)
    np.maximum.at(top, ins, e.args[lw[installed], 0])
    for j in c.few(np.flatnonzero((cnt > 0) & (cnt != top + 1))):
        rows = set(e.args[lw[installed][ins == j], 0].tolist())
        gaps = [r for r in range(int(top[j]) + 1) if r not in rows][:8]
        c.add("mxm-order", int(iw[j]), f"installs rows 0..{int(top[j])} of plane {int(e.unit[iw[j]])}, but rows "
              f"{gaps[:8]} were not loaded since the previous IW (they hold stale weights)", e)
    # ABC: the weights installed on its plane by the last IW before it
    wi = np.searchsorted(iwkey, e.unit[abc] * BIG + e.cycle[abc], "right") - 1
    wic = np.maximum(wi, 0)
    has = (wi >= 0) & (e.unit[iw[wic]] == e.unit[abc]) if len(iw) else np.zeros(len(abc), bool)
    for i in c.few(np.flatnonzero(~has)):
        c.add("mxm-order", int(abc[i]), f"no weights are installed on plane {int(e.unit[abc[i]])} yet", e)
    for i in c.few(np.flatnonzero(has & (iw_dt[wic] != abc_dt))):
        c.add("mxm-order", int(abc[i]), f"{O.DTYPES[int(abc_dt[i])]} operand, but {c.describe(e, iw[wic[i]])} "
              f"installed {O.DTYPES[int(iw_dt[wic[i]])]} weights", e)
    _accumulators(c, e)


def _busy(c, e, iw, abc, abc_dt):
    """No plane takes an IW or ABC while an ABC still holds it."""
    f16 = abc_dt == O.DT_F16
    hold = np.where(f16, c.m.f16_pair_cycles, 1)
    hold = np.where(e.args[abc, 3] != 0, (hold + 1) // 2, hold)
    ev = np.concatenate([iw, abc, abc[f16]])
    plane = np.concatenate([e.unit[iw], e.unit[abc], e.unit[abc[f16]] + 1])
    start = e.cycle[ev]
    end = start + np.concatenate([np.ones(len(iw), np.int64), hold, hold[f16]])
    order = np.lexsort((ev, plane * BIG + start))
    ev, plane, start, end = ev[order], plane[order], start[order], end[order]
    held = np.maximum.accumulate(plane * BIG + end)
    prev = np.concatenate([[-1], held[:-1]])
    for i in c.few(np.flatnonzero(prev > plane * BIG + start)):
        holder = ev[:i][np.flatnonzero(plane[:i] * BIG + end[:i] == prev[i])[-1]]
        c.add("unit-busy", int(ev[i]), f"MXM plane {int(plane[i])} is held until cycle {int(prev[i] - plane[i] * BIG)} "
              f"by {c.describe(e, holder)}", e)


def _accumulators(c, e):
    """Accumulator rows in execution order: ACC after the last ABC is ready, reset only after read."""
    sel = np.flatnonzero((e.op == O.ABC) | (e.op == O.ACC))
    ready, kind, pending, last = {}, {}, {}, {}
    for i in sel.tolist():
        plane, t, a = int(e.unit[i]), int(e.cycle[i]), e.args[i]
        if e.op[i] == O.ABC:
            key = (plane, int(a[1]))
            k = O.DT_I32 if (a[0] >> 8) == O.DT_I8 else O.DT_F32
            if a[2] == 0 and pending.get(key):
                c.add("mxm-order", i, f"resets accumulator row {key[1]} of plane {plane} before the result of "
                      f"{c.describe(e, last[key])} was read (ACC)", e)
            elif a[2] != 0 and key in kind and not pending.get(key):
                c.add("mxm-order", i, f"accumulates onto row {key[1]} of plane {plane}, which was already read "
                      f"out and not reset", e)
            elif a[2] != 0 and key in kind and kind[key] != k:
                c.add("mxm-order", i, f"accumulates {O.DTYPES[k]} onto a {O.DTYPES[kind[key]]} row", e)
            ready[key], kind[key], pending[key], last[key] = t + int(e.lat[i]), k, True, i
        else:
            key = (plane, int(a[0]))
            if key not in ready:
                c.add("mxm-order", i, f"reads accumulator row {key[1]} of plane {plane}, which no ABC wrote", e)
                continue
            if ready[key] > t:
                c.add("mxm-order", i, f"reads accumulator row {key[1]} of plane {plane} before it is ready "
                      f"(cycle {ready[key]}, after {c.describe(e, last[key])})", e)
            if (a[1] >> 8) != kind[key]:
                c.add("mxm-order", i, f"reads a {O.DTYPES[kind[key]]} row as {O.DTYPES[int(a[1] >> 8) % 5]}", e)
            pending[key] = False
    for key, p in pending.items():
        if p:
            c.add("mxm-order", last[key], f"the result in accumulator row {key[1]} of plane {key[0]} is never read", e)


def check_transposes(c, e):
    lanes = c.m.lanes
    tin = np.flatnonzero(e.op == O.TPIN)
    tout = np.flatnonzero(e.op == O.TPOUT)
    w_in = WIDTH[np.clip(e.args[tin, 0] >> 8, 0, 4)]
    w_out = WIDTH[np.clip(e.args[tout, 2] >> 8, 0, 4)]
    buf_in, row, buf_out, col = e.args[tin, 1], e.args[tin, 2], e.args[tout, 0], e.args[tout, 1]
    nb = O.SXM_TRANSPOSE_BUFFERS
    for sel, buf, w, x in ((tin, buf_in, w_in, row), (tout, buf_out, w_out, col)):
        for i in c.few(np.flatnonzero((buf < 0) | (buf + w > nb) | (x < 0) | (x >= lanes))):
            c.add("operand", int(sel[i]), f"transpose buffer {int(buf[i])} (width {int(w[i])}) or row/column "
                  f"{int(x[i])} out of range", e)
    # one entry per buffer plane: TPIN (h, buf + b, row); TPOUT reads every row of buf + b
    r_in = np.repeat(np.arange(len(tin)), w_in)
    b_in = np.arange(len(r_in)) - np.repeat(np.cumsum(w_in) - w_in, w_in)
    r_out = np.repeat(np.arange(len(tout)), w_out)
    b_out = np.arange(len(r_out)) - np.repeat(np.cumsum(w_out) - w_out, w_out)
    in_ev, out_ev = tin[r_in], tout[r_out]
    in_buf = e.unit[in_ev] * nb + buf_in[r_in] + b_in
    out_buf = e.unit[out_ev] * nb + buf_out[r_out] + b_out
    okey = np.sort(out_buf * BIG + e.cycle[out_ev])
    epoch = np.searchsorted(okey, in_buf * BIG + e.cycle[in_ev], "right")   # TPOUTs in its cycle came first
    for a, b in c.few(_dups((epoch * (nb * 2) + in_buf) * lanes + row[r_in], in_ev)):
        c.add("mxm-order", int(b), f"transpose row {int(e.args[b, 2])} is filled again before "
              f"{c.describe(e, a)} was read out", e)
    ikey = np.sort(in_buf * BIG + e.cycle[in_ev])
    filled = np.searchsorted(ikey, out_buf * BIG + e.cycle[out_ev], "left") - np.searchsorted(ikey, out_buf * BIG)
    for i in c.few(np.unique(out_ev[filled == 0])):
        c.add("mxm-order", int(i), "reads a transpose buffer that no earlier TPIN filled", e)
