"""The one table of op semantics: result dtypes (used by elaboration), numpy formulas, the
compute dtype, conversion to the destination dtype, and the comparison tolerances. The
reference interpreter evaluates with these; the emulator implements the same rules.

Numeric rules: elementwise ops and reductions compute in f32 when any input or the result is
a float, else in i32 (wrapping); the result is then converted to its dtype (`convert`).
matmul rounds float operands to f16 (i8 stays i8), splits K into tiles of `k_tile`, computes
each tile's dot products in f64 rounded once to f32, and accumulates tiles in f32 in K order
(i8: exact i32)."""
from __future__ import annotations

import numpy as np

NP_DTYPE = {"i8": np.int8, "i32": np.int32, "f16": np.float16, "f32": np.float32}
DTYPES = tuple(NP_DTYPE)
FLOATS = frozenset({"f16", "f32"})
INT_RANGE = {"i8": (-128, 127), "i32": (-2**31, 2**31 - 1)}

# (atol, rtol) for comparing the emulator (or any implementation of these rules) with the
# reference: f32 differs by transcendental ulps and summation order; f16 by one rounding step.
TOLERANCE = {"f32": (1e-4, 1e-3), "f16": (1e-2, 1e-2), "i32": (1, 0), "i8": (1, 0)}


def is_float(dtype: str) -> bool:
    return dtype in FLOATS


def _from_np(dt) -> str:
    dt = np.dtype(dt)
    if dt.kind == "f":
        return "f16" if dt.itemsize == 2 else "f32"
    return "i8" if dt.itemsize == 1 else "i32"


def promote(a: str, b: str) -> str:
    """numpy promotion of two tensor dtypes, with f64 and i64 mapped to f32 and i32."""
    return _from_np(np.result_type(NP_DTYPE[a], NP_DTYPE[b]))


def promote_weak(tensor: str, scalar_is_float: bool) -> str:
    """A tensor with a scalar literal keeps its dtype, except int tensor with a float -> f32."""
    return "f32" if scalar_is_float and not is_float(tensor) else tensor


# ---- the op table ------------------------------------------------------------------------

def _sigmoid(x):
    return np.float32(1) / (np.float32(1) + np.exp(-x))


def _gelu(x):
    c, k = np.float32(0.7978845608), np.float32(0.044715)
    return np.float32(0.5) * x * (np.float32(1) + np.tanh(c * (x + k * x * x * x)))


UNARY_FN = {
    "neg": np.negative, "exp": np.exp, "log": np.log, "sqrt": np.sqrt,
    "rsqrt": lambda x: np.float32(1) / np.sqrt(x), "tanh": np.tanh, "sigmoid": _sigmoid,
    "relu": lambda x: np.maximum(x, x.dtype.type(0)), "silu": lambda x: x * _sigmoid(x),
    "gelu": _gelu, "abs": np.abs,
}
FLOAT_UNARY = frozenset({"exp", "log", "sqrt", "rsqrt", "tanh", "sigmoid", "silu", "gelu"})
BINARY_FN = {
    "add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.divide,
    "maximum": np.maximum, "minimum": np.minimum,
}
REDUCE_FN = {"sum": np.sum, "max": np.max, "mean": np.sum}   # mean divides after the sum


def unary_result(op: str, x: str) -> str:
    return "f32" if op in FLOAT_UNARY and not is_float(x) else x


def binary_result(op: str, a: str, b: str) -> str:
    out = promote(a, b)
    return "f32" if op == "div" and not is_float(out) else out


def reduce_result(op: str, x: str) -> str:
    if op == "mean" and not is_float(x):
        return "f32"
    return "i32" if op == "sum" and x == "i8" else x


def matmul_result(a: str, b: str) -> str | None:
    """i8 @ i8 -> i32; floats @ floats -> f32; anything else is not a matmul (None)."""
    if a == "i8" and b == "i8":
        return "i32"
    if is_float(a) and is_float(b):
        return "f32"
    return None


# ---- numerics ----------------------------------------------------------------------------

def compute_dtype(dtypes, result: str):
    return np.float32 if any(is_float(d) for d in (*dtypes, result)) else np.int32


def convert(x: np.ndarray, dtype: str) -> np.ndarray:
    """Convert to `dtype`: floats by numpy rounding (nearest even); float -> int by rint,
    NaN -> 0, saturating; int -> int saturating."""
    x = np.asarray(x)
    target = NP_DTYPE[dtype]
    if is_float(dtype):
        with np.errstate(over="ignore"):
            return x.astype(target)
    lo, hi = INT_RANGE[dtype]
    if x.dtype.kind == "f":
        with np.errstate(invalid="ignore"):
            x = np.nan_to_num(np.rint(x.astype(np.float64)), nan=0.0, posinf=hi, neginf=lo)
    return np.clip(x, lo, hi).astype(target)


def unary(op: str, x: np.ndarray, result: str) -> np.ndarray:
    ct = compute_dtype([_from_np(x.dtype)], result)
    with np.errstate(all="ignore"):
        return convert(UNARY_FN[op](x.astype(ct)), result)


def binary(op: str, a: np.ndarray, b: np.ndarray, result: str) -> np.ndarray:
    ct = compute_dtype([_from_np(a.dtype), _from_np(b.dtype)], result)
    with np.errstate(all="ignore"):
        return convert(BINARY_FN[op](a.astype(ct), b.astype(ct)), result)


def reduce(op: str, x: np.ndarray, axis: int, result: str) -> np.ndarray:
    ct = compute_dtype([_from_np(x.dtype)], result)
    with np.errstate(all="ignore"):
        r = REDUCE_FN[op](x.astype(ct), axis=axis, keepdims=True).astype(ct)
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


def close(actual: np.ndarray, expected: np.ndarray, dtype: str) -> bool:
    """Whether two results agree within TOLERANCE[dtype] (NaN and inf must match exactly)."""
    atol, rtol = TOLERANCE[dtype]
    a = np.asarray(actual, dtype=np.float64)
    e = np.asarray(expected, dtype=np.float64)
    return a.shape == e.shape and bool(np.allclose(a, e, atol=atol, rtol=rtol, equal_nan=True))
