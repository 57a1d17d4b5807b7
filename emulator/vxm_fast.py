"""Jitted fast path of the commonest VXM instructions (used by emulator/core.py before
emulator/arith.py's general `vxm_compute`): ADD, SUB, MUL, DIV, MAX, MIN, CONV and the float
unary operations (NEG .. GELU: arith.f32_unary itself, a vector at a time) with f16 or f32
operands and result. The
same arithmetic as arith (float32 operations, NaN rules of f32_binary, f32 -> f16 by
f32_bits_to_f16, lanes >= nv zero), with the dtype and operation
branches taken once per vector instead of once per lane; anything else goes to arith.
tests/test_emulator_checks.py compares the two on random operands.
The operands' byte planes are read where they lie (ring payload slots or SRAM rows) and the
result's written into its ring slot (core_streams.stream_planes, stream_slot_planes: tuples of
planes); `compute` and `_decode` are inlined into the core's loop: called, the 12 planes passed as
arguments made a 320-lane f16 ADD 270 ns, inlined 115 ns (140 ns copying through scratch planes)."""
import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic

from lpu.emulator.arith import (C_ABS, C_ADD, C_CONV, C_DIV, C_EXP, C_GELU, C_LOG, C_MAX, C_MIN, C_MUL, C_NEG, C_RELU,
                                C_RSQRT, C_SIGMOID, C_SILU, C_SQRT, C_SUB, C_TANH, D_F16, D_F32, f16_value,
                                f32_bits_to_f16, f32_unary)


@intrinsic
def f16_bits(typingctx, x):
    """The f16 bit pattern (int64) nearest a float32 (ties to even), by the CPU's conversion
    (x86 F16C: eight at a time in a loop). IEEE rounding, so the same as arith.f32_bits_to_f16
    for every number and infinity (all 2^32 patterns compared once; tests/test_emulator_checks.py
    compares every sign, exponent and upper mantissa with the low bits that decide rounding);
    a NaN's payload is the hardware's, which is why `compute` takes NaNs from f32_bits_to_f16."""
    if not isinstance(x, types.Float) or x.bitwidth != 32:
        return None

    def codegen(context, builder, sig, args):
        h = builder.bitcast(builder.fptrunc(args[0], ir.HalfType()), ir.IntType(16))
        return builder.zext(h, ir.IntType(64))
    return types.int64(x), codegen


@njit(cache=True, inline="always")
def _fdt(dt):
    return dt == D_F16 or dt == D_F32


@njit(cache=True)
def handles(op, adt, bdt, bimm, odt):
    """Whether `compute` takes this instruction (operand dtypes as read, bimm as in the table)."""
    if not _fdt(odt):
        return False
    if op >= C_NEG and op <= C_GELU:       # CONV and the float unary ops (arith.f32_unary)
        return _fdt(adt)
    binary = op == C_ADD or op == C_SUB or op == C_MUL or op == C_DIV or op == C_MAX or op == C_MIN
    if not binary or bimm < 0 or bimm > 2:
        return False
    return (bimm == 2 or _fdt(adt)) and (bimm == 1 or _fdt(bdt))


@njit(cache=True, inline="always")
def _decode(src, dt, lanes, out):
    """Byte planes of dtype dt -> float32 `out` (f32: the bits put together in out's own memory;
    each plane an array of its own, so that the loops vectorize)."""
    if dt == D_F16:
        lo, hi = src[0], src[1]
        for l in range(lanes):
            out[l] = f16_value(lo[l], hi[l])
    else:
        bits = out.view(np.uint32)
        b0, b1, b2, b3 = src[0], src[1], src[2], src[3]
        for l in range(lanes):
            bits[l] = np.uint32(b0[l]) | (np.uint32(b1[l]) << 8) | (np.uint32(b2[l]) << 16) | (np.uint32(b3[l]) << 24)


@njit(cache=True, inline="always", error_model="numpy")
def _each(op, fa, lanes):
    for l in range(lanes):
        fa[l] = f32_unary(op, fa[l])


@njit(cache=True, error_model="numpy")
def _unary(op, fa, lanes):
    """fa[:lanes] <- arith.f32_unary(op, fa), a loop of its own for each operation (with the
    operation a constant there, f32_unary's other branches fold away and the loop vectorizes:
    TANH and GELU, fdlibm's tanhf without a branch (emulator/vxm_tanh.py), 5.2 -> 1.4 us a
    320-lane GELU; one loop with a branch a lane made EXP and RSQRT 3x slower)."""
    if op == C_GELU:
        _each(C_GELU, fa, lanes)
    elif op == C_TANH:
        _each(C_TANH, fa, lanes)
    elif op == C_EXP:
        _each(C_EXP, fa, lanes)
    elif op == C_RSQRT:
        _each(C_RSQRT, fa, lanes)
    elif op == C_NEG:
        _each(C_NEG, fa, lanes)
    elif op == C_ABS:
        _each(C_ABS, fa, lanes)
    elif op == C_RELU:
        _each(C_RELU, fa, lanes)
    elif op == C_LOG:
        _each(C_LOG, fa, lanes)
    elif op == C_SQRT:
        _each(C_SQRT, fa, lanes)
    elif op == C_SIGMOID:
        _each(C_SIGMOID, fa, lanes)
    elif op == C_SILU:
        _each(C_SILU, fa, lanes)
    elif op != C_CONV:          # (CONV: the value itself) any other: the same arithmetic, one loop
        _each(op, fa, lanes)


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


@njit(cache=True, inline="always")
def compute(op, a, adt, b, bdt, bimm, imm, odt, nv, lanes, fa, fb, u32, f32v, dst):
    """One VXM instruction that `handles` accepted: operand byte planes a, b (2-D arrays or
    tuples of planes, planes past the dtype's width unread) into the byte planes dst."""
    u32[0] = imm & 0xFFFFFFFF
    fimm = f32v[0]
    if op >= C_NEG or bimm != 2:
        _decode(a, adt, lanes, fa)
    else:
        for l in range(lanes):
            fa[l] = fimm
    if op >= C_NEG and op <= C_GELU:
        _unary(op, fa, lanes)
    else:
        if bimm == 1:
            for l in range(lanes):
                fb[l] = fimm
        else:
            _decode(b, bdt, lanes, fb)
        _binary(op, fa, fb, lanes)
    for l in range(nv, lanes):
        fa[l] = 0.0
    if odt == D_F16:
        d0, d1 = dst[0], dst[1]
        nan = False
        for l in range(lanes):
            h = f16_bits(fa[l])
            d0[l] = h & 0xFF
            d1[l] = (h >> 8) & 0xFF
            nan |= fa[l] != fa[l]
        if nan:
            bits = fa.view(np.uint32)
            for l in range(lanes):          # a NaN's payload as f32_bits_to_f16 keeps it
                if fa[l] != fa[l]:
                    h = f32_bits_to_f16(np.int64(bits[l]))
                    d0[l] = h & 0xFF
                    d1[l] = (h >> 8) & 0xFF
    else:
        bits = fa.view(np.uint32)
        d0, d1, d2, d3 = dst[0], dst[1], dst[2], dst[3]
        for l in range(lanes):
            u = bits[l]
            d0[l] = u & 0xFF
            d1[l] = (u >> 8) & 0xFF
            d2[l] = (u >> 16) & 0xFF
            d3[l] = (u >> 24) & 0xFF
