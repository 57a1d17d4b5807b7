"""Jitted MXM arithmetic of the core (emulator/core.py): weight install, the products of pending
ABCs, accumulation, and the test that decides when a batch may go to BLAS instead.

The accumulation contract (docs/accumulation.md): an ABC's dot product over the lanes is the
sum, in lane order k = 0, 1, ..., in float64, of the products x[k] * w[k, n], each exact in
float64 (f16 x f16 needs 22 significant bits, i8 x i8 15), rounded once to f32 (f16) or taken
as an integer (i8); then added to the accumulator row in f32 (or i32, wrapping) when `accum`.

Batches. The ABCs that meet one installed weight buffer are kept pending and multiplied out
together when the plane's ACC or IW comes (or the batch is full). Two ways, same bits:
- `products`: each element summed over k in order (the contract, literally);
- BLAS (`x @ w` in float64, emulator/run.py), only when `exact_in_f64` proves every partial sum
  of every element is exact in float64 in any order: then the BLAS sum and the in-order sum are
  both the exact sum. Values are integers in units of 2^-24 (every f16 is; i8 too), products
  multiples of 2^(tx + tw) where 2^tx is the lowest set bit over the batch's activations and 2^tw
  over the weights, and bounded by 2^(bx + bw) (bx, bw: bit lengths of the largest magnitudes);
  a sum of K of them needs at most bx + bw + ceil(log2 K) - tx - tw bits, exact if <= 53.
  Non-finite operands never take the BLAS path.
"""
import numpy as np
from numba import njit

from lpu.emulator.arith import D_I8, wrap32

SCALE = float(1 << 24)    # f16 and i8 values are integers in units of 2^-24
MANTISSA = 53             # bits of a float64 significand
S_OR, S_MAX, S_BAD, S_DONE = range(4)   # statistics: OR and max of |v| * 2^24, non-finite seen, computed


@njit(cache=True)
def bit_length(v):
    n = 0
    while v != 0:
        v >>= 1
        n += 1
    return n


@njit(cache=True)
def trailing_zeros(v):
    n = 0
    while v != 0 and (v & 1) == 0:
        v >>= 1
        n += 1
    return n


@njit(cache=True, inline="always")
def note(stat, v):
    """Fold value v into the statistics stat[S_OR, S_MAX, S_BAD]."""
    if not np.isfinite(v):
        stat[S_BAD] = 1
        return
    iv = np.int64(abs(v) * SCALE)
    stat[S_OR] |= iv
    if iv > stat[S_MAX]:
        stat[S_MAX] = iv


@njit(cache=True)
def exact_in_f64(xs, ws, k):
    """Whether every partial sum of k products of a batch (statistics xs) and weights (ws) is
    exact in float64, whatever the order (see the module docstring)."""
    if xs[S_BAD] != 0 or ws[S_BAD] != 0:
        return False
    if xs[S_OR] == 0 or ws[S_OR] == 0:
        return True
    bits = bit_length(xs[S_MAX]) + bit_length(ws[S_MAX]) + bit_length(k - 1)
    return bits - trailing_zeros(xs[S_OR]) - trailing_zeros(ws[S_OR]) <= MANTISSA


@njit(cache=True)
def weight_stats(w, stat):
    """The statistics of installed weights, computed once per install, when a batch first asks."""
    if stat[S_DONE] != 0:
        return
    for k in range(w.shape[0]):
        for n in range(w.shape[1]):
            note(stat, w[k, n])
    stat[S_DONE] = 1


@njit(cache=True)
def install(buf, dt, trans, lanes, f16tab, w, stat):
    """w[k, n] = the weight buffer buf[byte plane, row, lane] (transposed if trans) as numbers;
    stat: their statistics, to be computed (weight_stats)."""
    stat[:] = 0
    lo, hi = buf[0], buf[1]
    if dt == D_I8 and trans:
        for k in range(lanes):
            for n in range(lanes):
                w[k, n] = np.float64(np.int8(lo[n, k]))
    elif dt == D_I8:
        for k in range(lanes):
            for n in range(lanes):
                w[k, n] = np.float64(np.int8(lo[k, n]))
    elif trans:
        for k in range(lanes):
            for n in range(lanes):
                w[k, n] = f16tab[np.int64(lo[n, k]) | (np.int64(hi[n, k]) << 8)]
    else:
        for k in range(lanes):
            for n in range(lanes):
                w[k, n] = f16tab[np.int64(lo[k, n]) | (np.int64(hi[k, n]) << 8)]


@njit(cache=True)
def products(x, n, w, y):
    """y[b, m] = sum over k, in order, of x[b, k] * w[k, m] in float64, for b < n (each weight
    row read once for the batch)."""
    lanes = w.shape[1]
    for b in range(n):
        for m in range(lanes):
            y[b, m] = 0.0
    for k in range(w.shape[0]):
        row = w[k]
        for b in range(n):
            xk = x[b, k]
            yb = y[b]
            for m in range(lanes):
                yb[m] += xk * row[m]


@njit(cache=True)
def accumulate(acc_bits, meta, n, y):
    """Apply n products y (in issue order) to the accumulator rows acc_bits[row] of one plane:
    set, or add when `accum` (meta rows: acc row, accum, dtype)."""
    lanes = y.shape[1]
    for b in range(n):
        r, accum, dt = meta[b, 0], meta[b, 1], meta[b, 2]
        if dt == D_I8:
            acc_i = acc_bits[r].view(np.int32)
            for m in range(lanes):
                v = np.int64(y[b, m])
                acc_i[m] = wrap32(acc_i[m] + v) if accum != 0 else v
        else:
            acc_f = acc_bits[r].view(np.float32)
            for m in range(lanes):
                y32 = np.float32(y[b, m])
                acc_f[m] = np.float32(acc_f[m] + y32) if accum != 0 else y32
