"""emulator/vxm_tanh.py's vector tanh (the VXM's TANH and GELU) gives libm's tanhf bits, which
the emulator computed before it: on a spread of 2^22 patterns and around every boundary where
tanhf or expm1f changes formula (tools/check_tanh.py compares all 2^32 once)."""
import numpy as np
from numba import njit

from lpu.emulator import vxm_tanh
from tools.check_tanh import check, first_mismatch


def _around(bits, ulps):
    b = np.asarray(bits, np.int64)[:, None] + np.arange(-ulps, ulps + 1)[None, :]
    b = b.ravel() & 0x7FFFFFFF
    return np.concatenate([b, b | 0x80000000]).astype(np.uint32)


def test_tanh_equals_libm_on_spread_patterns():
    assert check(step=1021) is None                          # odd step: every low-bit pattern occurs


def test_tanh_equals_libm_at_every_boundary():
    tanh_edges = [0, 0x24000000, 0x3F800000, 0x41B00000, 0x7F800000, 0x7FC00000, 0x7F800001]
    # expm1f's edges are on its argument 2|x|: halve (exponent - 1)
    expm1_edges = [e - (1 << 23) for e in (0x33000000, 0x3EB17218, 0x3F851592, 0x4195B844)]
    ln2 = np.log(2.0)
    k_edges = np.array([(k + 0.5) * ln2 / 2 for k in range(-4, 64)], np.float32).view(np.uint32)   # k changes
    assert first_mismatch(_around(tanh_edges + expm1_edges, 64)) is None
    assert first_mismatch(_around(k_edges, 256)) is None


@njit(cache=True)
def _gelu_by_libm(x, out):
    """GELU as arith.f32_unary computed it before, with libm's tanhf."""
    for l in range(x.shape[0]):
        v = x[l]
        inner = np.float32(0.7978845608) * (v + np.float32(0.044715) * (v * v * v))
        out[l] = np.float32(0.5) * v * (np.float32(1.0) + np.tanh(inner))


def test_gelu_equals_the_libm_formula_in_place_and_by_lane():
    from lpu.emulator.arith import C_GELU, f32_unary
    x = np.concatenate([np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1e-30, -1e-30, 30.0, -30.0], np.float32),
                        np.random.default_rng(3).standard_normal(311).astype(np.float32) * 4])
    want = np.empty_like(x)
    _gelu_by_libm(x, want)
    got = x.copy()
    vxm_tanh.gelu_vec(got, got.shape[0])
    by_lane = np.array([f32_unary(C_GELU, v) for v in x], np.float32)
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
    assert np.array_equal(by_lane.view(np.uint32), want.view(np.uint32))
