"""Jitted fast path of the commonest VXM instructions (used by emulator/core.py before
emulator/arith.py's general `vxm_compute`): ADD, SUB, MUL, DIV, MAX, MIN and CONV with f16 or
f32 operands and result. The same arithmetic as arith (float32 operations, NaN rules of
f32_binary, f32 -> f16 by f32_bits_to_f16, lanes >= nv zero), with the dtype and operation
branches taken once per vector instead of once per lane; anything else goes to arith.
tests/test_emulator_checks.py compares the two on random operands."""
import numpy as np
from numba import njit

from lpu.emulator.arith import C_ADD, C_CONV, C_DIV, C_MAX, C_MIN, C_MUL, C_SUB, D_F16, D_F32, f16_value, f32_bits_to_f16


@njit(cache=True, inline="always")
def _fdt(dt):
    return dt == D_F16 or dt == D_F32


@njit(cache=True)
def handles(op, adt, bdt, bimm, odt):
    """Whether `compute` takes this instruction (operand dtypes as read, bimm as in the table)."""
    if not _fdt(odt):
        return False
    if op == C_CONV:
        return _fdt(adt)
    binary = op == C_ADD or op == C_SUB or op == C_MUL or op == C_DIV or op == C_MAX or op == C_MIN
    if not binary or bimm < 0 or bimm > 2:
        return False
    return (bimm == 2 or _fdt(adt)) and (bimm == 1 or _fdt(bdt))


@njit(cache=True)
def _decode(src, dt, lanes, u32, f32v, out):
    if dt == D_F16:
        for l in range(lanes):
            out[l] = f16_value(src[0, l], src[1, l])
    else:
        for l in range(lanes):
            u32[l] = (np.uint32(src[0, l]) | (np.uint32(src[1, l]) << 8) | (np.uint32(src[2, l]) << 16)
                      | (np.uint32(src[3, l]) << 24))
        for l in range(lanes):
            out[l] = f32v[l]


@njit(cache=True, error_model="numpy")
def _binary(op, fa, fb, lanes):
    if op == C_ADD:
        for l in range(lanes):
            fa[l] = fa[l] + fb[l]
    elif op == C_SUB:
        for l in range(lanes):
            fa[l] = fa[l] - fb[l]
    elif op == C_MUL:
        for l in range(lanes):
            fa[l] = fa[l] * fb[l]
    elif op == C_DIV:
        for l in range(lanes):
            fa[l] = fa[l] / fb[l]
    elif op == C_MAX:
        for l in range(lanes):
            a, b = fa[l], fb[l]
            fa[l] = a + b if a != a or b != b else (a if a >= b else b)
    elif op == C_MIN:
        for l in range(lanes):
            a, b = fa[l], fb[l]
            fa[l] = a + b if a != a or b != b else (a if a <= b else b)


@njit(cache=True)
def compute(op, a, adt, b, bdt, bimm, imm, odt, nv, lanes, fa, fb, u32, f32v, dst):
    """One VXM instruction that `handles` accepted, into the byte planes dst."""
    u32[0] = imm & 0xFFFFFFFF
    fimm = f32v[0]
    if op == C_CONV or bimm != 2:
        _decode(a, adt, lanes, u32, f32v, fa)
    else:
        for l in range(lanes):
            fa[l] = fimm
    if op != C_CONV:
        if bimm == 1:
            for l in range(lanes):
                fb[l] = fimm
        else:
            _decode(b, bdt, lanes, u32, f32v, fb)
        _binary(op, fa, fb, lanes)
    for l in range(lanes):
        f32v[l] = fa[l] if l < nv else np.float32(0.0)
    if odt == D_F16:
        for l in range(lanes):              # f16-normal and too big: round the bits (ties to even)
            u = np.int64(u32[l])
            a = u & 0x7FFFFFFF
            h = ((u >> 16) & 0x8000) | min(((a + 0xFFF + ((a >> 13) & 1)) >> 13) - (112 << 10), 0x7C00)
            dst[0, l] = h & 0xFF
            dst[1, l] = (h >> 8) & 0xFF
        for l in range(lanes):              # zero, f16-subnormal, inf, NaN (and lanes >= nv: zero)
            a = np.int64(u32[l]) & 0x7FFFFFFF
            if a < 0x38800000 or a >= 0x7F800000:
                h = f32_bits_to_f16(np.int64(u32[l]))
                dst[0, l] = h & 0xFF
                dst[1, l] = (h >> 8) & 0xFF
    else:
        for l in range(lanes):
            u = u32[l]
            dst[0, l] = u & 0xFF
            dst[1, l] = (u >> 8) & 0xFF
            dst[2, l] = (u >> 16) & 0xFF
            dst[3, l] = (u >> 24) & 0xFF
