"""Jitted weight install of the MXM (emulator/core.py): each LW converts its weight buffer row
to float32 in its plane's staging weights and updates the statistics the plane's IW needs
(`stage_row`); the IW brings the rows it did not load up to date, finalizes the statistics
(O(lanes)) and makes the staged weights the installed ones (`install`).

Two weight buffers per plane, wts32[0 or 1, plane]: wsel[plane] names the installed one (the
ABCs' weights, emulator/mxm.py `flush`), the other is staged into; an IW swaps them. A staged
row is tagged (btag[buffer, plane, row]) with the version of the buffer row it was converted
from (lver[plane, row]: the LW's execution index + 1, 0 before any LW) and the dtype of the
conversion, (version << 1) | dtype; -1 when the buffer row holds nothing known (a reset, a
transposed install). An IW installs every row of the weight buffer (core.lbuf: the bytes, kept
for this) as its dtype, the rows its LWs did not load too: a row whose staged copy is not of
the buffer row's version and the IW's dtype is copied from the other buffer where that one is
(a row the IW before loaded), else converted from the bytes.

The statistics (`settle`'s and `support`'s, emulator/mxm.py) of the installed weights w:
- wnorm (`column_norms` in emulator/mxm.py's docstrings): per column of w an upper bound of its
  2-norm and that bound over the column's grain (`grain` of its smallest nonzero magnitude);
  +inf for a column with a non-finite value;
- wcols (`row_support` there): per row of w [first, last + 1) of its nonzero (or non-finite)
  values, [lanes, 0) if none.
Kept per plane as rows come (`account`; sflt[plane] float32 [lanes], the columns' sums of
squares; ssmall[plane] float32 [lanes], their smallest nonzero magnitudes, +inf for none;
ssup[plane] [lanes, 2], the rows' support), at LW, then at IW for the rows the IW adds; the
column entries restart after each IW (`restart`). A transposed install (36 of
1,382 IWs in gpt2_small_decode) counts its transposed weights anew, row by row.
The squares are summed in float32 in the order the rows come: each square is exact in float32
(an f16 square has at most 22 significant bits, an i8 one 14), and a float32 sum of K
nonnegative terms, in any order and grouping, is within a factor (1 + u)^(K - 1) <= 1 + 2 K u
(u = 2^-24) of the exact sum, so the sum times that factor, in float64, bounds the squared norm
from above (`norms`); a last factor covers the float64 roundings.
"""
import numpy as np
from numba import njit

from lpu.emulator.arith import D_I8, f16_value
from lpu.emulator.borrow import prefetch
from lpu.emulator.mxm import grain

@njit(cache=True, inline="always")
def weight(lo, hi, dt):
    if dt == D_I8:
        return np.float32(np.int8(lo))
    return f16_value(lo, hi)


@njit(cache=True, inline="always")
def convert(src, dt, row):
    """row = the weight buffer row src [byte plane, lane] as float32 numbers of dtype dt."""
    lo, hi = src[0], src[1]
    for n in range(row.shape[0]):
        row[n] = weight(lo[n], hi[n], dt)


@njit(cache=True, inline="always")
def account(row, r, cacc, csmall, sup):
    """Add the float32 weights row (row r of w) to the statistics: the columns' float32 sums of
    squares cacc and smallest nonzero magnitudes csmall (+inf for none; a NaN is never taken,
    and an infinity is none: either makes its column's bounds +inf in `norms` whatever its
    grain), and sup[r] = the row's own [first, last + 1) of its nonzero (or non-finite)
    values, [lanes, 0) if none. (Loops that vectorize: with the magnitudes' bits as integers,
    through a view of the row, the first loop took ~90 ns a row instead of ~20.)"""
    lanes = row.shape[0]
    for n in range(lanes):
        v = row[n]
        cacc[n] += v * v
        m = abs(v)
        m = m if m != 0.0 else np.float32(np.inf)
        c = csmall[n]
        csmall[n] = m if m < c else c
    if row[0] != 0.0 and row[lanes - 1] != 0.0:      # dense: known at once
        sup[r, 0], sup[r, 1] = 0, lanes
        return
    lo, hi = np.int32(lanes), np.int32(0)
    for n in range(lanes):
        nz = row[n] != 0.0
        lo = min(lo, np.int32(n) if nz else np.int32(lanes))
        hi = max(hi, np.int32(n + 1) if nz else np.int32(0))
    sup[r, 0], sup[r, 1] = (lo, hi) if lo < hi else (lanes, 0)


@njit(cache=True)
def stage_row(src, dt, plane, r, ex, wts32, sflt, ssmall, ssup, btag, lver, wsel):
    """LW of row r (execution index ex) into the plane's weight buffer, whose bytes are src: the
    row as float32 in the staging weights, tagged, and its statistics."""
    b = 1 - wsel[plane]
    row, lanes = wts32[b, plane, r], wts32.shape[3]
    if r + 1 < lanes:       # the next LW's staging row (a plane's LWs come in row order)
        prefetch(wts32, ((b * wts32.shape[1] + plane) * lanes + r + 1) * lanes, 4 * lanes)
    convert(src, dt, row)
    lver[plane, r] = ex + 1
    btag[b, plane, r] = (ex + 1) << 1 | dt
    account(row, r, sflt[plane], ssmall[plane], ssup[plane])


@njit(cache=True)
def norms(acc, smallest, kk, out):
    """out[0, n] = an upper bound of the 2-norm of a column whose float32 sum of K <= kk squares
    is acc[n] (any order: see the module's docstring), out[1, n] = that over the grain of its
    smallest nonzero magnitude smallest[n]; +inf for a non-finite column."""
    grow = 1.0 + 2.0 * kk * 2.0 ** -24
    for n in range(acc.shape[0]):
        out[0, n] = np.sqrt(np.float64(acc[n]) * grow) * (1.0 + 2.0 ** -40)
        q = out[0, n] / grain(np.float64(smallest[n]))      # exact: a quotient by a power of two
        out[1, n] = q if q < np.inf else np.inf           # a NaN's column too (no proof: `settle`)


@njit(cache=True)
def restart(cacc, csmall):
    """The column statistics before the first row."""
    for n in range(cacc.shape[0]):
        cacc[n], csmall[n] = 0.0, np.inf


@njit(cache=True)
def install(plane, dt, trans, top, lbuf, wts32, wnorm, wcols, sflt, ssmall, ssup, btag, lver, wsel):
    """IW of dtype dt (transposed if trans) after LWs of the rows 0..top (top -1: none): the
    other rows brought up to date and counted, the statistics into wnorm[plane] and
    wcols[plane], the staging buffer made the installed one."""
    b = 1 - wsel[plane]
    w, other = wts32[b, plane], wts32[1 - b, plane]
    cacc, csmall, sup = sflt[plane], ssmall[plane], ssup[plane]
    lanes = w.shape[1]
    for r in range(top + 1, lanes):
        want = lver[plane, r] << 1 | dt
        if btag[b, plane, r] != want:
            if btag[1 - b, plane, r] == want:
                w[r, :] = other[r]
            else:
                convert(lbuf[plane, r], dt, w[r])
            btag[b, plane, r] = want
        account(w[r], r, cacc, csmall, sup)
    if trans:       # (36 of 1,382 IWs in gpt2_small_decode: the statistics of the transpose anew)
        for k0 in range(0, lanes, 32):
            for n0 in range(k0, lanes, 32):
                for k in range(k0, min(k0 + 32, lanes)):
                    for n in range(max(n0, k + 1), min(n0 + 32, lanes)):
                        w[k, n], w[n, k] = w[n, k], w[k, n]
        btag[b, plane, :] = -1
        restart(cacc, csmall)
        for r in range(lanes):
            account(w[r], r, cacc, csmall, sup)
    norms(cacc, csmall, w.shape[0], wnorm[plane])
    wcols[plane, :, :] = sup
    restart(cacc, csmall)
    wsel[plane] = b


def stage_workspace(nplanes, lanes):
    """(sflt, ssmall, ssup, btag, lver, wsel) as after a reset (`reset`)."""
    st = (np.zeros((nplanes, lanes), np.float32), np.zeros((nplanes, lanes), np.float32),
          np.zeros((nplanes, lanes, 2), np.int64), np.zeros((2, nplanes, lanes), np.int64),
          np.zeros((nplanes, lanes), np.int64), np.zeros(nplanes, np.int64))
    reset(st)
    return st


def reset(st):
    """No staged row known, every buffer row of version 0 (zeros), buffer 0 installed."""
    sflt, ssmall, _, btag, lver, wsel = st
    sflt.fill(0.0)
    ssmall.fill(np.inf)
    btag.fill(-1)
    lver.fill(0)
    wsel.fill(0)


def weight_stats(w, wnorm, wcols):
    """wnorm and wcols (the module's docstring) of the float32 weights w [K, lanes] as a whole, by
    the functions of an install (for tests)."""
    cacc, csmall = np.zeros(w.shape[1], np.float32), np.full(w.shape[1], np.inf, np.float32)
    _stats(w, cacc, csmall, wnorm, wcols)


@njit(cache=True)
def _stats(w, cacc, csmall, wnorm, wcols):
    for r in range(w.shape[0]):
        account(w[r], r, cacc, csmall, wcols)
    norms(cacc, csmall, w.shape[0], wnorm)
