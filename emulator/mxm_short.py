"""The MXM's short path (emulator/mxm.py `flush`: a batch below blas.bulk_work() multiply-adds): the
float64 sums of a batch's products over its `support`, inside the jitted core, which
`mxm.products_over` settles into the contract's results (docs/accumulation.md: its bound holds for any order and grouping
of the additions, so every kernel here gives the same bits).

The installed weights are float32 (f16 and i8 values are exact in it) and each is converted to
float64 where it is used: the conversions, not the fused multiply-adds, bound a loop over one row
(a 4-column step of one lane: one conversion, one multiply-add). So the rows go in passes of four
(`quad_over`, four lanes at a time: a conversion serves four rows), then two (`pair_over`, eight
lanes at a time: the sums loaded and stored once per eight lanes), then one (`row_over`, eight
lanes). Each row's products of a pass are added to its sum as one chain of fused multiply-adds
(`contract`: every product of two f16 or i8 values is exact in float64, so a*b + c rounds once
either way). With `tight` (every operand finite) a group of lanes adds only over its weight rows'
nonzero columns (wcols: the install's row spans, emulator/mxm_install.py): the products it skips are exact zeros (block-diagonal
weights: packed attention heads).

Microbenchmark, min of 25 interleaved trials, against four lanes and two rows a pass (the kernel
before): a batch of 1 row x 320 lanes x 320 columns 5.6 vs 6.3 us, 2 rows 7.4 vs 8.2-9.6, 4 rows x
128 lanes 5.6 vs 6.2, 5 rows 6.9 vs 7.6, 16 x 320 x 320 42 vs 50.
"""
import numpy as np
from numba import njit


@njit(cache=True)
def sums_over(x, n, w, y, wcols, tight, act, na, clo, chi):
    """y[b, m] = the float64 sum of x[b, k] w[k, m] over the lanes k in act[:na] and the columns
    [clo, chi) (`support`; every other element is +0) for the rows b < n of x, unsettled."""
    for b in range(n):
        for m in range(w.shape[1]):
            y[b, m] = 0.0
    b = 0
    while b + 4 <= n:
        quad_over(x[b:b + 4], w, y[b:b + 4], wcols, tight, act, na, clo, chi)
        b += 4
    if b + 2 <= n:
        pair_over(x[b:b + 2], w, y[b:b + 2], wcols, tight, act, na, clo, chi)
        b += 2
    if b < n:
        row_over(x[b], w, y[b], wcols, tight, act, na, clo, chi)


@njit(cache=True, inline="always")
def _columns(wcols, tight, act, j, g, clo, chi):
    """The columns [lo, hi) of [clo, chi) where the weight rows act[j:j + g] can be nonzero."""
    if not tight:
        return clo, chi
    lo, hi = chi, clo
    for i in range(j, j + g):
        lo, hi = min(lo, wcols[act[i], 0]), max(hi, wcols[act[i], 1])
    return max(lo, clo), min(hi, chi)


@njit(cache=True, fastmath={"contract"})
def _lanes_left(x, w, y, wcols, tight, act, j, na, clo, chi):
    """y[b] += x[b, k] w[k] over the lanes act[j:na] (fewer than a pass), for every row b of x."""
    for j in range(j, na):
        k = act[j]
        lo, hi = _columns(wcols, tight, act, j, 1, clo, chi)
        row = w[k, lo:hi]
        for b in range(x.shape[0]):
            xk, yb = x[b, k], y[b, lo:hi]
            for m in range(hi - lo):
                yb[m] += xk * row[m]


@njit(cache=True, fastmath={"contract"})
def quad_over(x, w, y, wcols, tight, act, na, clo, chi):
    """`sums_over` for four rows (x[:4], y[:4]): four lanes a pass."""
    j = 0
    while j + 4 <= na:
        k0, k1, k2, k3 = act[j], act[j + 1], act[j + 2], act[j + 3]
        lo, hi = _columns(wcols, tight, act, j, 4, clo, chi)
        r0, r1, r2, r3 = w[k0, lo:hi], w[k1, lo:hi], w[k2, lo:hi], w[k3, lo:hi]
        x0, x1, x2, x3, yb = x[0, k0], x[0, k1], x[0, k2], x[0, k3], y[0, lo:hi]
        z0, z1, z2, z3, zb = x[1, k0], x[1, k1], x[1, k2], x[1, k3], y[1, lo:hi]
        u0, u1, u2, u3, ub = x[2, k0], x[2, k1], x[2, k2], x[2, k3], y[2, lo:hi]
        v0, v1, v2, v3, vb = x[3, k0], x[3, k1], x[3, k2], x[3, k3], y[3, lo:hi]
        for m in range(hi - lo):
            a0, a1, a2, a3 = np.float64(r0[m]), np.float64(r1[m]), np.float64(r2[m]), np.float64(r3[m])
            yb[m] = x3 * a3 + (x2 * a2 + (x1 * a1 + (x0 * a0 + yb[m])))
            zb[m] = z3 * a3 + (z2 * a2 + (z1 * a1 + (z0 * a0 + zb[m])))
            ub[m] = u3 * a3 + (u2 * a2 + (u1 * a1 + (u0 * a0 + ub[m])))
            vb[m] = v3 * a3 + (v2 * a2 + (v1 * a1 + (v0 * a0 + vb[m])))
        j += 4
    _lanes_left(x, w, y, wcols, tight, act, j, na, clo, chi)


@njit(cache=True, fastmath={"contract"})
def pair_over(x, w, y, wcols, tight, act, na, clo, chi):
    """`sums_over` for two rows (x[:2], y[:2]): eight lanes a pass."""
    j = 0
    while j + 8 <= na:
        k0, k1, k2, k3, k4, k5, k6, k7 = (act[j], act[j + 1], act[j + 2], act[j + 3], act[j + 4], act[j + 5],
                                          act[j + 6], act[j + 7])
        lo, hi = _columns(wcols, tight, act, j, 8, clo, chi)
        r0, r1, r2, r3 = w[k0, lo:hi], w[k1, lo:hi], w[k2, lo:hi], w[k3, lo:hi]
        r4, r5, r6, r7 = w[k4, lo:hi], w[k5, lo:hi], w[k6, lo:hi], w[k7, lo:hi]
        xb, zb = x[0], x[1]
        x0, x1, x2, x3, x4, x5, x6, x7 = xb[k0], xb[k1], xb[k2], xb[k3], xb[k4], xb[k5], xb[k6], xb[k7]
        z0, z1, z2, z3, z4, z5, z6, z7 = zb[k0], zb[k1], zb[k2], zb[k3], zb[k4], zb[k5], zb[k6], zb[k7]
        yb, zb = y[0, lo:hi], y[1, lo:hi]
        for m in range(hi - lo):
            a0, a1, a2, a3 = np.float64(r0[m]), np.float64(r1[m]), np.float64(r2[m]), np.float64(r3[m])
            a4, a5, a6, a7 = np.float64(r4[m]), np.float64(r5[m]), np.float64(r6[m]), np.float64(r7[m])
            yb[m] = x7 * a7 + (x6 * a6 + (x5 * a5 + (x4 * a4 + (x3 * a3 + (x2 * a2 + (x1 * a1 + (x0 * a0 + yb[m])))))))
            zb[m] = z7 * a7 + (z6 * a6 + (z5 * a5 + (z4 * a4 + (z3 * a3 + (z2 * a2 + (z1 * a1 + (z0 * a0 + zb[m])))))))
        j += 8
    _lanes_left(x, w, y, wcols, tight, act, j, na, clo, chi)


@njit(cache=True, fastmath={"contract"})
def row_over(x, w, y, wcols, tight, act, na, clo, chi):
    """`sums_over` for one row (x[k], y[m]): eight lanes a pass."""
    j = 0
    while j + 8 <= na:
        k0, k1, k2, k3, k4, k5, k6, k7 = (act[j], act[j + 1], act[j + 2], act[j + 3], act[j + 4], act[j + 5],
                                          act[j + 6], act[j + 7])
        lo, hi = _columns(wcols, tight, act, j, 8, clo, chi)
        r0, r1, r2, r3 = w[k0, lo:hi], w[k1, lo:hi], w[k2, lo:hi], w[k3, lo:hi]
        r4, r5, r6, r7 = w[k4, lo:hi], w[k5, lo:hi], w[k6, lo:hi], w[k7, lo:hi]
        x0, x1, x2, x3, x4, x5, x6, x7 = x[k0], x[k1], x[k2], x[k3], x[k4], x[k5], x[k6], x[k7]
        yb = y[lo:hi]
        for m in range(hi - lo):
            yb[m] = x7 * r7[m] + (x6 * r6[m] + (x5 * r5[m] + (x4 * r4[m] + (
                x3 * r3[m] + (x2 * r2[m] + (x1 * r1[m] + (x0 * r0[m] + yb[m])))))))
        j += 8
    for j in range(j, na):
        k = act[j]
        lo, hi = _columns(wcols, tight, act, j, 1, clo, chi)
        row, xk, yb = w[k, lo:hi], x[k], y[lo:hi]
        for m in range(hi - lo):
            yb[m] += xk * row[m]
