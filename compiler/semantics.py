"""The numeric rules of the language: compute dtype, conversion to the destination dtype, the
evaluation of each op family with the formulas of the op table (compiler/ops.py), matmul,
causal, rope, and the comparison tolerances. The reference interpreter evaluates with these;
the emulator implements the same rules.

Numeric rules: elementwise ops and reductions compute in f32 when any input or the result is
a float, else in i32 (wrapping); the result is then converted to its dtype (`convert`).
A reduction over any axis but the last adds in the pairwise order (`pairwise`).
matmul rounds float operands to f16 (i8 stays i8), splits K into tiles of `k_tile`, computes
each tile's dot products in f64 rounded once to f32, and accumulates tiles in f32 in K order
(i8: exact i32). bf16 values are held in float32 arrays, rounded to bf16 (nearest even)."""
from __future__ import annotations

import numpy as np

from lpu.compiler import ops
from lpu.isa import dtypes
from lpu.isa.dtypes import INT_RANGE, NP_DTYPE, is_float

DTYPES = dtypes.DTYPES
promote, promote_weak = ops.promote, ops.promote_weak      # the dtype rules, for callers

# (atol, rtol) for comparing the emulator (or any implementation of these rules) with the
# reference: f32 differs by transcendental ulps and summation order; f16 and bf16 by one
# rounding step.
TOLERANCE = {"f32": (1e-4, 1e-3), "f16": (1e-2, 1e-2), "bf16": (2e-2, 2e-2), "i32": (1, 0), "i8": (1, 0)}


def _from_np(dt) -> str:
    return ops._np_name(dt)


def unary_result(op: str, x: str) -> str:
    return ops.result_dtype(op, x)


def binary_result(op: str, a: str, b: str) -> str:
    return ops.result_dtype(op, a, b)


def reduce_result(op: str, x: str) -> str:
    return ops.result_dtype(op, x)


def matmul_result(a: str, b: str) -> str | None:
    """i8 @ i8 -> i32; floats @ floats -> f32; anything else is not a matmul (None)."""
    return ops.result_dtype("matmul", a, b)


# ---- numerics ----------------------------------------------------------------------------

def compute_dtype(dtypes, result: str):
    return np.float32 if any(is_float(d) for d in (*dtypes, result)) else np.int32


def _bf16(x: np.ndarray) -> np.ndarray:
    """Round to bf16 through f32, nearest even (NaN stays NaN), as float32 values."""
    with np.errstate(over="ignore"):
        u = np.asarray(x, np.float32).view(np.uint32).astype(np.uint64)
    bits = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) & 0xFFFF
    nan = (u & 0x7FFFFFFF) > 0x7F800000
    bits[nan] = (u[nan] >> 16) | 0x40
    return (bits.astype(np.uint32) << 16).view(np.float32)


def convert(x: np.ndarray, dtype: str) -> np.ndarray:
    """Convert to `dtype`: floats by numpy rounding (nearest even; bf16 through f32); float ->
    int by rint, NaN -> 0, saturating; int -> int saturating."""
    x = np.asarray(x)
    target = NP_DTYPE[dtype]
    if dtype == "bf16":
        return _bf16(x)
    if is_float(dtype):
        with np.errstate(over="ignore"):
            return x.astype(target)
    lo, hi = INT_RANGE[dtype]
    if x.dtype.kind == "f":
        with np.errstate(invalid="ignore"):
            x = np.nan_to_num(np.rint(x.astype(np.float64)), nan=0.0, posinf=hi, neginf=lo)
    return np.clip(x, lo, hi).astype(target)


def elementwise(op: str, xs: list, result: str) -> np.ndarray:
    """An elementwise op (unary, binary, comparison, select) in its compute dtype, converted to
    `result`. A select's condition (`where`'s) is only tested against zero: it does not choose
    the compute dtype."""
    first = 1 if ops.OPS[op].family == "select" else 0
    ct = compute_dtype([_from_np(x.dtype) for x in xs[first:]], result)
    args = xs[:first] + [x.astype(ct) for x in xs[first:]]
    with np.errstate(all="ignore"):
        return convert(ops.OPS[op].fn(*args), result)


def pairwise(x: np.ndarray, axis: int, fn) -> np.ndarray:
    """Combine along `axis` in the pairwise order: adjacent pairs (0,1), (2,3), ... level by
    level, an odd last item carried to the next level, until one is left (keepdims)."""
    items = [np.take(x, [i], axis=axis) for i in range(x.shape[axis])]
    while len(items) > 1:
        odd = items[-1:] if len(items) % 2 else []
        items = [fn(items[i], items[i + 1]) for i in range(0, len(items) - 1, 2)] + odd
    return items[0]


def reduce(op: str, x: np.ndarray, axis: int, result: str) -> np.ndarray:
    """Over the last axis in numpy's order; over any other axis (a reduction across vectors)
    in the pairwise order (`pairwise`), the order the compiler's tree chains add in."""
    ct = compute_dtype([_from_np(x.dtype)], result)
    axis = axis % x.ndim if x.ndim else 0
    with np.errstate(all="ignore"):
        if x.ndim and axis != x.ndim - 1 and x.shape[axis] > 0:
            r = pairwise(x.astype(ct), axis, np.maximum if op == "max" else np.add).astype(ct)
        else:
            r = ops.OPS[op].fn(x.astype(ct), axis=axis, keepdims=True).astype(ct)
        if op == "mean":
            r = (r / ct(x.shape[axis])).astype(ct)
    return convert(r, result)


def matmul(a: np.ndarray, b: np.ndarray, result: str, k_tile: int) -> np.ndarray:
    if result == "i32":
        return (a.astype(np.int64) @ b.astype(np.int64)).astype(np.int32)
    a = a.astype(np.float16).astype(np.float64)
    b = b.astype(np.float16).astype(np.float64)
    k = a.shape[-1]
    acc = None
    with np.errstate(all="ignore"):
        for k0 in range(0, k, k_tile):
            part = (a[..., k0:k0 + k_tile] @ b[..., k0:k0 + k_tile, :]).astype(np.float32)
            acc = part if acc is None else acc + part
    return convert(acc, result)


def causal(x: np.ndarray, offset: int) -> np.ndarray:
    rows, cols = x.shape[-2], x.shape[-1]
    mask = np.arange(cols)[None, :] > np.arange(rows)[:, None] + offset
    out = x.copy()
    out[..., mask] = -np.inf
    return out


def rope(x: np.ndarray, pos: int, theta: float, result: str) -> np.ndarray:
    rows, hd = x.shape[-2], x.shape[-1]
    half = hd // 2
    inv = float(theta) ** (-2.0 * np.arange(half, dtype=np.float64) / hd)
    angle = (pos + np.arange(rows, dtype=np.float64))[:, None] * inv[None, :]
    cos = np.concatenate([np.cos(angle)] * 2, axis=-1).astype(np.float32)
    sin = np.concatenate([np.sin(angle)] * 2, axis=-1).astype(np.float32)
    x32 = x.astype(np.float32)
    rot = np.concatenate([-x32[..., half:], x32[..., :half]], axis=-1)
    return convert(x32 * cos + rot * sin, result)


def lanefold(x: np.ndarray, lanes: int, scale: float) -> np.ndarray:
    """Op `lanefold` (compiler/rewrite.py): z = the row's chunks of `lanes` lanes added (zero past
    its end), plus that rotated by lanes / 2, times scale (f32); then f16(z - hi) (lo) below
    lanes / 2 and f16(z) from there, hi = f16(z) clamped to f16's range: the f16 vector's sum
    is that of z's lower half to about f32's precision (infinite where z is)."""
    cols = x.shape[-1]
    pad = np.zeros(x.shape[:-1] + (-(-cols // lanes) * lanes,), np.float32)
    pad[..., :cols] = x
    y = pad.reshape(x.shape[:-1] + (-1, lanes)).sum(axis=-2, dtype=np.float32)
    z = ((y + np.roll(y, lanes // 2, axis=-1)) * np.float32(scale)).astype(np.float32)
    hi = np.clip(z, -65504.0, 65504.0).astype(np.float16).astype(np.float32)
    hi[..., lanes // 2:] = 0
    return (z - hi).astype(np.float16)


def tfold(x: np.ndarray, step: int, parts: int, starts, count: int) -> np.ndarray:
    """Op `tfold` (compiler/rewrite_pair.py): x [R, W]'s columns s .. s + count (s in starts)
    transposed, those j * step further stacked: out[i*count + c, j*R + r] = x[r, starts[i] + c
    + j*step]."""
    cols = np.concatenate([np.arange(s, s + count) for s in starts])
    return np.concatenate([x[:, cols + j * step] for j in range(parts)], axis=0).T.copy()


def close(actual: np.ndarray, expected: np.ndarray, dtype: str) -> bool:
    """Whether two results agree within TOLERANCE[dtype] (NaN and inf must match exactly)."""
    atol, rtol = TOLERANCE[dtype]
    a = np.asarray(actual, dtype=np.float64)
    e = np.asarray(expected, dtype=np.float64)
    return a.shape == e.shape and bool(np.allclose(a, e, atol=atol, rtol=rtol, equal_nan=True))
