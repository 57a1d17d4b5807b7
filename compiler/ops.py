"""The one table of the language's ops. Every stage reads it instead of keeping its own list:
elaboration (ir, builtins: names, arity, spelling, shape and dtype rules, constant folding),
the reference (semantics, reference: the numpy formula), lowering (lower_ops: the VXM opcode or
the lowering routine), the GPU baseline (cost class and flops per element) and the cycle
bounds (bound class and the latency keys on the op's path).

Each op (`OpDef`):

  name      the IR op name
  family    leaf | unary | binary | compare | select | cast | reduce | movement | matmul |
            positional | effect   (the family sets below are derived from it)
  arity     tensor inputs (-1: any number, concat)
  spell     how a program writes it: an operator (`+`, `<`, ...) or a builtin's name; "" if
            the language has no direct spelling (casts are `f16(x)` ..., stores `<-`)
  shape     broadcast (numpy broadcasting of the inputs) | keep_axis (the reduced axis kept
            with size 1) | matmul | attrs (given by the op's attributes) | none (leaves)
  result    the dtype rule: same | float (integers give f32) | promote | promote_float (div:
            integers give f32) | mask (i8 0/1) | select (promote of the two values) | sum (i8
            gives i32) | mean (integers give f32) | matmul | attrs (the cast's target)
  fn        the numpy formula, on arrays already in the compute dtype (semantics.py converts
            operands and result); unary formulas also fold compile-time scalars (in f64)
  vxm       the VXM opcode an elementwise op lowers to (one instruction per output vector)
  lower     the lowering routine (lower_ops.LOWERING) for every other computed op
  gpu       the GPU cost class: leaf | elementwise (fusable) | reduction | matmul | view |
            concat | store;  flops: CUDA-core flops per output element (per input element for
            reductions)
  bound     the bound class (benchmarks/bounds.py): mem | free | vxm | reduce | mxm;  path:
            latency keys of the dependent VXM steps of one vector (derived from the VXM opcode)

Masks: comparisons give i8 0/1 (a bool-like dtype: 1 byte per element, sums count in i32,
promotes with any other dtype to that dtype). `where(c, a, b)` takes any dtype as its condition
(non-zero, NaN included, is true) and gives the promoted dtype of a and b.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from lpu.isa import opcodes as O
from lpu.isa.dtypes import NP_DTYPE, is_float


@dataclass(frozen=True)
class OpDef:
    name: str
    family: str
    arity: int
    spell: str = ""
    shape: str = "broadcast"
    result: str = "same"
    fn: object = None
    vxm: str = ""
    lower: str = ""
    gpu: str = "elementwise"
    flops: float = 1
    bound: str = "vxm"
    path: tuple = field(default=())


OPS: dict[str, OpDef] = {}


def define(op: OpDef) -> OpDef:
    """Add an op to the table (before other modules read it) and refresh the derived sets."""
    if op.vxm and not op.path:
        op = OpDef(**{**op.__dict__, "path": (O.BY_NAME[op.vxm].latency,)})
    OPS[op.name] = op
    _derive()
    return op


def _derive():
    """The family sets and spellings, recomputed from the table whenever it changes."""
    global LEAVES, UNARY, BINARY, COMPARE, ELEMENTWISE, REDUCE, OPERATORS, BUILTIN
    fam = {}
    for d in OPS.values():
        fam.setdefault(d.family, set()).add(d.name)
    f = lambda *names: frozenset().union(*(fam.get(n, ()) for n in names))   # noqa: E731
    LEAVES, UNARY, BINARY, COMPARE = f("leaf"), f("unary"), f("binary"), f("compare")
    ELEMENTWISE = f("unary", "binary", "compare", "select", "cast")    # element by element
    REDUCE = f("reduce")
    OPERATORS = {d.spell: d.name for d in OPS.values()                   # `a < b` -> lt
                 if d.arity == 2 and d.spell and not d.spell.isidentifier()}
    BUILTIN = {d.spell: d.name for d in OPS.values() if d.spell.isidentifier()}   # `exp(x)` -> exp


def gpu_class(cls: str) -> frozenset:
    return frozenset(d.name for d in OPS.values() if d.gpu == cls)


# ---- dtype rules -------------------------------------------------------------------------

def _np_name(dt) -> str:
    dt = np.dtype(dt)
    if dt.kind == "f":
        return "f16" if dt.itemsize == 2 else "f32"
    return "i8" if dt.itemsize == 1 else "i32"


def promote(a: str, b: str) -> str:
    """numpy promotion of two tensor dtypes (f64 and i64 mapped to f32 and i32); bf16 with an
    integer or bf16 stays bf16, with f16 or f32 gives f32."""
    if "bf16" in (a, b):
        other = b if a == "bf16" else a
        return "bf16" if other == "bf16" or not is_float(other) else "f32"
    return _np_name(np.result_type(NP_DTYPE[a], NP_DTYPE[b]))


def promote_weak(tensor: str, scalar_is_float: bool) -> str:
    """A tensor with a scalar literal keeps its dtype, except int tensor with a float -> f32."""
    return "f32" if scalar_is_float and not is_float(tensor) else tensor


def _matmul_rule(a: str, b: str) -> str | None:
    """i8 @ i8 -> i32; floats @ floats -> f32; anything else is not a matmul (None)."""
    if a == "i8" and b == "i8":
        return "i32"
    return "f32" if is_float(a) and is_float(b) else None


def _float(x: str) -> str:
    return x if is_float(x) else "f32"


RESULT_RULES = {
    "same": lambda x, *_: x,
    "float": lambda x: _float(x),
    "promote": promote,
    "promote_float": lambda a, b: _float(promote(a, b)),
    "mask": lambda *_: "i8",
    "select": lambda c, a, b: promote(a, b),
    "sum": lambda x: "i32" if x == "i8" else x,
    "mean": lambda x: _float(x),
    "matmul": _matmul_rule,
}


def result_dtype(op: str, *dtypes: str) -> str | None:
    """The dtype of op applied to inputs of `dtypes` (casts: their target is an attribute)."""
    return RESULT_RULES[OPS[op].result](*dtypes)


# ---- numpy formulas (in the compute dtype) -----------------------------------------------

def _sigmoid(x):
    return np.float32(1) / (np.float32(1) + np.exp(-x))


def _gelu(x):
    c, k = np.float32(0.7978845608), np.float32(0.044715)
    return np.float32(0.5) * x * (np.float32(1) + np.tanh(c * (x + k * x * x * x)))


def _compare(f):
    return lambda a, b: f(a, b).astype(np.result_type(a, b))


def _where(c, a, b):
    return np.where(c != 0, a, b)


# ---- the table -----------------------------------------------------------------------------

for _n in ("input", "weight", "state", "const"):
    define(OpDef(_n, "leaf", 0, shape="none", gpu="leaf", flops=0, bound="mem"))

for _n, _vxm, _rule, _fl, _fn in (
        ("neg", "NEG", "same", 1, np.negative),
        ("abs", "ABS", "same", 1, np.abs),
        ("relu", "RELU", "same", 1, lambda x: np.maximum(x, x.dtype.type(0))),
        ("exp", "EXP", "float", 4, np.exp),
        ("log", "LOG", "float", 4, np.log),
        ("sqrt", "SQRT", "float", 4, np.sqrt),
        ("rsqrt", "RSQRT", "float", 4, lambda x: np.float32(1) / np.sqrt(x)),
        ("tanh", "TANH", "float", 4, np.tanh),
        ("sigmoid", "SIGMOID", "float", 6, _sigmoid),
        ("silu", "SILU", "float", 7, lambda x: x * _sigmoid(x)),
        ("gelu", "GELU", "float", 10, _gelu)):
    define(OpDef(_n, "unary", 1, "" if _n == "neg" else _n, result=_rule, fn=_fn, vxm=_vxm, flops=_fl))

for _n, _sp, _vxm, _rule, _fl, _fn in (
        ("add", "+", "ADD", "promote", 1, np.add),
        ("sub", "-", "SUB", "promote", 1, np.subtract),
        ("mul", "*", "MUL", "promote", 1, np.multiply),
        ("div", "/", "DIV", "promote_float", 4, np.divide),
        ("maximum", "maximum", "MAX", "promote", 1, np.maximum),
        ("minimum", "minimum", "MIN", "promote", 1, np.minimum)):
    define(OpDef(_n, "binary", 2, _sp, result=_rule, fn=_fn, vxm=_vxm, flops=_fl))

for _n, _sp, _vxm, _fn in (
        ("lt", "<", "LT", np.less), ("le", "<=", "LE", np.less_equal),
        ("gt", ">", "GT", np.greater), ("ge", ">=", "GE", np.greater_equal),
        ("eq", "==", "EQ", np.equal), ("ne", "!=", "NE", np.not_equal)):
    define(OpDef(_n, "compare", 2, _sp, result="mask", fn=_compare(_fn), vxm=_vxm))

# where: KEEP(a, c) and DROP(b, c) side by side, then ADD (see lower_ops.lower_where)
define(OpDef("where", "select", 3, "where", result="select", fn=_where, lower="where",
             path=(O.BY_NAME["KEEP"].latency, O.BY_NAME["ADD"].latency)))
define(OpDef("cast", "cast", 1, result="attrs", vxm="CONV", bound="free"))

for _n, _fn, _vxm in (("sum", np.sum, "ADD"), ("max", np.max, "MAX"), ("mean", np.sum, "ADD")):
    # mean divides after the sum; path: one combining step (lane trees: benchmarks/bounds.py)
    define(OpDef(_n, "reduce", 1, _n, "keep_axis", _n if _n != "max" else "same", fn=_fn,
                 lower="reduce", gpu="reduction", bound="reduce", path=(O.BY_NAME[_vxm].latency,)))

for _n, _low in (("transpose", "transpose"), ("reshape", "move"), ("slice", "move"), ("concat", "move")):
    define(OpDef(_n, "movement", -1 if _n == "concat" else 1, _n if _n != "slice" else "", "attrs",
                 lower=_low, gpu="concat" if _n == "concat" else "view", flops=0, bound="free"))

define(OpDef("matmul", "matmul", 2, "@", "matmul", "matmul", lower="matmul", gpu="matmul", flops=0,
             bound="mxm"))
define(OpDef("causal", "positional", 1, "causal", "attrs", lower="causal", path=(O.BY_NAME["MASK"].latency,)))
define(OpDef("rope", "positional", 1, "rope", "attrs", lower="rope", flops=6, path=("vxm",)))
define(OpDef("store", "effect", 2, "", "attrs", lower="store", gpu="store", flops=0, bound="free"))
# not in the language (compiler/rewrite.py: a wide f16 row's lane sum): per row, the sum of its
# chunks and their rotations by lanes / 2, times `scale`, as f16 lo and hi halves (semantics.py)
define(OpDef("lanefold", "fold", 1, "", "attrs", "attrs", lower="lanefold", gpu="reduction", bound="reduce",
             path=(O.BY_NAME["ADD"].latency,)))
# not in the language (compiler/rewrite_pair.py: two heads' probabilities as one row): runs of
# columns of x [R, W] transposed, those step apart stacked (semantics.tfold)
define(OpDef("tfold", "movement", 1, "", "attrs", lower="tfold", gpu="view", flops=0, bound="free"))
define(OpDef("output", "effect", 1, "", "attrs", gpu="view", flops=0, bound="free"))
