"""Jitted number formats and VXM arithmetic (used by emulator/core.py): dtype codes, the
core's own operation codes, f32 <-> f16/bf16 bit conversions with round-to-nearest-even,
saturating conversions, and the f32/i32 unary and binary operations of the VXM.

Numba's cache freezes globals, so the codes here are literals, checked against the opcode and
dtype tables of isa/ when this module is imported: a table that changes without this file
changing fails loudly instead of running stale compiled code."""
import hashlib
import os

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core import caching, config
from numba.extending import intrinsic

from lpu.emulator.vxm_tanh import tanh_lane
from lpu.isa import dtypes as _dtypes


def _cache_dirs(here: str) -> list:
    """Where Numba keeps this package's compiled functions: the in-tree __pycache__ (a writable
    checkout), or the folder it makes under NUMBA_CACHE_DIR when that is set."""
    dirs = [os.path.join(here, "__pycache__")]
    locator = getattr(caching, "UserProvidedCacheLocator", None)
    if config.CACHE_DIR and locator is not None:
        dirs.append(os.path.join(config.CACHE_DIR, locator.get_suitable_cache_subpath(os.path.join(here, "arith.py"))))
    return dirs


def drop_stale_cache(here: str, dirs: list) -> None:
    """Numba's cache is invalidated only by changes to a function's own file, yet a cached
    function embeds the functions it calls and inlines from other modules (core.py's loop holds
    most of this package) and their frozen constants. So when any module of the package changes,
    every cached function of it is dropped (a stamp of all their sources beside the cache).
    here: the package's folder; dirs: its cache folders (`_cache_dirs`)."""
    h = hashlib.sha256()
    for name in sorted(os.listdir(here)):
        if name.endswith(".py"):
            with open(os.path.join(here, name), "rb") as f:
                h.update(name.encode() + b"\0" + f.read())
    stamp = h.hexdigest()
    for cache in dirs:
        mark = os.path.join(cache, "emulator.stamp")
        try:
            with open(mark) as f:
                if f.read() == stamp:
                    continue
        except OSError:
            pass
        try:
            os.makedirs(cache, exist_ok=True)
            for name in os.listdir(cache):
                if name.endswith((".nbi", ".nbc")):
                    os.remove(os.path.join(cache, name))
            tmp = f"{mark}.{os.getpid()}"
            with open(tmp, "w") as f:
                f.write(stamp)
            os.replace(tmp, mark)
        except OSError:
            pass        # no cache there yet, or read-only: nothing stale to drop


_HERE = os.path.dirname(os.path.abspath(__file__))
drop_stale_cache(_HERE, _cache_dirs(_HERE))

# the binary VXM ops are C_ADD .. C_MIN, the unary ones C_NEG .. C_GELU (EXP .. GELU: always f32)
CORE_OPS = (
    "READ", "WRITE", "GATHER", "SCATTER", "LW", "IW", "ABC", "ACC",
    "ADD", "SUB", "MUL", "DIV", "MAX", "LT", "LE", "GT", "GE", "EQ", "NE", "KEEP", "DROP", "MIN",
    "NEG", "ABS", "RELU", "CONV", "EXP", "LOG", "SQRT", "RSQRT", "TANH", "SIGMOID", "SILU", "GELU",
    "MASK", "SHIFT", "ROTATE", "PERMUTE", "DISTRIBUTE", "TPIN", "TPOUT", "SEND", "RECV",
)
(C_READ, C_WRITE, C_GATHER, C_SCATTER, C_LW, C_IW, C_ABC, C_ACC,
 C_ADD, C_SUB, C_MUL, C_DIV, C_MAX, C_LT, C_LE, C_GT, C_GE, C_EQ, C_NE, C_KEEP, C_DROP, C_MIN,
 C_NEG, C_ABS, C_RELU, C_CONV, C_EXP, C_LOG, C_SQRT, C_RSQRT, C_TANH, C_SIGMOID, C_SILU, C_GELU,
 C_MASK, C_SHIFT, C_ROTATE, C_PERMUTE, C_DISTRIBUTE, C_TPIN, C_TPOUT, C_SEND, C_RECV) = range(len(CORE_OPS))

# dtype codes as packed in refs: isa/dtypes.py's table
DTYPE_NAMES = ("i8", "f16", "i32", "f32", "bf16")
D_I8, D_F16, D_I32, D_F32, D_BF16 = range(5)
WIDTH = np.array([1, 2, 4, 4, 2], np.int64)
if DTYPE_NAMES != _dtypes.DTYPES or tuple(WIDTH) != _dtypes.DTYPE_WIDTH:
    raise ImportError("emulator/arith.py dtype codes differ from isa/dtypes.py: update both")

I32_MIN, I32_MAX = -(1 << 31), (1 << 31) - 1


# ---- number formats ---------------------------------------------------------------------------
def _f16_bits(builder, args):
    """The f16 bits lo | hi << 8 of two integer bytes (LLVM i16) and their value as float32, by
    the CPU's half-to-float conversion (`f16_value`, `f16_finite`)."""
    i16, i32 = ir.IntType(16), ir.IntType(32)
    lo16, hi16 = (builder.trunc(builder.zext(a, i32) if a.type.width < 32 else a, i16) for a in args)
    bits = builder.or_(builder.and_(lo16, i16(0xFF)), builder.shl(hi16, i16(8)))
    return bits, builder.fpext(builder.bitcast(bits, ir.HalfType()), ir.FloatType())


@intrinsic
def f16_value(typingctx, lo, hi):
    """The f16 number of bits lo | hi << 8 (two unsigned bytes) as a float32, by the CPU's
    conversion (x86 F16C: eight at a time in a loop, where a table lookup is one), NaNs kept bit
    for bit as numpy's table has them (sign, payload, quiet bit: the hardware would quiet a
    signalling NaN)."""
    if not (isinstance(lo, types.Integer) and isinstance(hi, types.Integer)):
        return None

    def codegen(context, builder, sig, args):
        i32 = ir.IntType(32)
        bits, f = _f16_bits(builder, args)
        u = builder.zext(bits, i32)
        nan = builder.icmp_unsigned(">", builder.and_(u, i32(0x7FFF)), i32(0x7C00))
        kept = builder.or_(builder.or_(builder.shl(builder.and_(u, i32(0x8000)), i32(16)), i32(0x7F800000)),
                           builder.shl(builder.and_(u, i32(0x3FF)), i32(13)))
        return builder.select(nan, builder.bitcast(kept, ir.FloatType()), f)
    return types.float32(lo, hi), codegen


@intrinsic
def f16_finite(typingctx, lo, hi):
    """`f16_value` of a finite f16 number (no NaN to keep: half the instructions of a loop that
    converts, emulator/mxm_direct.py)."""
    if not (isinstance(lo, types.Integer) and isinstance(hi, types.Integer)):
        return None

    def codegen(context, builder, sig, args):
        return _f16_bits(builder, args)[1]
    return types.float32(lo, hi), codegen


@njit(cache=True)
def f32_bits_to_f16(u):
    """Round an f32 bit pattern to the nearest f16 bit pattern (ties to even)."""
    sign = (u >> 16) & 0x8000
    e = (u >> 23) & 0xFF
    m = u & 0x7FFFFF
    if e == 0xFF:
        return sign | 0x7C00 | ((0x200 | (m >> 13)) if m != 0 else 0)
    ex = e - 127
    if ex > 15:
        return sign | 0x7C00
    if ex >= -14:
        h = ((ex + 15) << 10) | (m >> 13)
        rem = m & 0x1FFF
        if rem > 0x1000 or (rem == 0x1000 and (h & 1) == 1):
            h += 1
        return sign | h
    if ex < -25:
        return sign
    full = m | 0x800000
    shift = -ex - 1
    h = full >> shift
    rem = full & ((1 << shift) - 1)
    half = 1 << (shift - 1)
    if rem > half or (rem == half and (h & 1) == 1):
        h += 1
    return sign | h


@njit(cache=True)
def f32_bits_to_bf16(u):
    if (u & 0x7F800000) == 0x7F800000 and (u & 0x7FFFFF) != 0:
        return (u >> 16) | 0x40
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) & 0xFFFF


@njit(cache=True)
def wrap32(v):
    return ((v + (1 << 31)) & 0xFFFFFFFF) - (1 << 31)


@njit(cache=True)
def saturate(v, lo, hi):
    return lo if v < lo else (hi if v > hi else v)


@njit(cache=True)
def float_to_int(x, lo, hi):
    if x != x:
        return 0
    r = np.rint(np.float64(x))
    if r <= lo:
        return lo
    if r >= hi:
        return hi
    return np.int64(r)


@njit(cache=True)
def is_float(dt):
    return dt == D_F16 or dt == D_F32 or dt == D_BF16


@njit(cache=True)
def plane_bits(src, w, l):
    v = np.int64(0)
    for b in range(w):
        v |= np.int64(src[b, l]) << (8 * b)
    return v


@njit(cache=True)
def decode_f32(src, dt, lanes, f16tab, u32, f32v, out):
    """Byte planes `src` of dtype `dt` -> float32 values in `out`."""
    for l in range(lanes):
        if dt == D_F16:
            out[l] = f16tab[plane_bits(src, 2, l)]
        elif dt == D_F32:
            u32[l] = plane_bits(src, 4, l)
            out[l] = f32v[l]
        elif dt == D_BF16:
            u32[l] = plane_bits(src, 2, l) << 16
            out[l] = f32v[l]
        else:
            out[l] = np.float32(decode_int(src, dt, l))


@njit(cache=True)
def decode_int(src, dt, l):
    if dt == D_I8:
        v = np.int64(src[0, l])
        return v - 256 if v >= 128 else v
    v = plane_bits(src, 4, l)
    return v - (1 << 32) if v >= (1 << 31) else v


@njit(cache=True)
def encode_f32(vals, dt, nv, lanes, u32, f32v, dst):
    """float32 `vals` -> byte planes of dtype `dt` in `dst`; lanes >= nv are 0."""
    for l in range(lanes):
        bits = np.int64(0)
        if l < nv:
            x = vals[l]
            if dt == D_I8:
                bits = float_to_int(x, -128, 127) & 0xFF
            elif dt == D_I32:
                bits = float_to_int(x, I32_MIN, I32_MAX) & 0xFFFFFFFF
            else:
                f32v[l] = x
                bits = np.int64(u32[l])
                if dt == D_F16:
                    bits = f32_bits_to_f16(bits)
                elif dt == D_BF16:
                    bits = f32_bits_to_bf16(bits)
        for b in range(4):
            dst[b, l] = (bits >> (8 * b)) & 0xFF


@njit(cache=True)
def encode_int(vals, dt, nv, lanes, dst):
    for l in range(lanes):
        bits = np.int64(0)
        if l < nv:
            bits = (saturate(vals[l], -128, 127) if dt == D_I8 else vals[l]) & 0xFFFFFFFF
        for b in range(4):
            dst[b, l] = (bits >> (8 * b)) & 0xFF


# ---- VXM ---------------------------------------------------------------------------------------
@njit(cache=True, inline="always", error_model="numpy")
def f32_unary(op, x):
    one = np.float32(1.0)
    if op == C_NEG:
        return -x
    if op == C_ABS:
        return abs(x)
    if op == C_RELU:
        return np.float32(0.0) if x < 0 else x
    if op == C_EXP:
        return np.exp(x)
    if op == C_LOG:
        return np.log(x)
    if op == C_SQRT:
        return np.sqrt(x)
    if op == C_RSQRT:
        return one / np.sqrt(x)
    if op == C_TANH:
        return tanh_lane(x)                 # libm's tanhf (fdlibm), on every host
    if op == C_SIGMOID:
        return one / (one + np.exp(-x))
    if op == C_SILU:
        return x * (one / (one + np.exp(-x)))
    if op == C_GELU:
        inner = np.float32(0.7978845608) * (x + np.float32(0.044715) * (x * x * x))
        return np.float32(0.5) * x * (one + tanh_lane(inner))
    return x  # CONV


@njit(cache=True, error_model="numpy")
def f32_binary(op, a, b):
    one, zero = np.float32(1.0), np.float32(0.0)
    if op == C_ADD:
        return a + b
    if op == C_SUB:
        return a - b
    if op == C_MUL:
        return a * b
    if op == C_DIV:
        return a / b
    if op == C_LT:
        return one if a < b else zero
    if op == C_LE:
        return one if a <= b else zero
    if op == C_GT:
        return one if a > b else zero
    if op == C_GE:
        return one if a >= b else zero
    if op == C_EQ:
        return one if a == b else zero
    if op == C_NE:
        return one if a != b else zero
    if op == C_KEEP:
        return a if b != 0 else np.float32(-0.0)
    if op == C_DROP:
        return a if b == 0 else np.float32(-0.0)
    if a != a or b != b:
        return a + b  # NaN
    if op == C_MAX:
        return a if a >= b else b
    return a if a <= b else b


@njit(cache=True)
def int_unary(op, x):
    if op == C_NEG:
        return wrap32(-x)
    if op == C_ABS:
        return wrap32(abs(x))
    if op == C_RELU:
        return x if x > 0 else 0
    return x  # CONV


@njit(cache=True)
def int_binary(op, a, b):
    if op == C_ADD:
        return wrap32(a + b)
    if op == C_SUB:
        return wrap32(a - b)
    if op == C_MUL:
        return wrap32(a * b)
    if op == C_DIV:
        if b == 0:
            return 0
        q = abs(a) // abs(b)
        return wrap32(q if (a < 0) == (b < 0) else -q)
    if op == C_LT:
        return 1 if a < b else 0
    if op == C_LE:
        return 1 if a <= b else 0
    if op == C_GT:
        return 1 if a > b else 0
    if op == C_GE:
        return 1 if a >= b else 0
    if op == C_EQ:
        return 1 if a == b else 0
    if op == C_NE:
        return 1 if a != b else 0
    if op == C_KEEP:
        return a if b != 0 else 0
    if op == C_DROP:
        return a if b == 0 else 0
    if op == C_MAX:
        return a if a >= b else b
    return a if a <= b else b


@njit(cache=True, error_model="numpy")
def vxm_compute(op, a, adt, b, bdt, bimm, imm, odt, nv, cut, lanes, f16tab, fa, fb, ia, u32, f32v, dst):
    """One VXM instruction on operand byte planes a, b (b unused for unary ops and MASK).
    KEEP and DROP only test b against zero, so b's dtype does not choose the compute dtype.
    (error_model numpy: f32_unary, inlined here, divides by zero as IEEE does.)"""
    binary = op >= C_ADD and op <= C_MIN
    select = op == C_KEEP or op == C_DROP
    reads_a = not (binary and bimm == 2)
    reads_b = binary and bimm != 1
    fl = (is_float(odt) or (reads_a and is_float(adt)) or (reads_b and is_float(bdt) and not select)
          or (op >= C_EXP and op <= C_GELU))
    if fl:
        u32[0] = imm & 0xFFFFFFFF
        fimm = f32v[0]
        if reads_a:
            decode_f32(a, adt, lanes, f16tab, u32, f32v, fa)
        if reads_b:
            decode_f32(b, bdt, lanes, f16tab, u32, f32v, fb)
        for l in range(lanes):
            if op == C_MASK:
                fa[l] = fa[l] if l < cut else fimm
            elif binary:
                fa[l] = f32_binary(op, fimm if bimm == 2 else fa[l], fimm if bimm == 1 else fb[l])
            else:
                fa[l] = f32_unary(op, fa[l])
        encode_f32(fa, odt, nv, lanes, u32, f32v, dst)
    else:
        float_b = reads_b and is_float(bdt)          # a float condition of KEEP / DROP
        if float_b:
            decode_f32(b, bdt, lanes, f16tab, u32, f32v, fb)
        for l in range(lanes):
            x = decode_int(a, adt, l) if reads_a else np.int64(imm)
            if op == C_MASK:
                ia[l] = x if l < cut else imm
            elif binary:
                if float_b:
                    y = np.int64(1) if fb[l] != 0 else np.int64(0)
                else:
                    y = decode_int(b, bdt, l) if reads_b else np.int64(imm)
                ia[l] = int_binary(op, x, y)
            else:
                ia[l] = int_unary(op, x)
        encode_int(ia, odt, nv, lanes, dst)


@intrinsic
def i8_to_f16_bits(typingctx, v):
    """The f16 bit pattern of a small integer (|v| <= 2048: exact, no rounding) as an int64, by
    the CPU's conversion (x86 F16C, as `f16_value`: vectorized in a loop, where computing the
    exponent bit by bit was ~18% of the core loop on gpt2_small_decode's i8 weight loads)."""
    if not isinstance(v, types.Integer):
        return None

    def codegen(context, builder, sig, args):
        i32 = ir.IntType(32)
        x = args[0]
        if x.type.width > 32:
            x = builder.trunc(x, i32)
        elif x.type.width < 32:
            x = builder.sext(x, i32) if sig.args[0].signed else builder.zext(x, i32)
        h = builder.fptrunc(builder.sitofp(x, ir.FloatType()), ir.HalfType())
        return builder.zext(builder.bitcast(h, ir.IntType(16)), ir.IntType(64))
    return types.int64(v), codegen
