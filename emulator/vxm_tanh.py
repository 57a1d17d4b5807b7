"""The float32 tanh of the VXM's TANH and GELU: `tanh_lane` (arith.f32_unary) and the same a
vector at a time (emulator/vxm_fast.py).

The emulator's tanh is the float tanhf of fdlibm (Sun's 1993 libm, converted to float by Ian
Lance Taylor, through expm1f), as glibc's libm has it (2.36 on the development host), which the
emulator called through Numba's np.tanh before: the same bits on this host, and now on every
host whatever its libm. Calling libm cost a call a lane (~16 ns: 5 us of a 320-lane GELU); here every step of
tanhf and expm1f is computed for every lane without a branch (each branch's value, then the
one its condition picks), so the loops vectorize. The same float32 operations in the same
order, no fused multiply-adds, ties to even: the same bits, compared with libm's tanhf on all
2^32 inputs once (tools/check_tanh.py; tests/test_vxm_tanh.py compares 2^22 spread patterns
and every region boundary)."""
import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic


@intrinsic
def f32_as_i32(typingctx, x):
    """The bits of a float32 as an int32."""
    if not isinstance(x, types.Float) or x.bitwidth != 32:
        return None

    def codegen(context, builder, sig, args):
        return builder.bitcast(args[0], ir.IntType(32))
    return types.int32(x), codegen


@intrinsic
def i32_as_f32(typingctx, i):
    """The float32 of the low 32 bits of an integer."""
    if not isinstance(i, types.Integer):
        return None

    def codegen(context, builder, sig, args):
        v = args[0]
        if v.type.width > 32:
            v = builder.trunc(v, ir.IntType(32))
        elif v.type.width < 32:
            v = builder.sext(v, ir.IntType(32))
        return builder.bitcast(v, ir.FloatType())
    return types.float32(i), codegen


_F = np.float32
ONE, TWO, HALF = _F(1.0), _F(2.0), _F(0.5)
LN2_HI, LN2_LO, INVLN2 = _F(6.9313812256e-01), _F(9.0580006145e-06), _F(1.4426950216e+00)
Q1, Q2, Q3, Q4, Q5 = _F(-3.3333335072e-02), _F(1.5873016091e-03), _F(-7.9365076090e-05), _F(4.0082177293e-06), \
    _F(-2.0109921195e-07)


@njit(cache=True, inline="always", error_model="numpy")
def expm1_lane(x):
    """fdlibm's expm1f for finite |x| < 27 ln2 and for 0 < x < 88 (tanhf's arguments). Integers
    are int32 (np.int32 around each operation: Numba widens to int64, which AVX2 does not
    convert from floats a vector at a time)."""
    i32 = np.int32
    hx = f32_as_i32(x)
    neg = hx < 0
    ax = i32(hx & i32(0x7FFFFFFF))
    # argument reduction: x = k ln2 + (hi - lo)
    kn = i32(INVLN2 * x + (-HALF if neg else HALF))           # truncates, as C's conversion
    tn = np.float32(kn)
    hi_n = x - tn * LN2_HI
    lo_n = tn * LN2_LO
    hi_1 = x + LN2_HI if neg else x - LN2_HI
    lo_1 = -LN2_LO if neg else LN2_LO
    near = ax < 0x3F851592                                     # |x| < 1.5 ln2
    hi = hi_1 if near else hi_n
    lo = lo_1 if near else lo_n
    k = (i32(-1) if neg else i32(1)) if near else kn
    r = hi - lo
    c = (hi - r) - lo
    reduce = ax > 0x3EB17218                                   # |x| > 0.5 ln2
    r = r if reduce else x
    c = c if reduce else _F(0.0)
    k = k if reduce else i32(0)
    # the primary range
    hfx = HALF * r
    hxs = r * hfx
    r1 = ONE + hxs * (Q1 + hxs * (Q2 + hxs * (Q3 + hxs * (Q4 + hxs * Q5))))
    t = _F(3.0) - r1 * hfx
    e = hxs * ((r1 - t) / (_F(6.0) - r * t))
    y0 = r - (r * e - hxs)                                     # k = 0
    e = r * (e - c) - c
    e = e - hxs
    ym1 = HALF * (r - e) - HALF                                # k = -1
    y1 = -TWO * (e - (r + HALF)) if r < _F(-0.25) else ONE + TWO * (r - e)
    scale = i32(k << i32(23))                                  # k added to the exponent
    ya = i32_as_f32(i32(f32_as_i32(ONE - (e - r)) + scale)) - ONE                           # k <= -2 or k > 56
    ks = i32(min(max(k, i32(0)), i32(31)))
    yb = i32_as_f32(i32(f32_as_i32(i32_as_f32(i32(0x3F800000 - i32(i32(0x1000000) >> ks))) - (e - r)) + scale))
    yc = (r - (e + i32_as_f32(i32(i32(0x7F - k) << i32(23))))) + ONE
    yc = i32_as_f32(i32(f32_as_i32(yc) + scale))              # 23 <= k <= 56 (yb: 2 <= k < 23)
    ybig = ya if (k <= -2 or k > 56) else (yb if k < 23 else yc)
    y = y0 if k == 0 else (ym1 if k == -1 else (y1 if k == 1 else ybig))
    return x if ax < 0x33000000 else y                         # |x| < 2^-25


@njit(cache=True, inline="always", error_model="numpy")
def tanh_lane(x):
    """fdlibm's tanhf, every input (NaNs as libm: 1/x +- 1)."""
    jx = f32_as_i32(x)
    ix = np.int32(jx & np.int32(0x7FFFFFFF))
    big = ix >= 0x3F800000                                     # |x| >= 1
    ax = abs(x)
    t = expm1_lane(TWO * ax if big else -TWO * ax)
    z = ONE - TWO / (t + TWO) if big else -t / (t + TWO)
    z = ONE if ix >= 0x41B00000 else z                         # |x| >= 22: 1 - tiny rounds to 1
    y = z if jx >= 0 else -z
    y = x * (ONE + x) if ix < 0x24000000 else y                # |x| < 2^-55 (and 0)
    inv = ONE / x
    return (inv + ONE if jx >= 0 else inv - ONE) if ix >= 0x7F800000 else y
