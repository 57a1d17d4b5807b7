"""Jitted MXM arithmetic of the core (emulator/core.py): the products of pending ABCs (`flush`:
short batches by `products_over`, the sums in emulator/mxm_short.py, large ones by BLAS,
`blas_over`; the first short batches of an install not converted yet from the weight buffer's
bytes, `direct`, emulator/mxm_direct.py), accumulation. (The weight buffer and install, with
the weights' column norms `wnorm` and row spans `wcols`: emulator/mxm_install.py.)

The accumulation contract (docs/accumulation.md): an ABC's dot product over the lanes is the
EXACT sum of the exact products x[k] * w[k, n], rounded once to f32 (nearest even) for f16, or
taken as the exact integer for i8; then added to the accumulator row in f32 (or i32, wrapping)
when `accum`. The order of the additions does not enter, so every exact method gives the bits:

- `products` (every batch with run(..., bulk=False)): each element summed exactly in two float64
  accumulators (`exact_dot`), then correctly rounded (`round_f32`);
- `settle` after a float64 product (the short path's sums, or `x @ w` by BLAS: numpy's BLAS
  called from the core, emulator/blas.py, or numpy on the host, emulator/run.py): where the
  products' grains and norms prove every partial sum exact, or where every value within the
  error bound of any order's sum (na * 2^-53 * |x|_2 |w[:, n]|_2) rounds to the same f32, that
  f32 is the rounding of the exact sum (`direct`: the bound from the sum of the products'
  magnitudes, mxm_direct.settle_sums); a non-finite sum of the short path is the contract's
  NaN or infinity. The few other elements (cancellation, a sum within the bound of an f32
  rounding boundary, BLAS's non-finite values) are recomputed with `exact_dot`.

Numbers: f16 and i8 values are multiples of 2^-24 below 2^16, so every product is exact in
float64 (at most 22 significant bits), a multiple of 2^-48 below 2^32.
"""
import numpy as np
from numba import njit

from lpu.emulator.arith import D_F16, D_I8, wrap32
from lpu.emulator.blas import dgemm
from lpu.emulator.core_streams import H_FLUSH
from lpu.emulator.mxm_direct import (
    DIRECT_MIN_LANES, DIRECT_ROWS, F64_INF, F64_MAGNITUDE, active_lanes, exact_rows, magnitudes, settle_sums, sums,
    weight_bounds,
)
from lpu.emulator.mxm_install import F16_FRACTION, F16_GRAIN, installed_finite, materialize
from lpu.emulator.mxm_short import sums_over

MANTISSA = 53             # bits of a float64 significand


@njit(cache=True)
def split_scale(k):
    """2^(s - 48): a product p (a multiple of 2^-48 below 2^32) is split into its high part
    h = trunc(p / 2^(s - 48)) * 2^(s - 48) and its low part p - h, below 2^(s - 48), with s such
    that k low parts (k * 2^s <= 2^53 units of 2^-48) and k high parts (multiples of 2^(s - 48)
    below 2^32 * k) both add exactly in float64, in any order."""
    b = 0
    while (1 << b) < k:
        b += 1
    return 2.0 ** (MANTISSA - b - 48)


@njit(cache=True)
def round_f32(hi, lo):
    """The f32 nearest (ties to even) to the exact hi + lo, as a float64: hi + lo rounded to
    odd at 53 bits (error-free two-sum, then the odd one of the two neighbours), which rounds
    to f32 as the exact sum does (53 >= 24 + 2)."""
    r = hi + lo
    bb = r - hi
    e = (hi - (r - bb)) + (lo - bb)
    if e != 0.0:
        r2 = np.nextafter(r, np.inf if e > 0.0 else -np.inf)
        if np.fmod(r / abs(r2 - r), 2.0) == 0.0:     # r's significand is even: take r2
            r = r2
    return np.float64(np.float32(r)) + 0.0


@njit(cache=True)
def exact_dot(x, w, m, c, act, na):
    """The contract's f32 result (as float64) of the dot product x . w[:, m] of one element over
    the lanes act[:na] (every lane whose product can be nonzero: `support`; c: split_scale(k)).
    The high and the low parts each add exactly in any order, so four of each are summed
    side by side (independent additions: a quarter of the loop's latency)."""
    ic = 1.0 / c           # a power of two: p * ic is p / c exactly
    h0, h1, h2, h3, l0, l1, l2, l3 = 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0
    j = 0
    while j + 4 <= na:
        p0, p1 = x[act[j]] * w[act[j], m], x[act[j + 1]] * w[act[j + 1], m]
        p2, p3 = x[act[j + 2]] * w[act[j + 2], m], x[act[j + 3]] * w[act[j + 3], m]
        t0, t1, t2, t3 = np.trunc(p0 * ic) * c, np.trunc(p1 * ic) * c, np.trunc(p2 * ic) * c, np.trunc(p3 * ic) * c
        h0, h1, h2, h3 = h0 + t0, h1 + t1, h2 + t2, h3 + t3
        l0, l1, l2, l3 = l0 + (p0 - t0), l1 + (p1 - t1), l2 + (p2 - t2), l3 + (p3 - t3)
        j += 4
    for j in range(j, na):
        p = x[act[j]] * w[act[j], m]
        t = np.trunc(p * ic) * c
        h0 += t
        l0 += p - t
    hi, lo = (h0 + h1) + (h2 + h3), (l0 + l1) + (l2 + l3)
    if np.isfinite(hi) and np.isfinite(lo):
        return round_f32(hi, lo)
    t = 0.0           # a non-finite product: the IEEE sum (NaN, or an infinity) in any order
    for j in range(na):
        t += x[act[j]] * w[act[j], m]
    return np.float64(np.float32(t))


@njit(cache=True)
def support(x, n, wcols, wnorm, act):
    """The part of the product x[:n] @ w that can be nonzero: (na, lo, hi, finite) with act[:na] the
    lanes k where some x[b, k] != 0 and [lo, hi) the columns where some weight of those rows is
    nonzero (wcols: the install's row spans of w, mxm_install). Every other product is an exact zero, so the exact sum
    of an element is the exact sum over act[:na], and outside [lo, hi) it is +0: valid only
    where every operand is finite (x here, w by its column norms); otherwise every lane and
    column (na = K, [0, lanes), finite False). (Integer passes over the magnitude bits, which
    vectorize: their largest tells a non-finite value, an OR per lane the nonzero lanes, which
    are then gathered in act itself: 0.5-0.9 us against 0.8-1.1 for float sums and branches.)"""
    kk, lanes = wcols.shape[0], wnorm.shape[1]
    wbits = wnorm[0].view(np.int64)
    big = 0
    for m in range(lanes):
        big = max(big, wbits[m] & F64_MAGNITUDE)
    na, xbig = active_lanes(x, n, act)
    if max(big, xbig) >= F64_INF:
        for k in range(kk):
            act[k] = k
        return kk, 0, lanes, False
    lo, hi = lanes, 0
    for j in range(na):
        lo = min(lo, wcols[act[j], 0])
        hi = max(hi, wcols[act[j], 1])
    return (na, lo, hi, True) if lo < hi else (na, 0, 0, True)


@njit(cache=True)
def products(x, n, w, dt, y, exact, wnorm, wcols, act):
    """y[b, m] = the contract's result for the rows b < n of x (each weight row read once for
    the batch). f16 with `exact` (the reference path, every lane and column): the high and low
    parts of `exact_dot` in y and a second array; else a float64 sum in lane order over the
    `support` (wcols: the install's row spans of w, act: int64 scratch [K]), settled like a BLAS product
    (`settle`, wnorm: the install's column norms of w)."""
    lanes = w.shape[1]
    if dt == D_I8 or not exact:         # i8: integers below 2^23, every float64 sum is exact
        if exact:
            for k in range(w.shape[0]):
                act[k] = k
            na, clo, chi, finite = w.shape[0], 0, lanes, True     # i8: every value finite
        else:
            na, clo, chi, finite = support(x, n, wcols, wnorm, act)
        products_over(x, n, w, dt, y, wnorm, wcols, finite, act, na, clo, chi)
        return
    for b in range(n):
        for m in range(lanes):
            y[b, m] = 0.0
    c = split_scale(w.shape[0])
    ic = 1.0 / c
    for k in range(w.shape[0]):
        act[k] = k
    lo = np.zeros((n, lanes))
    for k in range(w.shape[0]):
        row = w[k]
        for b in range(n):
            xk, yb, lb = x[b, k], y[b], lo[b]
            for m in range(lanes):
                p = xk * row[m]
                h = np.trunc(p * ic) * c
                yb[m] += h
                lb[m] += p - h
    for b in range(n):
        for m in range(lanes):
            if np.isfinite(y[b, m]) and np.isfinite(lo[b, m]):
                y[b, m] = round_f32(y[b, m], lo[b, m])
            else:
                y[b, m] = exact_dot(x[b], w, m, c, act, w.shape[0])


@njit(cache=True)
def products_over(x, n, w, dt, y, wnorm, wcols, tight, act, na, clo, chi):
    """y[b, m] = the contract's results for the rows b < n of x over the `support` (the lanes
    act[:na], the columns [clo, chi); every other element is +0; tight: every operand finite):
    the short path's float64 sums (emulator/mxm_short.py), settled for f16 (`settle`, whose bound
    holds for any order and grouping; its non-finite sums are the contract's) or exact already (i8)."""
    sums_over(x, n, w, y, wcols, tight, act, na, clo, chi)
    if dt != D_I8:
        settle(x, n, w, wnorm, y, clo, chi, act, na, True)


@njit(cache=True, fastmath={"reassoc"})
def sum_squares(v):
    """The sum of v[j]^2 in any order (vectorized): within a relative 2^-44 of the exact sum for
    the lanes of a machine (a bound of (len - 1) 2^-53), covered by `settle`'s margin."""
    s = 0.0
    for j in range(v.shape[0]):
        s += v[j] * v[j]
    return s


@njit(cache=True)
def smallest_bits(bits):
    """The bit pattern of the smallest nonzero magnitude among float64 values (their bits as
    int64; F64_INF if none): a minimum of integers, which vectorizes."""
    small = F64_INF
    for j in range(bits.shape[0]):
        v = bits[j] & F64_MAGNITUDE
        small = min(small, v if v != 0 else F64_INF)
    return small


@njit(cache=True)
def grain_of_bits(bits):
    """The grain of a normal float64 given by its bit pattern (every f16 value is normal in it): the
    largest power of two that every f16 value of its magnitude or more is a multiple of
    (emulator/mxm_install.py `norms`, for the weights)."""
    return 2.0 ** max(((bits >> 52) - 1023) - F16_FRACTION, F16_GRAIN)


@njit(cache=True)
def settle(x, n, w, wnorm, y, clo, chi, act, na, ieee):
    """Turn the float64 product y = x[:n] @ w (f16 operands: BLAS's, or the short path's sums) in
    the columns [clo, chi) into the contract's results (the other columns are exact zeros:
    `support`): keep round(y) where it is provably the rounding of the exact sum, recompute the
    rest exactly over the lanes act[:na] (`support`). Returns how many elements were recomputed.
    Three proofs (wnorm: the install's, mxm_install, wnorm[0] the column norms, wnorm[1] each norm over its
    column's grain):
    - exact: the products of x[b] and w[:, n] are multiples of g = grain(x[b]) grain(w[:, n]) (powers
      of two), and sum |p| <= |x[b]|_2 |w[:, n]|_2 (Cauchy-Schwarz); where that is at most 2^53 g,
      i.e. |x[b]|_2 (|w[:, n]|_2 / grain(w[:, n])) <= 2^53 grain(x[b]) (the quotients by powers of
      two are exact), every partial sum, in any order and grouping, is a multiple of g below
      2^53 g: exact, so y is the exact sum (ties and values on an f32 boundary included);
    - bounded: the error of any order's float64 sum of the na products is at most
      (na - 1) 2^-53 / (1 - na 2^-53) sum |p| <= e = na 2^-53 |x[b]|_2 |w[:, n]|_2; where
      f32(y - e) == f32(y + e), rounding being monotone, the exact sum rounds to that f32;
    - non-finite (ieee: y holds the short path's sums, `sums_over`, which take every product where
      an operand is not finite: `support`): a finite product is below 2^32, so the float64 sum of
      finite ones never overflows, and a non-finite y[b, n] has a non-finite product; IEEE
      additions in any order then give NaN where a product is NaN or both infinities occur, else
      that infinity: the contract's result. (An overflowed activation makes its whole row
      non-finite: gpt2_small_decode's layernorm variances, whose f16 squares overflow, where
      these were all the run's 11,840 recomputed elements, 5.5% of it. A BLAS product's
      non-finite elements are recomputed: a BLAS may skip a zero factor, and inf * 0 with it.)
    A row whose products are proved exact in every column at once (|x[b]|_2 r <= 2^53 grain(x[b])
    with r the largest wnorm[1] of the columns, so each column's own test holds too) is only
    rounded. Else, per row, one branch-free pass that vectorizes rounds the proved elements and
    marks the doubtful ones NaN; a second recomputes them only if there are any. (The quotients are
    the install's, made at its conversion, not divided here per call: a short batch's settling was ~1.1 us a
    call of 320 divisions and a scratch array, with ~0.07 us a row.)"""
    cs = split_scale(w.shape[0])
    c = na * 2.0 ** -MANTISSA
    redo = 0
    wn, wr = wnorm[0, clo:chi], wnorm[1, clo:chi]
    ratio = 0.0
    for m in range(chi - clo):
        ratio = max(ratio, wr[m])           # +inf for a non-finite column (mxm_install `norms`)
    xbits = x.view(np.int64)
    for b in range(n):
        xb = x[b]
        xn = np.sqrt(sum_squares(xb)) * (1.0 + 2.0 ** -30)    # an upper bound of |x|_2
        small = smallest_bits(xbits[b])
        xe = xn * c
        xg = 2.0 ** MANTISSA * (grain_of_bits(small) if small < F64_INF else 1.0)
        yb = y[b, clo:chi]
        if xn * ratio <= xg:
            for m in range(chi - clo):
                yb[m] = np.float64(np.float32(yb[m])) + 0.0
            continue
        nd = 0
        for m in range(chi - clo):      # a doubtful element is marked NaN (a proved one is finite)
            v = yb[m]
            e = xe * wn[m]
            r = np.float32(v)
            ok = ((((np.float32(v - e) == r) & (np.float32(v + e) == r)) | (xn * wr[m] <= xg)) & (
                abs(v) + e < np.inf)) | (ieee & (not abs(v) < np.inf))
            yb[m] = np.float64(r) + 0.0 if ok else np.nan
            nd += not ok
        if nd:
            for m in range(chi - clo):
                if yb[m] != yb[m]:
                    yb[m] = exact_dot(xb, w, clo + m, cs, act, na)
            redo += nd
    return redo


def blas_products(x, w, dt, wnorm, wcols):
    """The contract's results for every row of x, computed with one float64 BLAS product over
    the `support` by numpy (on the host, where the core cannot call numpy's BLAS: emulator/blas.py;
    w: float32 weights, taken as float64), settled (f16) or exact already (i8)."""
    n, kk = x.shape
    act = np.empty(kk, np.int64)
    na, lo, hi, _ = support(x, n, wcols, wnorm, act)
    y = np.zeros((n, w.shape[1]))
    if na and hi > lo:
        rows = act[:na]
        with np.errstate(invalid="ignore"):
            y[:, lo:hi] = x[:, rows] @ w[rows, lo:hi].astype(np.float64)
    if dt != D_I8:
        settle(x, n, w, wnorm, y, lo, hi, act, na, False)
    return y


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


@njit(cache=True)
def blas_over(fn, x, n, w, dt, y, wbuf, wnorm, act, na, lo, hi):
    """y[:n] = the contract's results for the rows b < n of x over the `support` (act[:na],
    [lo, hi)), by one float64 BLAS product in the core (fn: `blas.dgemm_address`; the weights
    w[act[:na], lo:hi] taken as float64 in wbuf), settled (f16) or exact already (i8)."""
    if not (na and hi > lo):
        y[:n] = 0.0
    else:       # (BLAS writes y[:n, lo:hi] whole, beta = 0: only the columns outside are zeroed here)
        y[:n, :lo] = 0.0
        y[:n, hi:] = 0.0
        ws = wbuf[:na, :hi - lo]
        for j in range(na):     # a row of wbuf itself, typed contiguous: the copy vectorizes (a row of
            row, dst = w[act[j], lo:hi], wbuf[j, :hi - lo]     # the view ws, of any layout, did not: 2x slower)
            for m in range(hi - lo):
                dst[m] = row[m]
        a = act[0]
        if act[na - 1] - a == na - 1:       # a run of lanes (all of them, a half ABC, heads): a view
            dgemm(fn, x[:n, a:a + na], ws, y[:n, lo:hi])
        else:
            xs = np.empty((n, na))
            for b in range(n):
                for j in range(na):
                    xs[b, j] = x[b, act[j]]
            dgemm(fn, xs, ws, y[:n, lo:hi])
    if dt != D_I8:
        settle(x, n, w, wnorm, y, lo, hi, act, na, False)


@njit(cache=True)
def flush(plane, lbuf, lrows, wts32, wnorm, wcols, wdt, pend_x, pend_meta, pend_n, ybuf, wbuf, act, acc_bits, bulk,
          hz):
    """Multiply out the plane's pending ABCs and apply them to its accumulators. An install not
    converted yet (wdt[2, plane] != 0: mxm_install.install_lazily) multiplies its first
    DIRECT_ROWS rows of f16 ABCs, untransposed and finite, straight from the buffer's bytes
    (`direct`, on machines of DIRECT_MIN_LANES lanes or more); anything else converts it first
    (mxm_install.materialize). bulk = (work,
    dgemm): a batch of at least `work` multiply-adds (rows times its `support`: a half ABC has
    half the lanes) is one BLAS product (the same bits: docs/accumulation.md), here with the
    BLAS at address `dgemm` (`blas.dgemm_address`; wbuf: float64 scratch [lanes, lanes] for the
    weights), or, where that is 0, by the host (False,
    hz = H_FLUSH, plane: run.py `_bulk`, then the run resumes at the same instruction). Smaller
    batches: in lane order and settled, or (work == 0) the exact row path."""
    n = pend_n[plane]
    if n == 0:
        return True
    x = pend_x[plane]
    if not (wdt[2, plane] != 0 and wdt[3, plane] + n <= DIRECT_ROWS and wdt[1, plane] == 2 * D_F16 and bulk[0] != 0
            and wbuf.shape[1] >= DIRECT_MIN_LANES
            and direct(plane, x, n, lbuf, lrows, wts32, wnorm, wcols, wdt, ybuf, wbuf, act)):
        materialize(plane, lbuf, lrows, wts32, wnorm, wcols, wdt)
        if bulk[0] == 0:
            products(x, n, wts32[plane], wdt[0, plane], ybuf, True, wnorm[plane], wcols[plane], act)
        else:
            na, lo, hi, finite = support(x, n, wcols[plane], wnorm[plane], act)
            if n * na * (hi - lo) < bulk[0]:
                products_over(x, n, wts32[plane], wdt[0, plane], ybuf, wnorm[plane], wcols[plane], finite, act, na,
                              lo, hi)
            elif bulk[1] != 0:
                blas_over(bulk[1], x, n, wts32[plane], wdt[0, plane], ybuf, wbuf, wnorm[plane], act, na, lo, hi)
            else:
                hz[0], hz[3] = H_FLUSH, plane
                return False
    accumulate(acc_bits[plane], pend_meta[plane], n, ybuf)
    pend_n[plane] = 0
    return True


@njit(cache=True)
def direct(plane, x, n, lbuf, lrows, wts32, wnorm, wcols, wdt, y, wbuf, act):
    """y[:n] = the contract's results for the rows b < n of x (f16) from the installed buffer's bytes
    (emulator/mxm_direct.py: the float64 sums, rounded where `exact_rows` proves a row exact, else
    settled by the sums of the products' magnitudes, wbuf[b]; wbuf's rows n.. are its scratch);
    the elements it cannot prove are recomputed exactly (`exact_dot`) from the weights, converted
    then (mxm_install.materialize). False (nothing done) where an operand is not finite."""
    na, big = active_lanes(x, n, act)
    if big >= F64_INF or not installed_finite(lrows[plane]):
        return False
    lanes = wts32.shape[1]
    wf = wbuf[n:n + 4].view(np.float32).reshape(8, lanes)
    small, large, ints = sums(x, n, lbuf[plane], lrows[plane], act, na, y, wf, wbuf[n + 4])
    g, top = weight_bounds(small, large, ints)
    for b in range(n):
        yb = y[b]
        if exact_rows(x[b], act, na, top, g):
            for m in range(lanes):
                yb[m] = np.float64(np.float32(yb[m])) + 0.0
            continue
        magnitudes(x[b], lbuf[plane], lrows[plane], act, na, wbuf[b], wf[0])
        xs = smallest_bits(x[b].view(np.int64))
        if settle_sums(yb, wbuf[b], na, g * (grain_of_bits(xs) if xs < F64_INF else 1.0)):
            materialize(plane, lbuf, lrows, wts32, wnorm, wcols, wdt)
            for m in range(lanes):
                if yb[m] != yb[m]:
                    yb[m] = exact_dot(x[b], wts32[plane], m, split_scale(lanes), act, na)
    wdt[3, plane] += n
    return True
