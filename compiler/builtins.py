"""Tensor operations of the language with their shape and dtype rules: the operators, the
builtin functions, and folding of compile-time scalars. Each takes the elaborator `el`
(for `el.node`, `el.shape`, `el.dtype`, `el.error`) and the AST node `at` that positions
the ops it adds and the errors it raises."""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from lpu.compiler import ops
from lpu.compiler import semantics as S

REQUIRED = object()


@dataclass(frozen=True)
class Tensor:
    """A value computed at run time: the id of the IR node that produces it."""
    id: int


def describe(v) -> str:
    if isinstance(v, Tensor):
        return "a tensor"
    if isinstance(v, list):
        return "a list"
    return "a float" if isinstance(v, float) else "an integer"


def fmt(shape) -> str:
    return "[" + ", ".join(str(s) for s in shape) + "]"


# ---- compile-time scalars ----------------------------------------------------------------

def fold_binary(el, op: str, a, b, at):
    if op == "%":
        if not (isinstance(a, int) and isinstance(b, int)):
            el.error(at, "`%` works only on compile-time integers")
        if b == 0:
            el.error(at, "integer modulo by zero")
        return a % b
    if op == "/":
        if b == 0:
            el.error(at, "division by zero")
        if isinstance(a, int) and isinstance(b, int):
            if a % b:
                el.error(at, f"integer division is not exact: {a} / {b} leaves remainder {a % b}",
                         "compile-time integers divide exactly; use a float literal (1.0 * x) for a fraction")
            return a // b
        return float(a) / float(b)
    if op == "@":
        el.error(at, "`@` needs tensors, got compile-time numbers")
    if isinstance(a, int) and isinstance(b, int) and op in ("+", "-", "*"):
        return {"+": a + b, "-": a - b, "*": a * b}[op]   # exact; the elaborator checks the range
    return fold(el, ops.OPERATORS[op], [a, b], at, op)


def _scalar_dtype(v) -> str:
    return "f32" if isinstance(v, float) else "i32"


def fold(el, op: str, args: list, at, shown: str | None = None):
    """An elementwise op on compile-time numbers, with the op table's formula in f64 (or i64):
    an int when the op's dtype rule gives an integer, else a float."""
    try:
        with np.errstate(divide="raise", invalid="raise", over="raise", under="ignore"):
            r = ops.OPS[op].fn(*(np.float64(v) if isinstance(v, float) else np.int64(v) for v in args))
    except (FloatingPointError, OverflowError, ZeroDivisionError):
        el.error(at, f"`{shown or op}({', '.join(map(str, args))})` is undefined")
    return float(r) if S.is_float(ops.result_dtype(op, *map(_scalar_dtype, args))) else int(r)


def fold_cast(to: str, x):
    if S.is_float(to):
        return float(S.convert(np.array(x, dtype=np.float64), to))
    return int(S.convert(np.array(x, dtype=np.float64), to))


# ---- tensor ops --------------------------------------------------------------------------

def const(el, value, dtype: str, at) -> Tensor:
    if not S.is_float(dtype) and not -2**31 <= value < 2**31:
        el.error(at, f"integer literal {value} does not fit i32")
    return el.node("const", [], (), dtype, {"value": np.array(value, dtype=S.NP_DTYPE[dtype])}, at)


BINOP = ops.OPERATORS      # `+` -> add, `<` -> lt, ...


def elementwise(el, op: str, args: list, at, shown: str | None = None):
    """An elementwise op of the table on tensors and compile-time numbers (at least one tensor,
    else it folds). Shapes broadcast as in numpy; a number takes the dtype of the tensors it
    meets (a float with integer tensors: f32) and becomes a scalar constant. `where`'s condition
    only selects: it takes no part in promotion and must be a tensor."""
    d = ops.OPS[op]
    shown = shown or d.spell or op
    for v in args:
        if isinstance(v, list):
            el.error(at, f"`{shown}` got a list: lists exist only at compile time (use concat)")
    if not any(isinstance(v, Tensor) for v in args):
        return fold(el, op, args, at, shown)
    first = 1 if d.family == "select" else 0
    if first:
        tensor_arg(el, args[0], shown, at)
    vals = args[first:]
    tdts = [el.dtype(v) for v in vals if isinstance(v, Tensor)]
    scalars = [v for v in vals if not isinstance(v, Tensor)]
    tdt = None
    for dt in tdts:
        tdt = dt if tdt is None else ops.promote(tdt, dt)
    any_float = any(isinstance(v, float) for v in scalars)
    sdt = ("f32" if any_float else "i32") if tdt is None else ops.promote_weak(tdt, any_float)
    result = ops.result_dtype(op, *(el.dtype(v) if isinstance(v, Tensor) else sdt for v in args))
    if any_float and tdts and not any(map(S.is_float, tdts)) and not S.is_float(result):
        # an integer tensor meets a float number and the result is no float (a comparison):
        # compare in f32, which the VXM sees from the operand's dtype
        args = args[:first] + [cast(el, "f32", v, at) if isinstance(v, Tensor) else v for v in vals]
    cdt = "f32" if S.is_float(sdt) else "i32"
    ins = [v if isinstance(v, Tensor) else const(el, v, cdt, at) for v in args]
    try:
        shape = np.broadcast_shapes(*(el.shape(v) for v in ins))
    except ValueError:
        el.error(at, f"shape mismatch in `{shown}`: "
                     f"{' and '.join(fmt(el.shape(v)) for v in ins if isinstance(v, Tensor))} do not broadcast")
    return el.node(op, [v.id for v in ins], shape, result, {}, at)


def binary(el, op: str, a, b, at, name: str | None = None):
    """`a op b` where at least one side is a tensor; op is an elementwise op of the table."""
    return elementwise(el, op, [a, b], at, name)


def matmul(el, a, b, at):
    if not (isinstance(a, Tensor) and isinstance(b, Tensor)):
        el.error(at, f"`@` needs two tensors, got {describe(a)} and {describe(b)}")
    sa, sb = el.shape(a), el.shape(b)
    if len(sa) not in (2, 3) or len(sb) not in (2, 3):
        el.error(at, f"`@` takes 2-D or 3-D tensors, got {fmt(sa)} @ {fmt(sb)}")
    if sa[-1] != sb[-2]:
        el.error(at, f"shape mismatch in `@`: {fmt(sa)} @ {fmt(sb)} (inner dimensions {sa[-1]} and {sb[-2]} differ)")
    if len(sa) == 3 and len(sb) == 3 and sa[0] != sb[0]:
        el.error(at, f"shape mismatch in `@`: {fmt(sa)} @ {fmt(sb)} (batch dimensions differ)")
    da, db = el.dtype(a), el.dtype(b)
    dtype = S.matmul_result(da, db)
    if dtype is None:
        el.error(at, f"matmul takes i8 or float operands, got {da} @ {db}",
                 "cast both sides to f16, or both to i8")
    batch = sa[:-2] or sb[:-2]
    return el.node("matmul", [a.id, b.id], (*batch, sa[-2], sb[-1]), dtype, {}, at)


def unary(el, op: str, x, at):
    return elementwise(el, op, [x], at)


def tensor_arg(el, v, fn: str, at) -> Tensor:
    if not isinstance(v, Tensor):
        el.error(at, f"`{fn}` needs a tensor, got {describe(v)}")
    return v


def int_arg(el, v, what: str, at) -> int:
    if not isinstance(v, int):
        el.error(at, f"{what} must be a compile-time integer, got {describe(v)}")
    return v


def axis_arg(el, v, rank: int, at) -> int:
    a = int_arg(el, v, "axis", at)
    if not -rank <= a < rank:
        el.error(at, f"axis {a} is out of range for a tensor of rank {rank}")
    return a % rank


def transpose(el, x, perm, at):
    if sorted(perm) != list(range(len(el.shape(x)))):
        el.error(at, f"{perm} is not a permutation of the axes of a {fmt(el.shape(x))} tensor")
    shape = tuple(el.shape(x)[p] for p in perm)
    return el.node("transpose", [x.id], shape, el.dtype(x), {"perm": tuple(perm)}, at)


def cast(el, to: str, x, at):
    if isinstance(x, (int, float)):
        return fold_cast(to, x)
    x = tensor_arg(el, x, to, at)
    if el.dtype(x) == to:
        return x
    return el.node("cast", [x.id], el.shape(x), to, {"to": to}, at)


# ---- builtin functions: name -> (parameters, handler(el, args, at)) ----------------------

def _reduce(op):
    def run(el, a, at):
        x = tensor_arg(el, a["x"], op, at)
        if isinstance(a["axis"], Tensor):
            el.error(at, f"`{op}` reduces one tensor along an axis, got a tensor as the axis",
                     "for an elementwise max or min of two tensors, use maximum(a, b) or minimum(a, b)")
        axis = axis_arg(el, a["axis"], len(el.shape(x)), at)
        shape = tuple(1 if i == axis else s for i, s in enumerate(el.shape(x)))
        return el.node(op, [x.id], shape, S.reduce_result(op, el.dtype(x)), {"axis": axis}, at)
    return [("x", REQUIRED), ("axis", -1)], run


PARAMS = {1: ("x",), 2: ("a", "b"), 3: ("cond", "a", "b")}


def _elementwise_fn(op):
    names = PARAMS[ops.OPS[op].arity]
    return ([(p, REQUIRED) for p in names],
            lambda el, a, at: elementwise(el, op, [a[p] for p in names], at, ops.OPS[op].spell))


def _cast_fn(to):
    return [("x", REQUIRED)], lambda el, a, at: cast(el, to, a["x"], at)


def _int_list(el, v, what, at) -> list[int]:
    if not isinstance(v, list) or not all(isinstance(i, int) for i in v):
        el.error(at, f"{what} must be a list of compile-time integers, like [1, 0]")
    return v


def _transpose(el, a, at):
    x = tensor_arg(el, a["x"], "transpose", at)
    perm = [p % len(el.shape(x)) if -len(el.shape(x)) <= p < 0 else p
            for p in _int_list(el, a["perm"], "the permutation", at)]
    return transpose(el, x, perm, at)


def _reshape(el, a, at):
    x = tensor_arg(el, a["x"], "reshape", at)
    dims = _int_list(el, a["shape"], "the shape", at)
    size = math.prod(el.shape(x))
    if dims.count(-1) == 1:
        rest = math.prod(d for d in dims if d != -1)
        if rest > 0 and size % rest == 0:
            dims = [size // rest if d == -1 else d for d in dims]
    if any(d <= 0 for d in dims) or math.prod(dims) != size:
        el.error(at, f"cannot reshape {fmt(el.shape(x))} ({size} elements) to {fmt(dims)}")
    return el.node("reshape", [x.id], tuple(dims), el.dtype(x), {"shape": tuple(dims)}, at)


def _concat(el, a, at):
    xs = a["xs"]
    if not isinstance(xs, list) or not xs or not all(isinstance(x, Tensor) for x in xs):
        el.error(at, "`concat` needs a non-empty list of tensors, like [f(i) for i in 0..H]")
    rank = len(el.shape(xs[0]))
    axis = axis_arg(el, a["axis"], rank, at)
    for x in xs[1:]:
        s0, s = el.shape(xs[0]), el.shape(x)
        if len(s) != rank or any(p != q for i, (p, q) in enumerate(zip(s0, s)) if i != axis):
            el.error(at, f"shape mismatch in `concat` along axis {axis}: {fmt(s0)} and {fmt(s)}")
    dtype = el.dtype(xs[0])
    for x in xs[1:]:
        dtype = ops.promote(dtype, el.dtype(x))
    xs = [cast(el, dtype, x, at) for x in xs]
    shape = list(el.shape(xs[0]))
    shape[axis] = sum(el.shape(x)[axis] for x in xs)
    if len(xs) == 1:
        return xs[0]
    return el.node("concat", [x.id for x in xs], shape, dtype, {"axis": axis}, at)


def _float_tensor(el, v, fn, at) -> Tensor:
    x = tensor_arg(el, v, fn, at)
    if len(el.shape(x)) < 2:
        el.error(at, f"`{fn}` needs a tensor of rank 2 or more, got {fmt(el.shape(x))}")
    if not S.is_float(el.dtype(x)):
        el.error(at, f"`{fn}` needs a float tensor, got {el.dtype(x)}", "cast it first: f16(...)")
    return x


def _causal(el, a, at):
    x = _float_tensor(el, a["x"], "causal", at)
    offset = int_arg(el, a["offset"], "the offset", at)
    return el.node("causal", [x.id], el.shape(x), el.dtype(x), {"offset": offset}, at)


def _rope(el, a, at):
    x = _float_tensor(el, a["x"], "rope", at)
    pos = int_arg(el, a["pos"], "the position", at)
    theta = a["theta"]
    if isinstance(theta, list | Tensor):
        el.error(at, f"theta must be a compile-time number, got {describe(theta)}")
    if el.shape(x)[-1] % 2:
        el.error(at, f"`rope` needs an even last dimension, got {fmt(el.shape(x))}")
    return el.node("rope", [x.id], el.shape(x), el.dtype(x), {"pos": pos, "theta": float(theta)}, at)


BUILTINS = {
    **{sp: _elementwise_fn(op) for sp, op in ops.BUILTIN.items() if op in ops.ELEMENTWISE},
    **{sp: _reduce(op) for sp, op in ops.BUILTIN.items() if op in ops.REDUCE},
    **{dt: _cast_fn(dt) for dt in S.DTYPES},
    "transpose": ([("x", REQUIRED), ("perm", REQUIRED)], _transpose),
    "reshape": ([("x", REQUIRED), ("shape", REQUIRED)], _reshape),
    "concat": ([("xs", REQUIRED), ("axis", 0)], _concat),
    "causal": ([("x", REQUIRED), ("offset", 0)], _causal),
    "rope": ([("x", REQUIRED), ("pos", REQUIRED), ("theta", 10000.0)], _rope),
}
