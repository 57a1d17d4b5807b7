"""The MXM accumulation contract (docs/accumulation.md): every ABC result is the exact sum of the
exact products rounded once to f32 (f16) or the exact integer (i8). A plain Python reference
(integers in units of 2^-48, rounded to f32 by hand) checks both ways the emulator computes it:
the row path (`mxm.products`, in the core) and the bulk path (`mxm.blas_products`: float64
BLAS, settled by an error bound, the doubtful elements recomputed); whole bundled programs give
the same bits both ways."""
import math
import os

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from lpu.api import inputs_for
from lpu.compiler.driver import compile_file
from lpu.emulator import blas, mxm, mxm_install, mxm_short
from lpu.emulator.arith import D_F16, D_I8
from lpu.emulator.run import run

PROGRAMS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "programs")


# ---- the reference ------------------------------------------------------------------------------
def _round_f32(n: int) -> float:
    """n units of 2^-48 rounded to the nearest f32 (ties to even); never subnormal or too big."""
    a = abs(n)
    shift = a.bit_length() - 24
    if shift > 0:
        q, r = divmod(a, 1 << shift)
        half = 1 << (shift - 1)
        if r > half or (r == half and q & 1):
            q += 1
        a = q << shift
    return math.copysign(math.ldexp(a, -48), n) if a else 0.0


def reference(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    out = np.zeros((x.shape[0], w.shape[1]), np.float32)
    for b in range(x.shape[0]):
        for m in range(w.shape[1]):
            ps = [float(x[b, k]) * float(w[k, m]) for k in range(w.shape[0])]
            if not all(math.isfinite(p) for p in ps):
                bad = any(math.isnan(p) for p in ps) or (math.inf in ps and -math.inf in ps)
                out[b, m] = math.nan if bad else math.copysign(math.inf, sum(p for p in ps if math.isinf(p)))
                continue
            n = sum(int(x[b, k] * 2.0**24) * int(w[k, m] * 2.0**24) for k in range(w.shape[0]))
            out[b, m] = _round_f32(n)
    return out


def _bits(y) -> np.ndarray:
    """f32 bit patterns, every NaN alike (the contract leaves a NaN's sign and payload open)."""
    y = np.asarray(y, np.float32)
    bits = y.view(np.uint32).copy()
    bits[np.isnan(y)] = 0x7FC00000
    return bits


def _stats(w):
    """The column norms and the row support of the weights w as an IW makes them (f16 or i8 values)."""
    norms, wcols = np.zeros((2, w.shape[1])), np.zeros((w.shape[0], 2), np.int64)
    mxm_install.weight_stats(np.ascontiguousarray(w, np.float32), norms, wcols)
    return norms, wcols


def _support(w):
    return _stats(w)[1], np.zeros(w.shape[0], np.int64)


def in_core_blas(x, w, dt, norms, wcols):
    """The bulk path as the core takes it (mxm.blas_over: numpy's BLAS called from the jitted
    code), or the host's (mxm.blas_products) where numpy's BLAS is not one the core can call."""
    if not blas.dgemm_address():
        return mxm.blas_products(x, w, dt, norms, wcols)
    n, act = x.shape[0], np.zeros(w.shape[0], np.int64)
    na, lo, hi, _ = mxm.support(x, n, wcols, norms, act)
    y = np.full((n + 1, w.shape[1]), np.nan)        # a larger buffer, as the core's: rows past n untouched
    wbuf = np.full(w.shape, np.nan)
    mxm.blas_over(blas.dgemm_address(), x, n, w, dt, y, wbuf, norms, act, na, lo, hi)
    assert np.isnan(y[n]).all()
    return y[:n]


def both_paths(x, w):
    """The row path (every lane and column), the short path and the bulk paths (each over the
    support: the lanes where x is nonzero, the columns where those weight rows are)."""
    n = x.shape[0]
    w32 = w.astype(np.float32)      # the core's weights: f32
    norms = _stats(w32)[0]
    wcols, act = _support(w)
    row, short = np.zeros((n, w.shape[1])), np.zeros((n, w.shape[1]))
    mxm.products(x, n, w, D_F16, row, True, norms, wcols, act)
    mxm.products(x, n, w32, D_F16, short, False, norms, wcols, act)
    assert np.array_equal(_bits(short), _bits(row))
    bulk = mxm.blas_products(x, w32, D_F16, norms, wcols)
    assert np.array_equal(_bits(in_core_blas(x, w32, D_F16, norms, wcols)), _bits(bulk))
    return row, bulk


def assert_contract(x, w):
    want = _bits(reference(x, w))
    row, bulk = both_paths(x, w)
    assert np.array_equal(_bits(row), want)
    assert np.array_equal(_bits(bulk), want)
    assert np.array_equal(row.astype(np.float32).astype(np.float64), row, equal_nan=True)   # f32 values


# ---- random operands with extreme exponents and cancellation --------------------------------------
def _f16(exps, mant, sign):
    return (sign * mant * np.exp2(exps)).astype(np.float16).astype(np.float64)


@st.composite
def operands(draw):
    """f16 activations [n, k] and weights [k, m], exponents over the whole f16 range or in a
    band, products that cancel exactly, zeros, and (sometimes) a few huge and tiny values."""
    n, k, m = draw(st.integers(1, 6)), draw(st.sampled_from([8, 16, 32, 320])), 8
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    lo, hi = draw(st.sampled_from([(-24, 15), (-6, 4), (-2, 2), (0, 0)]))
    x = _f16(rng.integers(lo, hi + 1, (n, k)), rng.integers(1, 2048, (n, k)) / 1024, rng.choice([-1, 1], (n, k)))
    w = _f16(rng.integers(lo, hi + 1, (k, m)), rng.integers(1, 2048, (k, m)) / 1024, rng.choice([-1, 1], (k, m)))
    half = k // 2
    if draw(st.booleans()):          # x[:, half:] * w[half:] cancels x[:, :half] * w[:half] exactly
        x[:, half:2 * half] = x[:, :half]
        w[half:2 * half] = -w[:half]
        if draw(st.booleans()):      # ... but for one tiny product, far below the big ones
            x[:, 0], w[0] = 2.0**-24, 2.0**-20
    x[rng.random((n, k)) < 0.1] = 0.0
    if draw(st.booleans()):          # zero lanes, weight rows and columns (as attention's short heads)
        x[:, rng.random(k) < 0.5] = 0.0
        w[rng.random(k) < 0.3] = 0.0
        w[:, rng.random(m) < 0.4] = 0.0
    bad = draw(st.sampled_from([None, None, None, np.inf, -np.inf, np.nan]))
    if bad is not None:              # a non-finite operand (an overflowed activation, a weight)
        v = x if draw(st.booleans()) else w
        v[tuple(rng.integers(0, s) for s in v.shape)] = bad
    return x, w


@given(operands())
def test_row_and_bulk_paths_give_the_exact_sum_rounded_once(ops):
    assert_contract(*ops)


def test_adversarial_sums():
    k = 8
    x = np.zeros((6, k))
    w = np.ones((k, 2))
    w[2, 0] = 2.0**-20                                # x[:, 2] * w[2, 0]: +-2^-40
    w[[0, 1, 3], 1] = [2.0**15, 2.0**-24, 2.0**15]    # row 3, column 1: 2^30 + 2^-48 - 2^30
    x[0, :3] = [1.0, 2.0**-24, 0.0]                  # exactly halfway between two f32: to even (1.0)
    x[1, :3] = [1.0, 2.0**-24, 2.0**-20]             # just above halfway: up
    x[2, :3] = [1.0, 2.0**-24, -2.0**-20]            # just below: down
    x[3, :4] = [2.0**15, 2.0**-24, 0.0, -2.0**15]    # a tiny sum under cancelling big ones
    x[4, :5] = [2.0**15, 1.0, 0.0, -2.0**15, -1.0]   # exactly zero (+0)
    x[5, :4] = [1.0 + 2.0**-10, 2.0**-14, 0.0, -1.0]
    assert np.array_equal(x.astype(np.float16).astype(np.float64), x) and np.array_equal(w.astype(np.float16), w)
    assert_contract(x, w)
    row, _ = both_paths(x, w)
    assert row[0, 0] == 1.0 and row[1, 0] == np.nextafter(np.float32(1), np.float32(2))
    assert row[2, 0] == 1.0 and row[3, 0] == 2.0**-24 and np.signbit(row[4, 0]) == 0
    # the old contract's in-lane-order float64 sum loses the tiny term of row 3, column 1
    assert row[3, 1] == 2.0**-48 and (2.0**30 + 2.0**-48) - 2.0**30 == 0.0


def test_non_finite_products():
    x = np.array([[np.inf, 1.0, 0.0], [np.inf, -np.inf, 0.0], [np.inf, 0.0, 0.0], [np.nan, 1.0, 0.0],
                  [-np.inf, 1.0, 65504.0]])
    w = np.array([[1.0, 0.0], [1.0, 1.0], [65504.0, 1.0]])
    assert_contract(x, w)



def test_block_diagonal_weights_skip_only_exact_zeros():
    """Packed heads: the short path adds a group of lanes over its rows' nonzero columns only,
    unless an operand is not finite (inf * 0 is NaN in the columns it would skip)."""
    rng = np.random.default_rng(5)
    k = 64
    w = np.zeros((k, k))
    for h in range(4):
        w[16 * h:16 * h + 16, 16 * h:16 * h + 16] = _f16(rng.integers(-6, 4, (16, 16)), rng.integers(1, 2048, (16, 16)) / 1024,
                                                           rng.choice([-1, 1], (16, 16)))
    x = _f16(rng.integers(-6, 4, (5, k)), rng.integers(1, 2048, (5, k)) / 1024, rng.choice([-1, 1], (5, k)))
    x[:, 3:13] = 0.0                     # a group of four lanes with some rows zero, others not
    assert_contract(x, w)
    x[2, 20] = np.inf
    row, _ = both_paths(x, w)
    assert np.isnan(row[2, 0]) and np.isinf(row[2, 16]) and not np.isnan(row[1]).any()

def _settled(x, w):
    """settle's results for x @ w (in float64) and how many elements it recomputed; the
    results checked against the row path's exact sums."""
    norms, (wcols, act) = _stats(w)[0], _support(w)
    y, want = x @ w, np.zeros((x.shape[0], w.shape[1]))
    redo = mxm.settle(x, x.shape[0], w, norms, y, 0, w.shape[1], np.arange(w.shape[0]), w.shape[0], False)
    mxm.products(x, x.shape[0], w, D_F16, want, True, norms, wcols, act)
    assert np.array_equal(_bits(y), _bits(want))
    return redo


def test_settle_recomputes_only_what_it_cannot_prove():
    rng = np.random.default_rng(3)
    x = rng.standard_normal((16, 320)).astype(np.float16).astype(np.float64)
    w = rng.standard_normal((320, 320)).astype(np.float16).astype(np.float64)
    # typical data: every float64 sum is exact (grains and norms), ties and f32 boundaries included
    assert _settled(x, w / 16) == 0
    # a subnormal in every row and column: no exactness proof, the error bound keeps > 99%
    x[:, 0], w[0] = 2.0**-24, 2.0**-24
    assert 0 < _settled(x, w) < 0.01 * x.shape[0] * w.shape[1]
    # ... and halves that cancel exactly: every sum is zero, within the bound of every rounding
    x[:, 160:], w[160:] = x[:, :160], -w[:160]
    assert _settled(x, w) == x.shape[0] * w.shape[1]


def test_short_path_keeps_its_non_finite_sums():
    """The short path's float64 sums take every product (a non-finite operand: every lane and
    column), and a finite product cannot overflow them, so a non-finite sum is the IEEE sum of
    them all in some order: the contract's NaN or infinity. settle keeps it (ieee) rather than
    recomputing it (an overflowed activation makes its whole row non-finite); a BLAS product's
    is recomputed."""
    rng = np.random.default_rng(7)
    k = 320
    x = _f16(rng.integers(-6, 4, (4, k)), rng.integers(1, 2048, (4, k)) / 1024, rng.choice([-1, 1], (4, k)))
    w = _f16(rng.integers(-6, 4, (k, k)), rng.integers(1, 2048, (k, k)) / 1024, rng.choice([-1, 1], (k, k)))
    x[0, 7], x[1, 9], x[1, 10], x[2, 11], w[5, 3] = np.inf, np.inf, -np.inf, np.nan, np.inf
    x[3, 5], w[7:, 4] = 0.0, 0.0         # row 3: inf * 0 in column 3 only; column 4: few nonzero weights
    w32, want = w.astype(np.float32), _bits(reference(x, w))
    (norms, wcols), act = _stats(w32), np.zeros(k, np.int64)
    for ieee in (True, False):
        na, lo, hi, tight = mxm.support(x, 4, wcols, norms, act)
        assert (na, lo, hi, tight) == (k, 0, k, False)
        y = np.zeros((4, k))
        mxm_short.sums_over(x, 4, w32, y, wcols, tight, act, na, lo, hi)
        redo = mxm.settle(x, 4, w32, norms, y, lo, hi, act, na, ieee)
        assert np.array_equal(_bits(y), want)
        assert redo == (0 if ieee else 3 * k + 1)


def test_i8_products_are_exact_integers():
    rng = np.random.default_rng(4)
    x = rng.integers(-128, 128, (5, 320)).astype(np.float64)
    w = rng.integers(-128, 128, (320, 320)).astype(np.float64)
    x[:, 100:] = 0
    w[:, 200:] = 0
    wcols, act = _support(w)
    want = x.astype(np.int64) @ w.astype(np.int64)
    for exact in (True, False):
        y = np.zeros((5, 320))
        mxm.products(x, 5, w, D_I8, y, exact, np.zeros((2, 320)), wcols, act)
        assert np.array_equal(y, want)
    w32 = w.astype(np.float32)
    assert np.array_equal(mxm.blas_products(x, w32, D_I8, np.zeros((2, 320)), wcols), want)
    assert np.array_equal(in_core_blas(x, w32, D_I8, np.zeros((2, 320)), wcols), want)


def test_flush_sends_a_batch_to_blas_by_its_work_not_its_length():
    """A batch of half ABCs (K <= lanes/2) stays on the core's short path where as many full ABCs
    go to BLAS: the choice counts multiply-adds over the support, so half ABCs, cut into shorter
    batches by their ACCs, never pay for a BLAS call for half the work. BLAS runs in the core
    where numpy's can be called from it (`blas.dgemm_address`), else the host is asked (H_FLUSH,
    the batch left pending); every way, the contract's bits."""
    from lpu.emulator import core
    lanes, n = 320, 4
    rng = np.random.default_rng(5)
    w = (rng.standard_normal((lanes, lanes)) * 0.1).astype(np.float16).astype(np.float32)
    wnorm, wcols = _stats(w)
    fn = blas.dgemm_address()
    for half, dgemm, handed in ((True, fn, False), (True, 0, False), (False, fn, fn == 0), (False, 0, True)):
        x = rng.standard_normal((core.ABC_BATCH, lanes)).astype(np.float16).astype(np.float64)
        if half:
            x[:, lanes // 2:] = 0.0
        pend_x, pend_meta = x[None].copy(), np.zeros((1, core.ABC_BATCH, 3), np.int64)
        pend_meta[0, :n, 0], pend_meta[0, :n, 2] = np.arange(n), D_F16
        pend_n, hz = np.array([n]), np.zeros(8, np.int64)
        acc = np.zeros((1, 8, lanes), np.uint32)
        lbuf, lrows, wdt = np.zeros((1, lanes, 2, 2, lanes), np.uint8), np.zeros((1, lanes, 3), np.int64), \
            np.array([[D_F16], [2 * D_F16], [0], [0]])       # installed and converted (mxm_install.materialize)
        ok = mxm.flush(0, lbuf, lrows, w[None], wnorm[None], wcols[None], wdt, pend_x, pend_meta, pend_n,
                        np.zeros((core.ABC_BATCH, lanes)), np.zeros((lanes, lanes)), np.zeros(lanes, np.int64),
                        acc, np.array([n * lanes * lanes, dgemm]), hz)
        assert ok != handed and (hz[0] == core.H_FLUSH) == handed
        assert pend_n[0] == (n if handed else 0)
        if not handed:
            assert np.array_equal(_bits(acc[0, :n].view(np.float32)), _bits(reference(x[:n], w)))


def _flush_lazily(x, w16, converted, seed=0):
    """mxm.flush of the f16 batch x (rows <= core.ABC_BATCH) against the weights w16 installed
    lazily (mxm_install.install_lazily: bytes in the buffer, each row on a random side, with its
    LW's kind: f16, non-finite, integers), converted first (`converted`: mxm_install.materialize) or not (then a
    short finite batch is multiplied from the bytes: mxm_direct). Returns the accumulator rows'
    f32 bits, how many ABC rows were multiplied from the bytes and whether the install is converted."""
    from lpu.emulator import core
    lanes, n = w16.shape[1], x.shape[0]
    bits = w16.view(np.uint16)
    side = np.random.default_rng(seed).integers(0, 2, lanes)
    lbuf, lrows = np.zeros((1, lanes, 2, 2, lanes), np.uint8), np.zeros((1, lanes, 3), np.int64)
    for k in range(lanes):
        lbuf[0, k, side[k], 0], lbuf[0, k, side[k], 1] = bits[k] & 0xFF, bits[k] >> 8
        lbuf[0, k, 1 - side[k]] = 0xFF       # the other side: an LW's next row, not installed (NaNs)
        kind = (mxm_install.ROW_NON_FINITE if not np.isfinite(w16[k]).all() else mxm_install.ROW_INTEGERS
                if (w16[k] == np.round(w16[k])).all() else mxm_install.ROW_F16)
        lrows[0, k, 0], lrows[0, k, 1 + side[k]], lrows[0, k, 2 - side[k]] = side[k], kind, mxm_install.ROW_NON_FINITE
    wts32, wnorm, wcols = np.zeros((1, lanes, lanes), np.float32), np.zeros((1, 2, lanes)), np.zeros((1, lanes, 2), np.int64)
    wdt = np.array([[D_F16], [2 * D_F16], [lanes], [0]])
    if converted:
        mxm_install.materialize(0, lbuf, lrows, wts32, wnorm, wcols, wdt)
    pend_x, pend_meta = np.zeros((1, core.ABC_BATCH, lanes)), np.zeros((1, core.ABC_BATCH, 3), np.int64)
    pend_x[0, :n] = x
    pend_meta[0, :n, 0], pend_meta[0, :n, 2] = np.arange(n), D_F16
    acc = np.zeros((1, n, lanes), np.uint32)
    assert mxm.flush(0, lbuf, lrows, wts32, wnorm, wcols, wdt, pend_x, pend_meta, np.array([n]),
                     np.zeros((core.ABC_BATCH, lanes)), np.zeros((lanes, lanes)), np.zeros(lanes, np.int64), acc,
                     np.array([1 << 24, 0]), np.zeros(8, np.int64))
    return acc[0], int(wdt[3, 0]), wdt[2, 0] == 0


def test_products_from_the_weight_buffer_equal_the_installed_ones():
    """A short batch multiplied straight from the f16 bytes of a lazily installed buffer
    (mxm_direct, settled by the sums of its products' magnitudes, its doubtful elements recomputed
    from the weights converted then) gives the bits of the converted install's path and the
    reference's: random operands, zeros (rows, lanes, a batch of zeros), subnormals, half ABCs,
    integer weights (their sums on f32 ties: the exact proof) alone and beside f16 rows,
    exponents over the whole f16 range, exactly cancelling halves; a non-finite activation or
    weight (in a lane no activation uses too), or a batch of more than DIRECT_ROWS rows, converts
    the install instead."""
    from lpu.emulator.mxm_direct import DIRECT_ROWS
    rng = np.random.default_rng(11)

    def f16(a):
        return np.asarray(a, np.float16)

    cases = []
    for lanes, n in ((64, 1), (64, 2), (320, 1), (72, 2)):
        w, x = f16(rng.standard_normal((lanes, lanes)) * 0.1), f16(rng.standard_normal((n, lanes)))
        cases.append((x, w, True))
        ws, xs = w.copy(), x.copy()
        ws[3], ws[:, 5], ws[7, 9], xs[:, 11] = 0, 0, 2.0 ** -24, 2.0 ** -24      # zeros, subnormals
        xs[:, 13:19] = 0                                                         # lanes left out
        cases.append((xs, ws, True))
        xh = x.copy()
        xh[:, lanes // 2:] = 0                                                   # half ABCs
        cases.append((xh, w, True))
        cases.append((np.zeros_like(x), w, True))
        wide = f16(rng.standard_normal((lanes, lanes)) * 2.0 ** rng.integers(-24, 13, (lanes, lanes)))
        cases.append((f16(rng.standard_normal((n, lanes)) * 2.0 ** rng.integers(-24, 13, (n, lanes))), wide, True))
        half = lanes // 2                                                        # exact cancellation
        wc = w.copy()
        wc[half:2 * half] = w[:half]
        xc = x.copy()
        xc[:, half:2 * half] = -x[:, :half]
        cases.append((xc, wc, True))
        wint = f16(rng.integers(-128, 128, (lanes, lanes)))                     # i8 weights (LW's cvt)
        wint[::3] = w[::3]                                                       # beside f16 rows
        cases += [(x, f16(rng.integers(-128, 128, (lanes, lanes))), True), (x, wint, True)]
        xi, wn, wi = x.copy(), w.copy(), w.copy()
        xi[0, 2] = np.inf
        wn[1, 4] = np.nan
        wi[0, 6] = -np.inf
        xz = x.copy()
        xz[:, 0] = 0                              # the infinity's lane unused: inf * 0 still NaN
        cases += [(xi, w, False), (x, wn, False), (xz, wi, False)]
    cases.append((f16(rng.standard_normal((DIRECT_ROWS + 1, 64))), f16(rng.standard_normal((64, 64))), False))
    xt, wt = np.zeros((1, 64), np.float16), f16(rng.standard_normal((64, 64)))    # 2^25 + 2 + 2^-34: neither proof
    xt[0, :3], wt[:3, 0] = (2.0 ** 10, 2.0 ** -24, 2.0), (2.0 ** 15, 2.0 ** -10, 1.0)   # holds (a float64 tie)
    cases.append((xt, wt, True))
    redone = 0
    for i, (x, w, direct) in enumerate(cases):
        lazy, rows, after = _flush_lazily(x.astype(np.float64), w, False, i)
        converted, none, _ = _flush_lazily(x.astype(np.float64), w, True, i)
        assert np.array_equal(lazy, converted), i
        assert (rows == x.shape[0]) == direct and none == 0, i
        assert np.array_equal(_bits(lazy.view(np.float32)), _bits(reference(x.astype(float), w.astype(float)))), i
        redone += direct and after        # a doubtful element recomputed from the weights converted then
    assert redone


def test_install_converts_a_buffer_as_the_separate_passes():
    """IW's conversion (mxm_install.install): the weights as float32, transposed or not, with the
    column norms and row support of the whole matrix (`weight_stats`), for f16 (zero rows and
    columns, a subnormal, an infinity, a NaN) and i8."""
    rng = np.random.default_rng(6)
    lanes = 64
    v = (rng.standard_normal((lanes, lanes)) * 0.1).astype(np.float16)
    v[3], v[:, 5], v[7, 9], v[8, 1], v[9, 2], v[10, 40:] = 0, 0, 2.0**-24, np.inf, np.nan, 0
    for dt, bits in ((D_F16, v.view(np.uint16)), (D_I8, rng.integers(-128, 128, (lanes, lanes)).astype(np.uint8))):
        buf = np.zeros((lanes, 2, lanes), np.uint8)      # [row, byte plane, lane]
        buf[:, 0], buf[:, 1] = bits & 0xFF, bits >> 8 if dt == D_F16 else 0
        want = v.astype(np.float32) if dt == D_F16 else bits.view(np.int8).astype(np.float32)
        for trans in (False, True):
            w, norms, wcols = np.zeros((lanes, lanes), np.float32), np.zeros((2, lanes)), np.zeros((lanes, 2), np.int64)
            mxm_install.install(buf[:, None], np.zeros((lanes, 3), np.int64), dt, trans, lanes, lanes, w, norms, wcols)
            ref = np.ascontiguousarray(want.T if trans else want)
            assert np.array_equal(w, ref, equal_nan=True)
            ref_norms, ref_cols = _stats(ref)
            assert np.array_equal(norms, ref_norms, equal_nan=True) and np.array_equal(wcols, ref_cols)
            if dt == D_F16:      # the infinity's and the NaN's columns, the subnormal's grain
                inf, nan, sub = (8, 9, 7) if trans else (1, 2, 9)
                assert np.isinf(norms[0, inf]) and np.isinf(norms[1, inf]) and np.isinf(norms[1, nan])
                assert norms[1, sub] == norms[0, sub] / 2.0**-24


def test_install_keeps_the_rows_not_loaded():
    """An install's conversion after LWs of the first rows only (of the dtype of the untransposed
    install converted before: mxm_install.install_lazily's count, `keep`) converts those, from
    their installed side, and counts the rest as converted: the same weights, norms and row
    support as a conversion of the whole buffer."""
    rng = np.random.default_rng(7)
    lanes, top = 64, 20
    bits = (rng.standard_normal((2, lanes, lanes)) * 0.1).astype(np.float16).view(np.uint16)
    bits[1, :top, 30:] = 0                   # rows with their own support
    buf, rows = np.zeros((lanes, 2, 2, lanes), np.uint8), np.zeros((lanes, 3), np.int64)   # [row, side, byte plane, lane]
    w, norms, wcols = np.zeros((lanes, lanes), np.float32), np.zeros((2, lanes)), np.zeros((lanes, 2), np.int64)
    buf[:, 0, 0], buf[:, 0, 1] = bits[0] & 0xFF, bits[0] >> 8
    mxm_install.install(buf, rows, D_F16, False, lanes, lanes, w, norms, wcols)
    buf[:top, 1, 0], buf[:top, 1, 1] = bits[1, :top] & 0xFF, bits[1, :top] >> 8     # the other side, installed
    rows[:top, 0] = 1
    mxm_install.install(buf, rows, D_F16, False, lanes, top, w, norms, wcols)
    want, want_norms, want_cols = np.zeros_like(w), np.zeros_like(norms), np.zeros_like(wcols)
    mxm_install.install(buf, rows, D_F16, False, lanes, lanes, want, want_norms, want_cols)
    assert np.array_equal(w, want) and np.array_equal(norms, want_norms) and np.array_equal(wcols, want_cols)


def test_the_core_finds_numpys_blas():
    """numpy's wheels bundle OpenBLAS with 64-bit integers: there the core calls it directly."""
    info = np.show_config(mode="dicts")["Build Dependencies"]["blas"]
    if info.get("name") != "scipy-openblas" or "USE64BITINT" not in info.get("openblas configuration", ""):
        pytest.skip(f"numpy's BLAS is {info.get('name')}")
    assert blas.dgemm_address() != 0


def _one_thread_inside_and_after(n: int) -> tuple:
    get, set_ = blas._thread_calls()
    set_(n)
    with blas.one_thread():
        inside = int(get())
    return inside, int(get())


def test_the_core_multiplies_on_one_blas_thread_and_gives_numpy_its_threads_back():
    """run() puts numpy's OpenBLAS on one thread while the core runs (blas.one_thread: its products
    are small; two threads ran slower even on a quiet machine) and restores the count after, an
    exception included (here in forked processes, from 2 and from 1 thread)."""
    if not blas.dgemm_address() or blas._thread_calls() is None:
        pytest.skip("numpy's BLAS is not the OpenBLAS of numpy's wheels")
    import multiprocessing as mp
    with mp.get_context("fork").Pool(1) as pool:
        assert [pool.apply(_one_thread_inside_and_after, (n,)) for n in (2, 1)] == [(1, 2), (1, 1)]
    get = blas._thread_calls()[0]
    before = int(get())
    with pytest.raises(ZeroDivisionError), blas.one_thread():
        1 / 0
    assert int(get()) == before


# ---- whole programs: the bulk path changes no bit ------------------------------------------------
def _same_bits(a, b):
    for name in a:
        assert a[name].dtype == b[name].dtype and np.array_equal(a[name].view(np.uint8), b[name].view(np.uint8)), name


def _bulk_equals_row(name, machine, params=None):
    prog, graph = compile_file(os.path.join(PROGRAMS, name + ".lpu"), params or {}, machine)
    values = inputs_for(graph, prog, 0)
    a, b = run(prog, values), run(prog, values, bulk=False)
    _same_bits(a.outputs, b.outputs)
    _same_bits(a.states, b.states)
    assert a.cycles == b.cycles == prog.predicted_cycles


@pytest.mark.parametrize("name", ["matmul", "mlp", "attention_decode", "gpt2_block_decode"])
def test_bundled_programs_bulk_equals_row(name, tsp):
    _bulk_equals_row(name, tsp)


def test_host_blas_equals_row(tsp, monkeypatch):
    """Where the core cannot call numpy's BLAS (`blas.dgemm_address` 0: another BLAS), it hands
    each large batch to the host (run._bulk): the same bits. (Large here: 2^16 multiply-adds, so
    that mlp's batches go to BLAS.)"""
    from lpu.emulator import run as R
    calls = []
    monkeypatch.setattr(blas, "dgemm_address", lambda: 0)
    monkeypatch.setattr(R, "BULK_WORK", 1 << 16)
    monkeypatch.setattr(R, "_bulk", lambda ws, plane, bulk=R._bulk: calls.append(plane) or bulk(ws, plane))
    _bulk_equals_row("mlp", tsp)
    assert calls


@pytest.mark.slow
@pytest.mark.parametrize("name", ["attention_prefill", "gpt2_block_prefill", "llama_block_prefill",
                                  "llama_block_decode"])
def test_bundled_prefills_bulk_equals_row(name, tsp):
    _bulk_equals_row(name, tsp)


def test_column_norms_bound_the_norms_from_above():
    """The column norms' first row (mxm_install `norms`) is an upper bound of each column's exact 2-norm (settle's proofs
    need no less), at most a relative 10^-4 above it, for K = 320 f16 columns of typical, of
    one large and many small, and of equal values (a float32 sum's worst cases), and i8."""
    rng = np.random.default_rng(11)
    k = 320
    cols = [rng.standard_normal(k), np.r_[60000.0, np.full(k - 1, 2.0**-24)], np.full(k, 3.0),
            np.r_[np.full(k // 2, 1.0), np.full(k // 2, 1.0 + 2.0**-10)], rng.integers(-128, 128, k)]
    w = np.stack([np.asarray(c, np.float64) for c in cols], 1).astype(np.float16).astype(np.float32)
    out = _stats(w)[0]
    for n in range(w.shape[1]):
        exact = math.sqrt(math.fsum(float(v) ** 2 for v in w[:, n].astype(np.float64)))
        assert exact <= out[0, n] <= exact * (1 + 1e-4), n


@pytest.mark.parametrize("avx512,kernel,work", [(True, "Haswell", 1 << 24), (True, "SkylakeX", 1 << 21),
                                                (False, "Haswell", 1 << 21), (True, "", 1 << 24)])
def test_bulk_work_by_host(monkeypatch, avx512, kernel, work):
    """Batches go to BLAS only where its kernel is as wide as the core's jitted short path."""
    monkeypatch.setattr(blas, "jit_has_avx512", lambda: avx512)
    monkeypatch.setattr(blas, "kernel_name", lambda: kernel)
    assert blas.bulk_work.__wrapped__() == work
