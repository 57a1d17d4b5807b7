"""emulator/vxm_tanh.py's vector tanh (the VXM's TANH and GELU) gives the bits of fdlibm's tanhf,
the libm tanhf the emulator computed before it (glibc until 2.40): on a spread of 2^22 patterns
(by their digest, on any host) and, where libm is that tanhf, compared with it there and around
every boundary where tanhf or expm1f changes formula (tools/check_tanh.py compares all 2^32 once)."""
import hashlib
import platform

import numpy as np
import pytest
from numba import njit

from lpu.emulator.arith import C_GELU, C_TANH
from lpu.emulator.vxm_fast import _unary
from tools.check_tanh import check, first_mismatch


def _around(bits, ulps):
    b = np.asarray(bits, np.int64)[:, None] + np.arange(-ulps, ulps + 1)[None, :]
    b = b.ravel() & 0x7FFFFFFF
    return np.concatenate([b, b | 0x80000000]).astype(np.uint32)


def _glibc_version() -> tuple:
    name, version = platform.libc_ver()
    return tuple(int(v) for v in version.split(".")[:2]) if name == "glibc" and version else (0, 0)


LIBM_IS_FDLIBM = (2, 0) <= _glibc_version() <= (2, 40)
needs_fdlibm = pytest.mark.skipif(not LIBM_IS_FDLIBM, reason="this host's libm tanhf is not fdlibm's (glibc <= 2.40)")
SPREAD = 1021      # odd step: every low-bit pattern occurs
# sha256 of the outputs' bits over every SPREAD-th pattern, taken where the vectors equal
# glibc 2.36's tanhf (all 2^32 inputs compared, tools/check_tanh.py)
TANH_DIGEST = "ff19bd1f98984640b41fe8b6b9b049c235b2af7144136dbcb56d6220f941f370"
GELU_DIGEST = "fab36ccb2d28325d4b65a27b8946aca13ed11295f056960a508e5920283fac1d"


def test_tanh_and_gelu_give_fdlibms_bits_on_any_host():
    bits = ((np.arange((1 << 32) // SPREAD, dtype=np.int64) * SPREAD) & 0xFFFFFFFF).astype(np.uint32)
    for op, digest in ((C_TANH, TANH_DIGEST), (C_GELU, GELU_DIGEST)):
        x = bits.view(np.float32).copy()
        _unary(op, x, x.shape[0])
        assert hashlib.sha256(x.view(np.uint32).tobytes()).hexdigest() == digest, op


@needs_fdlibm
def test_tanh_equals_libm_on_spread_patterns():
    assert check(step=SPREAD) is None


@needs_fdlibm
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


@needs_fdlibm
def test_gelu_equals_the_libm_formula_in_place_and_by_lane():
    from lpu.emulator.arith import f32_unary
    x = np.concatenate([np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1e-30, -1e-30, 30.0, -30.0], np.float32),
                        np.random.default_rng(3).standard_normal(311).astype(np.float32) * 4])
    want = np.empty_like(x)
    _gelu_by_libm(x, want)
    got = x.copy()
    _unary(C_GELU, got, got.shape[0])
    by_lane = np.array([f32_unary(C_GELU, v) for v in x], np.float32)
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
    assert np.array_equal(by_lane.view(np.uint32), want.view(np.uint32))
