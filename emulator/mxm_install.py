"""Jitted weight install of the MXM (emulator/core.py, at IW): the weight buffer's rows as float32
weights, transposed if the IW says so, and the statistics of the weights w that the products
need (`settle`'s and `support`'s, emulator/mxm.py), all in one sweep over the rows (`install`):
- wnorm: per column of w an upper bound of its
  2-norm and that bound over the column's grain (that of its smallest nonzero magnitude:
  `norms`); +inf for a column with a non-finite value;
- wcols: per row of w [first, last + 1) of its nonzero (or non-finite)
  values, [lanes, 0) if none.
Each row is counted (`columns`, `span`) right after its conversion, while it is in the L1 cache
(separate passes over the 400 KB of weights for the norms and the support read them twice
more); rows the IW did not load and that are installed already (core.mxm_exec's `keep`) are
only added to the column sums. The squares are summed in float32 in row order: each square is exact in float32 (an
f16 square has at most 22 significant bits, an i8 one 14), and a float32 sum of K nonnegative
terms, in any order and grouping, is within a factor (1 + u)^(K - 1) <= 1 + 2 K u (u = 2^-24)
of the exact sum, so the sum times that factor, in float64, bounds the squared norm from above
(`norms`); a last factor covers the float64 roundings.
"""
import numpy as np
from numba import njit

from lpu.emulator.arith import D_I8, f16_value
from lpu.emulator.mxm import F16_FRACTION, F16_GRAIN


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
def install(buf, dt, trans, lanes, keep, w, wnorm, wcols):
    """w[k, n] = the weight buffer buf[row, byte plane, lane] (transposed in place if trans) as
    float32 numbers (f16 and i8 values are exact in it), with its wnorm and wcols. The rows
    k >= keep are installed already, with their wcols (core.mxm_exec: not loaded since an IW of
    the same dtype, untransposed as this one): only counted in the column statistics."""
    cacc, csmall = np.zeros(lanes, np.float32), np.full(lanes, np.inf, np.float32)
    for k in range(lanes):
        if k < keep:
            convert(buf[k], dt, w[k])
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
