"""Short batches multiplied straight from the weight buffer's bytes (emulator/mxm.py `flush`), for an
install not converted yet: an IW only makes the rows it loaded the installed ones
(emulator/mxm_install.py `install_lazily`), and the float32 weights with their column norms and
row spans are made when a batch needs them (`mxm_install.materialize`). A decode step's install
serves one or two ABC rows (gpt2_small_decode 12 layers: 1,842 ABCs for 1,382 IWs), for which
converting and counting the whole 320 x 320 buffer cost several times the products themselves.

Here each f16 weight of the batch's lanes (`active_lanes`: where some activation is nonzero) is
converted to float32 for eight lanes at a time and multiplied in float64 over every column (no
row spans: an element whose products are all exact zeros sums to +0: `sums`). A row is settled
at once where |x|_1 times the weights' largest magnitude proves its sums exact (`exact_rows`),
else by the sums of its products' magnitudes (`magnitudes`, `settle_sums`: docs/accumulation.md,
"exact" and "bounded" with sum |p| itself instead of Cauchy-Schwarz). Every operand is finite here
(the caller checks the buffer's rows, mxm_install.lw_exec's kinds, and `active_lanes` the
activations), so a product is exact and below 2^32 and no sum overflows.
"""
import numpy as np
from numba import njit

from lpu.emulator.arith import f16_finite
from lpu.emulator.mxm_install import ROW_INTEGERS

F64_INF = 0x7FF0000000000000            # the bits of +inf, and the mask of a float64's magnitude
F64_MAGNITUDE = 0x7FFFFFFFFFFFFFFF
DIRECT_ROWS = 2    # ABC rows an install multiplies from its bytes; a batch past them converts it
DIRECT_MIN_LANES = 8   # machines with fewer lanes convert: `mxm.direct`'s scratch (wbuf's rows n..n+4, eight
                       # lanes' activations in one row) needs eight


@njit(cache=True)
def active_lanes(x, n, act):
    """act[:na] = the lanes k where some x[b, k] (b < n) is nonzero; returns na and the largest
    magnitude's bits (>= F64_INF: a non-finite value). (Integer passes over the magnitude bits, which
    vectorize: an OR per lane, then the nonzero lanes gathered in act itself.)"""
    kk = x.shape[1]
    xbits = x.view(np.int64)
    big = 0
    for k in range(kk):
        act[k] = 0
    for b in range(n):
        row = xbits[b]
        for k in range(kk):
            v = row[k] & F64_MAGNITUDE
            act[k] |= v
            big = max(big, v)
    na = 0
    for k in range(kk):       # act[na] = k overwrites only entries already read (na <= k)
        if act[k] != 0:
            act[na] = k
            na += 1
    return na, big


@njit(cache=True)
def sums(x, n, buf, rows, act, na, y, wf, xs):
    """y[b, m] = the float64 sum of x[b, k] w[k, m] over the lanes act[:na], for the rows b < n,
    with w[k] the f16 bytes buf[k, rows[k, 0]] (the installed side of each row: mxm_install),
    finite. Eight weight rows at a time are converted to float32 into wf [8, lanes] (in the L1
    cache; xs: float64 scratch [8]), then multiplied into each row's sums (`pass8`): a loop over
    the sixteen byte rows converting where they are used, 15 us for 1 x 320 x 320, did not
    vectorize as well as the two loops, 12.5 (with the magnitudes' sums, since left to
    `magnitudes`). Returns, for `weight_bounds`, the f16 magnitude bits of the rows that are not
    i8 values (mxm_install.lw_exec's ROW_INTEGERS): their smallest nonzero one minus one (0xFFFF:
    none) and their largest (unsigned minimum and maximum in the loop that converts: 8 us for 320 x
    320 where a plain conversion takes 5), and whether rows of i8 values were converted."""
    lanes = y.shape[1]
    for b in range(n):
        for m in range(lanes):
            y[b, m] = 0.0
    small, big, ints = np.uint16(0xFFFF), np.uint16(0), False
    for j in range(0, na, 8):
        g = min(8, na - j)
        for i in range(8):
            d = wf[i]
            if i < g:
                k = act[j + i]
                src = buf[k, rows[k, 0]]
                lo, hi = src[0], src[1]
                if rows[k, 1 + rows[k, 0]] == ROW_INTEGERS:
                    ints = True
                    for m in range(lanes):
                        d[m] = f16_finite(lo[m], hi[m])
                else:
                    for m in range(lanes):
                        d[m] = f16_finite(lo[m], hi[m])
                        v = np.uint16((np.uint16(hi[m] & 0x7F) << np.uint16(8)) | np.uint16(lo[m]))
                        small = min(small, np.uint16(v - np.uint16(1)))     # (zero wraps to 0xFFFF)
                        big = max(big, v)
            else:
                for m in range(lanes):
                    d[m] = 0.0
        for b in range(n):
            for i in range(8):
                xs[i] = x[b, act[j + i]] if i < g else 0.0
            pass8(xs, wf, y[b])
    return small, big, ints


@njit(cache=True, fastmath={"contract"})
def pass8(xs, wf, y):
    """y += xs[i] wf[i] over the eight rows of wf (a chain of fused multiply-adds a column: every
    product is exact in float64)."""
    x0, x1, x2, x3, x4, x5, x6, x7 = xs[0], xs[1], xs[2], xs[3], xs[4], xs[5], xs[6], xs[7]
    r0, r1, r2, r3, r4, r5, r6, r7 = wf[0], wf[1], wf[2], wf[3], wf[4], wf[5], wf[6], wf[7]
    for m in range(y.shape[0]):
        w0, w1, w2, w3 = np.float64(r0[m]), np.float64(r1[m]), np.float64(r2[m]), np.float64(r3[m])
        w4, w5, w6, w7 = np.float64(r4[m]), np.float64(r5[m]), np.float64(r6[m]), np.float64(r7[m])
        y[m] = x7 * w7 + (x6 * w6 + (x5 * w5 + (x4 * w4 + (x3 * w3 + (x2 * w2 + (x1 * w1 + (x0 * w0 + y[m])))))))


@njit(cache=True)
def weight_bounds(small, big, ints):
    """From `sums`' returns: a power of two that every weight it converted is a multiple of (the
    grain of the smallest nonzero f16 magnitude, the largest power of two that every f16 value of
    that magnitude or more is a multiple of, 2^(max(exponent field, 1) - 25); at most 1 with i8
    values among them), and a power of two above every weight's magnitude (2^(exponent field - 14);
    128 for i8 values)."""
    g = 2.0 ** (max((np.int64(small) + 1) >> 10, 1) - 25) if small != 0xFFFF else 2.0 ** 16
    top = 2.0 ** (max(np.int64(big) >> 10, 1) - 14) if big != 0 else 0.0
    return (min(g, 1.0), max(top, 128.0)) if ints else (g, top)


@njit(cache=True)
def magnitudes(x, buf, rows, act, na, s, wf):
    """s[m] = the float64 sum of |x[k] w[k, m]| over the lanes act[:na] (w as in `sums`; wf: float32
    scratch [lanes]), for the rows `direct_exact` cannot prove at once."""
    for m in range(s.shape[0]):
        s[m] = 0.0
    for j in range(na):
        k = act[j]
        src = buf[k, rows[k, 0]]
        lo, hi, a = src[0], src[1], abs(x[k])
        for m in range(s.shape[0]):
            wf[m] = f16_finite(lo[m], hi[m])
        for m in range(s.shape[0]):
            s[m] += a * abs(np.float64(wf[m]))


@njit(cache=True)
def exact_rows(x, act, na, top, g):
    """Whether every float64 sum of products of the row x over the lanes act[:na] and weights of
    magnitude below top that are multiples of g is exact: sum |p| <= |x|_1 top, and every product
    is a multiple of g grain(x) (the grain of x's smallest nonzero magnitude); where |x|_1 top is at
    most 2^53 times that, every partial sum, in any order, is a multiple of it below 2^53 times it
    (docs/accumulation.md, "exact"; |x|_1 summed in float64 is within 2^-44 of its value)."""
    x1, small = 0.0, F64_INF
    xbits = x.view(np.int64)
    for j in range(na):
        x1 += abs(x[act[j]])
        v = xbits[act[j]] & F64_MAGNITUDE
        small = min(small, v if v != 0 else F64_INF)
    if small == F64_INF:
        return True
    xg = 2.0 ** max(((small >> 52) - 1023) - 10, -24)
    return x1 * top * (1.0 + 2.0 ** -40) <= 2.0 ** 53 * (g * xg)


@njit(cache=True)
def settle_sums(y, s, na, g):
    """Round the float64 sums y of na exact products (s: the float64 sums of their magnitudes) to
    f32 where that is provably the rounding of the exact sum; mark the others NaN. Returns how
    many are marked. Two proofs (docs/accumulation.md), with s instead of Cauchy-Schwarz's bound:
    - exact: every product is a multiple of the power of two g (the grains of the row's and of the
    weights' smallest nonzero magnitudes) and s is at least sum |p| (1 - (na - 1) 2^-53) (its own
    sum's error); where s (1 + 2^-40) <= 2^53 g, every partial sum, in any order, is a multiple of
    g below 2^53 g: exact, and so is y (ties included);
    - bounded: the error of any order's float64 sum of na products is at most
    (na - 1) 2^-53 / (1 - na 2^-53) sum |p| (docs/accumulation.md, "bounded"), and s is at least
    sum |p| (1 - (na - 1) 2^-53) (its own sum's error): e = (na + 2) 2^-53 s (1 + 2^-40) exceeds the
    error by more than 2 2^-53 s, more than the float64 roundings of y - e and y + e (at most
    2^-53 |y +- e|, |y| <= s (1 + na 2^-53)), so the exact sum lies between them as rounded, and
    where both round to the same f32, rounding being monotone, so does the exact sum.
    (Exact sums are common: decode's i8 weights are integers, whose sums land on f32 ties; the
    bound alone left 34,657 elements of gpt2_small_decode 12 layers to recompute.)"""
    c = (na + 2) * 2.0 ** -53 * (1.0 + 2.0 ** -40)
    lim = 2.0 ** 53 * g / (1.0 + 2.0 ** -40)
    nd = 0
    for m in range(y.shape[0]):      # a loop that vectorizes (branch-free)
        v = y[m]
        e = c * s[m]
        r = np.float32(v)
        ok = ((np.float32(v - e) == r) & (np.float32(v + e) == r)) | (s[m] <= lim)
        y[m] = np.float64(r) + 0.0 if ok else np.nan
        nd += not ok
    return nd
