"""The SXM's instructions for the jitted core (emulator/core.py `_loop` inlines `sxm_exec`): SHIFT,
ROTATE, PERMUTE and DISTRIBUTE from the source's byte planes, where they lie, into the result's
ring slot, and the transposer's TPIN (a stream into a row of a transpose buffer) and TPOUT (a
column of it onto a stream). Arrays in, arrays out."""
from numba import njit

from lpu.emulator.arith import C_DISTRIBUTE, C_PERMUTE, C_ROTATE, C_SHIFT, C_TPIN, C_TPOUT, WIDTH
from lpu.emulator.core_streams import (K_SXM_BUSY, TRANSPOSE_BUFFERS, copy_run, operand_error, ref_ok, slot_plane,
                                       stream_claim, stream_plane, stream_take, zero_run)


@njit(cache=True, inline="always")
def sxm_exec(op, a, h, p, t, ex, lat, lanes, spd, tables, ring, tbuf, hz, counters):
    """One SXM instruction, from the source's planes into the result's slot or a transpose buffer."""
    counters[K_SXM_BUSY] += 1
    if op == C_TPOUT:
        buf, col, ref = a[0], a[1], a[2]
        rf = 2
    else:
        ref = a[0]
        rf = 0
    dt = ref >> 8
    if ref < 0 or dt >= 5 or not ref_ok(ref, WIDTH[dt], spd):
        return operand_error(hz, rf, ref)
    w = WIDTH[dt]
    if op == C_TPOUT or op == C_TPIN:
        if op == C_TPIN:
            buf, row = a[1], a[2]
            if row < 0 or row >= lanes:
                return operand_error(hz, 2, row)
        elif col < 0 or col >= lanes:
            return operand_error(hz, 1, col)
        if buf < 0 or buf + w > TRANSPOSE_BUFFERS:
            return operand_error(hz, 0 if op == C_TPOUT else 1, buf)
        if op == C_TPIN:
            slot = stream_take(ref, w, p, t, ring, hz)
            if slot < 0:
                return False
            for b in range(w):
                copy_run(stream_plane(ring, ref, b, slot), tbuf[h, buf + b, row])
            return True
        slot = stream_claim(ref, w, p, t + lat, ex, ring, hz)
        if slot < 0:
            return False
        for b in range(w):
            t_, y = tbuf[h, buf + b], slot_plane(ring, ref, b, slot)
            for l in range(lanes):
                y[l] = t_[l, col]
        return True
    oref, k = a[1], a[2]
    if oref < 0 or oref >> 8 != dt or not ref_ok(oref, w, spd):
        return operand_error(hz, 1, oref)
    if op == C_PERMUTE and (k < 0 or k >= tables.shape[0]):
        return operand_error(hz, 2, k)
    if op == C_DISTRIBUTE and (k < 0 or k >= lanes):
        return operand_error(hz, 2, k)
    sli = stream_take(ref, w, p, t, ring, hz)
    if sli < 0:
        return False
    slo = stream_claim(oref, w, p, t + lat, ex, ring, hz)
    if slo < 0:
        return False
    for b in range(w):     # from the source's plane into the slot's (SHIFT and ROTATE as runs from 0 over views: loops that vectorize)
        x, y = stream_plane(ring, ref, b, sli), slot_plane(ring, oref, b, slo)
        if op == C_SHIFT:
            lo, hi = min(max(k, 0), lanes), max(min(lanes + k, lanes), 0)
            for l in range(lo):
                y[l] = 0
            if hi > lo:
                copy_run(x[lo - k:hi - k], y[lo:hi])
            zero_run(y[max(hi, lo):lanes])
        elif op == C_ROTATE:
            kk = k % lanes
            copy_run(x[lanes - kk:lanes], y[:kk])
            copy_run(x[:lanes - kk], y[kk:lanes])
        elif op == C_PERMUTE:
            tab = tables[k]
            for l in range(lanes):
                y[l] = x[tab[l]] if tab[l] >= 0 and tab[l] < lanes else 0
        else:
            for l in range(lanes):
                y[l] = x[k]
    return True
