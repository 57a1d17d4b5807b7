"""Jitted weight buffer and install of the MXM (emulator/core.py). Each buffer row has two sides:
an LW writes the side that is not installed (`lw_exec`), an IW makes the rows loaded since the
last one installed by flipping their sides (`install_lazily`; the rows above keep theirs: the
bits the previous LWs left), so the installed bytes stay as they are while the next tile loads
(the hardware's double buffer) and an IW converts nothing. The conversion (`materialize`, at the
first batch that needs it: emulator/mxm.py `flush`; a short batch of the first rows multiplies
the bytes themselves, emulator/mxm_direct.py) is the installed rows as float32 weights,
transposed if the IW said so, and the statistics of the weights w that the products need
(`settle`'s and `support`'s, emulator/mxm.py), all in one sweep over the rows (`install`):
- wnorm: per column of w an upper bound of its
  2-norm and that bound over the column's grain (that of its smallest nonzero magnitude:
  `norms`); +inf for a column with a non-finite value;
- wcols: per row of w [first, last + 1) of its nonzero (or non-finite)
  values, [lanes, 0) if none.
Each row is counted (`columns`, `span`) right after its conversion, while it is in the L1 cache
(separate passes over the 400 KB of weights for the norms and the support read them twice
more); rows converted already (`install_lazily`'s count of the first rows that are not: wdt[2])
are only added to the column sums. The squares are summed in float32 in row order: each square is exact in float32 (an
f16 square has at most 22 significant bits, an i8 one 14), and a float32 sum of K nonnegative
terms, in any order and grouping, is within a factor (1 + u)^(K - 1) <= 1 + 2 K u (u = 2^-24)
of the exact sum, so the sum times that factor, in float64, bounds the squared norm from above
(`norms`); a last factor covers the float64 roundings.
"""
import numpy as np
from numba import njit

from lpu.emulator.arith import D_F16, D_I8, WIDTH, f16_value, i8_to_f16_bits
from lpu.emulator.core_streams import ORD_RELOAD, copy_run, operand_error, order_hazard, ref_ok, stream_read

ROW_F16, ROW_NON_FINITE, ROW_INTEGERS = 0, 1, 2     # what a weight buffer row holds (`lw_exec`)
F16_FRACTION = 10         # bits of an f16 significand after the leading one
F16_GRAIN = -24           # an f16 value is a multiple of 2^-24 (the smallest subnormal)


@njit(cache=True)
def mxm_input_ok(ref, plane, spd):
    """An LW/ABC operand: i8, or f16 on an even plane (the pair's f16 unit)."""
    dt = ref >> 8
    return ref >= 0 and (dt == D_I8 or (dt == D_F16 and plane % 2 == 0)) and ref_ok(ref, WIDTH[dt], spd)


@njit(cache=True, inline="always")
def lw_exec(a, plane, p, t, ex, lanes, spd, ring, lbuf, lrows, lw_dt, ord_lw, sa, hz):
    """LW: a weight buffer row from a stream, into the side of the row that is not installed
    (lbuf[plane, row, side], lrows[plane, row]: the installed side, and per side what the row
    holds as f16 numbers: ROW_INTEGERS i8 values converted (cvt: integers of magnitude <= 128),
    ROW_NON_FINITE some infinity or NaN, ROW_F16 other values; emulator/mxm_direct.py, which needs
    every installed row finite, an unused lane's too: 0 * inf is NaN); inlined into the core's loop
    (40,000 in bert_base L=1: as a case of core.mxm_exec, its call with ~40 arguments took ~10% of
    the run)."""
    row, ref, cvt = a[0], a[1], a[2]
    if row < 0 or row >= lanes:
        return operand_error(hz, 0, row)
    if not mxm_input_ok(ref, plane, spd):
        return operand_error(hz, 1, ref)
    if cvt != 0 and (cvt != 1 or ref >> 8 != D_I8 or plane % 2 != 0):
        return operand_error(hz, 2, cvt)
    if lw_dt[plane, row] != -1:
        return order_hazard(hz, ORD_RELOAD, plane, row)
    side = 1 - lrows[plane, row, 0]
    dst = lbuf[plane, row, side]      # (the stream's bytes straight into the buffer row, unless converted)
    if not stream_read(ref, WIDTH[ref >> 8], p, t, ring, sa if cvt != 0 else dst, hz):
        return False
    lw_dt[plane, row] = D_F16 if cvt != 0 else ref >> 8
    ord_lw[plane, row] = ex
    if cvt != 0:
        for l in range(lanes):
            bits = i8_to_f16_bits(np.int64(np.int8(sa[0, l])))
            dst[0, l] = bits & 0xFF
            dst[1, l] = bits >> 8
        lrows[plane, row, 1 + side] = ROW_INTEGERS
        return True
    hi = dst[1]
    if ref >> 8 == D_I8:    # the row's high bytes stay those of its last f16 load, as in one buffer
        copy_run(lbuf[plane, row, 1 - side, 1], hi)
    big = 0     # the largest f16 exponent field: 0x7C (all ones) for an infinity or a NaN
    for l in range(lanes):
        big = max(big, hi[l] & 0x7C)
    lrows[plane, row, 1 + side] = ROW_NON_FINITE if big == 0x7C else ROW_F16
    return True


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
def columns(row, cacc, csmall):
    """Add the float32 weights row to the columns' float32 sums of squares cacc and smallest
    nonzero magnitudes csmall (+inf for none; a NaN is never taken, and an infinity is none:
    either makes its column's bounds +inf in `norms` whatever its grain). (A loop that
    vectorizes: with the magnitudes' bits as integers, through a view of the row, it took ~90
    ns a row instead of ~20.)"""
    for n in range(row.shape[0]):
        v = row[n]
        cacc[n] += v * v
        m = abs(v)
        m = m if m != 0.0 else np.float32(np.inf)
        c = csmall[n]
        csmall[n] = m if m < c else c


@njit(cache=True, inline="always")
def span(row, r, sup):
    """sup[r] = [first, last + 1) of the nonzero (or non-finite) values of row, [lanes, 0) if none.
    A row nonzero at both ends (dense) is known at once; another is scanned whole, branch-free
    (a min and a max over int32: a loop that vectorizes; a scan from each end that stops at the
    first nonzero took ~80 us a tile of packed attention heads, mostly zeros, against ~12)."""
    lanes = row.shape[0]
    if row[0] != 0.0 and row[lanes - 1] != 0.0:
        sup[r, 0], sup[r, 1] = 0, lanes
        return
    lo, hi = np.int32(lanes), np.int32(0)
    for n in range(lanes):
        nz = row[n] != 0.0
        lo = min(lo, np.int32(n) if nz else np.int32(lanes))
        hi = max(hi, np.int32(n + 1) if nz else np.int32(0))
    sup[r, 0], sup[r, 1] = (lo, hi) if lo < hi else (lanes, 0)


@njit(cache=True)
def norms(acc, smallest, kk, out):
    """out[0, n] = an upper bound of the 2-norm of a column whose float32 sum of K <= kk squares
    is acc[n] (any order: see the module's docstring), out[1, n] = that over the grain of its
    smallest nonzero magnitude smallest[n] (+inf: none): the largest power of two that every
    f16 value of that magnitude or more is a multiple of, 2^max(floor(log2 smallest) - 10, -24),
    1 if none (from the float32 exponent, f16 and i8 values being normal numbers there: a loop
    that vectorizes, where math.frexp took ~1.5 us an IW); +inf for a non-finite column."""
    grow = 1.0 + 2.0 * kk * 2.0 ** -24
    ebits = smallest.view(np.int32)
    inv = np.empty(acc.shape[0], np.int64)       # the float64 bits of 1 / grain
    for n in range(acc.shape[0]):
        e = (ebits[n] >> 23) & 0xFF               # 255: +inf, no nonzero value (grain 1)
        g = max(e - 127 - F16_FRACTION, F16_GRAIN) if e != 255 else 0
        inv[n] = (1023 - g) << 52
    ig = inv.view(np.float64)
    for n in range(acc.shape[0]):
        out[0, n] = np.sqrt(np.float64(acc[n]) * grow) * (1.0 + 2.0 ** -40)
        q = out[0, n] * ig[n]                     # exact: a product by a power of two
        out[1, n] = q if q < np.inf else np.inf   # a NaN's column too (no proof: `settle`)


@njit(cache=True)
def install(buf, rows, dt, trans, lanes, keep, w, wnorm, wcols):
    """w[k, n] = the installed weight buffer, row k buf[k, rows[k, 0]] (its installed side: `lw_exec`)
    [byte plane, lane] (transposed in place if trans), as float32 numbers (f16 and i8 values are
    exact in it), with its wnorm and wcols. The rows k >= keep are in w already, with their wcols
    (`install_lazily`: not loaded since an IW of the same dtype, untransposed as this one): only
    counted in the column statistics."""
    cacc, csmall = np.zeros(lanes, np.float32), np.full(lanes, np.inf, np.float32)
    for k in range(lanes):
        if k < keep:
            convert(buf[k, rows[k, 0]], dt, w[k])
        if not trans:
            columns(w[k], cacc, csmall)
            if k < keep:
                span(w[k], k, wcols)
    if trans:       # (36 of 1,382 IWs in gpt2_small_decode: the transpose counted in a second sweep)
        for k0 in range(0, lanes, 32):
            for n0 in range(k0, lanes, 32):
                for k in range(k0, min(k0 + 32, lanes)):
                    for n in range(max(n0, k + 1), min(n0 + 32, lanes)):
                        w[k, n], w[n, k] = w[n, k], w[k, n]
        for k in range(lanes):
            columns(w[k], cacc, csmall)
            span(w[k], k, wcols)
    norms(cacc, csmall, lanes, wnorm)


@njit(cache=True)
def install_lazily(plane, dt, trans, top, lanes, lrows, wdt):
    """IW (after its checks, core.mxm_exec): the rows 0..top, loaded since the last IW (each into
    its side that was not installed: `lw_exec`), become the installed ones; the rows above keep
    theirs. Nothing is converted (`materialize`, when a batch needs it; mxm_direct multiplies short
    batches from the bytes). wdt[:, plane]: the installed dtype, 2 dtype + transposed, how many
    first rows of the float32 weights (wts32, with wcols) are not the installed ones (lanes: none
    is; the rows above are unchanged since an untransposed install of the same dtype was converted:
    `install`'s keep), and the ABC rows multiplied from the bytes since the IW (mxm.flush)."""
    for r in range(top + 1):
        lrows[plane, r, 0] = 1 - lrows[plane, r, 0]
    same = trans == 0 and wdt[1, plane] == 2 * dt
    wdt[2, plane] = max(wdt[2, plane], top + 1) if same else lanes
    wdt[0, plane], wdt[1, plane], wdt[3, plane] = dt, 2 * dt + (trans != 0), 0


@njit(cache=True)
def materialize(plane, lbuf, lrows, wts32, wnorm, wcols, wdt):
    """Convert the plane's installed weights (`install`), unless they are already."""
    if wdt[2, plane] != 0:
        install(lbuf[plane], lrows[plane], wdt[0, plane], wdt[1, plane] & 1 != 0, wts32.shape[1], wdt[2, plane],
                wts32[plane], wnorm[plane], wcols[plane])
        wdt[2, plane] = 0


@njit(cache=True)
def installed_finite(rows):
    """Whether every installed row of a plane's buffer (rows: lrows[plane]) holds finite values."""
    nf = False
    for k in range(rows.shape[0]):
        nf |= rows[k, 1 + rows[k, 0]] == ROW_NON_FINITE
    return not nf


def weight_stats(w, wnorm, wcols):
    """wnorm and wcols (the module's docstring) of the float32 weights w [K, lanes] as a whole, by
    the functions of an install (for tests)."""
    cacc, csmall = np.zeros(w.shape[1], np.float32), np.full(w.shape[1], np.inf, np.float32)
    _stats(w, cacc, csmall, wnorm, wcols)


@njit(cache=True)
def _stats(w, cacc, csmall, wnorm, wcols):
    for r in range(w.shape[0]):
        columns(w[r], cacc, csmall)
        span(w[r], r, wcols)
    norms(cacc, csmall, w.shape[0], wnorm)
