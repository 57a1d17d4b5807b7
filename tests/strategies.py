"""Hypothesis strategies: random well-typed DSL programs (as text) and random small machines.

`programs()` builds a DAG: a few declared tensors, then ops that each draw their inputs from
the values defined so far (declaring a new weight when no earlier value fits), over the dtypes
i8, f16, f32, i32, bf16 and the ops of the language (elementwise, comparisons, `where`, casts,
matmul with valid dtype pairs, reductions, slices, concat, transpose, reshape, causal, rope,
softmax and layernorm from the prelude, stores into a state), with dimensions that are mostly not multiples of the lane
count. The result is a `Dsl`, whose repr is the program text, ready to paste into a .lpu file.

`machines()` derives small configs from isa/machines/tiny.toml: lanes, MEM slices per
hemisphere (a multiple of 4), streams (>= 8), MXM pair cycles, ALUs, SXM queues, skew and
every latency.
"""
from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass, field

from hypothesis import strategies as st

from lpu.compiler import semantics as S
from lpu.isa.machine import MACHINES_DIR, MachineConfig

DIMS = (1, 2, 3, 5, 6, 7, 9, 11, 13, 17, 19, 20, 23)   # few multiples of 4, 8 or 16 lanes
ROWS = (1, 2, 3, 4, 5)
DTYPES = ("f16", "f32", "i8", "i32", "bf16")
FLOAT_UNARY = ("tanh", "sigmoid", "silu", "gelu")
SAFE_UNARY = ("relu", "abs", "-")
POSITIVE_UNARY = ("sqrt", "log", "rsqrt")   # applied to abs(x) + 1
OPS = ("binary", "binary", "scalar", "unary", "cast", "matmul", "matmul", "reduce", "slice",
       "concat", "transpose", "reshape", "causal", "softmax", "layernorm", "rope", "store",
       "compare", "where")
COMPARE = ("<", "<=", ">", ">=", "==", "!=")
LITERALS = ("2", "3", "0.5", "1.5", "-1.25")


@dataclass
class Dsl:
    """A generated program; repr() is its text."""
    text: str
    outputs: list = field(default_factory=list)

    def __repr__(self):
        return "\n# ---- generated program (paste into a .lpu file) ----\n" + self.text

    __str__ = __repr__


class _Builder:
    def __init__(self, draw):
        self.draw = draw
        self.decls: list[str] = []
        self.body: list[str] = []
        self.values: list[tuple[str, str, tuple]] = []   # (name, dtype, shape)
        self.n = 0

    def fresh(self, prefix="v") -> str:
        self.n += 1
        return f"{prefix}{self.n}"

    def declare(self, kind, dtype, shape) -> str:
        name = self.fresh({"input": "x", "weight": "w", "state": "s"}[kind])
        self.decls.append(f"{kind} {name} : {dtype}[{', '.join(map(str, shape))}]")
        if kind != "state":
            self.values.append((name, dtype, tuple(shape)))
        return name

    def define(self, expr, dtype, shape) -> str:
        name = self.fresh()
        self.body.append(f"{name} = {expr}")
        self.values.append((name, dtype, tuple(shape)))
        return name

    def pick(self, pred=lambda v: True):
        cands = [v for v in self.values if pred(v)]
        return self.draw(st.sampled_from(cands)) if cands else None

    def dim(self):
        return self.draw(st.sampled_from(DIMS))

    def float_value(self):
        v = self.pick(lambda v: S.is_float(v[1]))
        if v is None:
            v = self.pick()
            dt = self.draw(st.sampled_from(("f16", "f32")))
            return (f"{dt}({v[0]})", dt, v[2])
        return v

    # ---- ops ---------------------------------------------------------------------------------
    def op(self, kind):
        d = self.draw
        if kind == "binary":
            a = self.pick()
            opn = d(st.sampled_from(("+", "-", "*", "maximum", "minimum")))
            shapes = [a[2], (1, a[2][1]), (a[2][0], 1)]
            b = self.pick(lambda v: v[2] in shapes and v is not a)
            if b is None:
                b = (self.declare("weight", d(st.sampled_from(DTYPES)), d(st.sampled_from(shapes))),)
                b = self.values[-1]
            if d(st.booleans()):
                a, b = b, a
            shape = tuple(max(x, y) for x, y in zip(a[2], b[2]))
            expr = f"{opn}({a[0]}, {b[0]})" if opn[0].isalpha() else f"{a[0]} {opn} {b[0]}"
            return self.define(expr, S.binary_result(_IR[opn], a[1], b[1]), shape)
        if kind == "scalar":
            a = self.pick()
            lit = d(st.sampled_from(LITERALS))
            opn = d(st.sampled_from(("+", "-", "*", "/"))) if "." in lit else d(st.sampled_from(("+", "-", "*")))
            dt = S.promote_weak(a[1], "." in lit)
            if opn == "/" and not S.is_float(dt):
                dt = "f32"
            expr = f"{a[0]} {opn} {lit}" if d(st.booleans()) else f"{lit} {opn} {a[0]}"
            return self.define(expr, dt, a[2])
        if kind == "unary":
            a = self.pick()
            f = d(st.sampled_from(SAFE_UNARY + FLOAT_UNARY + POSITIVE_UNARY))
            if f == "-":
                return self.define(f"-{a[0]}", a[1], a[2])
            if f in POSITIVE_UNARY:
                inner = f"abs({a[0]}) + 1.0" if S.is_float(a[1]) else f"f32(abs({a[0]})) + 1.0"
                return self.define(f"{f}({inner})", S.promote_weak(a[1], True), a[2])
            return self.define(f"{f}({a[0]})", S.unary_result(_IR.get(f, f), a[1]), a[2])
        if kind == "cast":
            a = self.pick()
            to = d(st.sampled_from(DTYPES))
            return self.define(f"{to}({a[0]})", to, a[2])
        if kind == "matmul":
            a = self.pick()
            integer = a[1] == "i8" or (a[1] == "i32" and d(st.booleans()))
            lhs = a[0] if a[1] in (("i8",) if integer else ("f16", "f32", "bf16")) else f"{'i8' if integer else 'f16'}({a[0]})"
            k = a[2][1]
            trans = d(st.booleans())
            okdt = ("i8",) if integer else ("f16", "f32", "bf16")
            want = (lambda v: v[1] in okdt and v[2][1 if trans else 0] == k and v[0] != a[0])
            b = self.pick(want) if d(st.booleans()) else None
            if b is None:
                n = self.dim()
                b = (self.declare("weight", d(st.sampled_from(okdt)), (n, k) if trans else (k, n)),)
                b = self.values[-1]
            n = b[2][0] if trans else b[2][1]
            return self.define(f"{lhs} @ {b[0]}{'.T' if trans else ''}", "i32" if integer else "f32", (a[2][0], n))
        if kind == "reduce":
            a = self.pick()
            f = d(st.sampled_from(("sum", "max", "mean")))
            if d(st.booleans()):          # across vectors (rows) or across lanes
                return self.define(f"{f}({a[0]}, axis=0)", S.reduce_result(f, a[1]), (1, a[2][1]))
            return self.define(f"{f}({a[0]}, axis=-1)", S.reduce_result(f, a[1]), (a[2][0], 1))
        if kind == "slice":
            a = self.pick()
            (r, c) = a[2]
            r0 = d(st.integers(0, r - 1))
            r1 = d(st.integers(r0 + 1, r))
            c0 = d(st.integers(0, c - 1))
            c1 = d(st.integers(c0 + 1, c))
            return self.define(f"{a[0]}[{r0}:{r1}, {c0}:{c1}]", a[1], (r1 - r0, c1 - c0))
        if kind == "concat":
            a = self.pick()
            axis = d(st.sampled_from((0, 1)))
            b = self.pick(lambda v: v[1] == a[1] and v[2][1 - axis] == a[2][1 - axis])
            shape = list(a[2])
            shape[axis] += b[2][axis]
            return self.define(f"concat([{a[0]}, {b[0]}], axis={axis})", a[1], tuple(shape))
        if kind == "transpose":
            a = self.pick()
            expr = f"{a[0]}.T" if d(st.booleans()) else f"transpose({a[0]}, [1, 0])"
            return self.define(expr, a[1], a[2][::-1])
        if kind == "reshape":
            a = self.pick()
            size = a[2][0] * a[2][1]
            divs = [x for x in range(1, size + 1) if size % x == 0]
            c = d(st.sampled_from(divs))
            return self.define(f"reshape({a[0]}, [{size // c}, {c}])", a[1], (size // c, c))
        if kind == "causal":
            a = self.float_value()
            off = d(st.integers(-1, 2))
            return self.define(f"causal({a[0]}{f', offset={off}' if off else ''})", a[1], a[2])
        if kind == "softmax":
            a = self.float_value()
            return self.define(f"softmax({a[0]})", a[1], a[2])
        if kind == "layernorm":
            a = self.float_value()
            c = a[2][1]
            g = self.declare("weight", "f32", (c,))
            b = self.declare("weight", "f32", (c,))
            self.values = [v for v in self.values if v[0] not in (g, b)]
            return self.define(f"layernorm({a[0]}, {g}, {b})", "f32", a[2])
        if kind == "rope":
            a = self.float_value()
            if a[2][1] % 2:
                return None
            return self.define(f"rope({a[0]}, {d(st.integers(0, 5))})", a[1], a[2])
        if kind == "store":
            a = self.pick()
            r, c = a[2]
            extra = d(st.integers(0, 2))
            s = self.declare("state", a[1], (r + extra, c))
            at = d(st.integers(0, extra))
            self.body.append(f"{s}[{at}:{at + r}, :] <- {a[0]}")
            return self.define(f"{s}[0:{r + extra}, :]", a[1], (r + extra, c))
        if kind == "compare":
            a = self.pick()
            opn = d(st.sampled_from(COMPARE))
            if d(st.booleans()):
                b = self.broadcast_partner(a)
                shape = tuple(max(x, y) for x, y in zip(a[2], b[2]))
                return self.define(f"{a[0]} {opn} {b[0]}", "i8", shape)
            lit = d(st.sampled_from(LITERALS))
            expr = f"{a[0]} {opn} {lit}" if d(st.booleans()) else f"{lit} {opn} {a[0]}"
            return self.define(expr, "i8", a[2])
        if kind == "where":
            a = self.pick()
            c = self.broadcast_partner(a)
            if d(st.booleans()):       # an inline comparison as the condition
                c = (f"{c[0]} {d(st.sampled_from(COMPARE))} {d(st.sampled_from(LITERALS))}", "i8", c[2])
            shape = tuple(max(x, y) for x, y in zip(a[2], c[2]))
            if d(st.booleans()):
                lit = d(st.sampled_from(LITERALS))
                dt = S.promote_weak(a[1], "." in lit)
                args = [a[0], lit] if d(st.booleans()) else [lit, a[0]]
            else:
                b = self.pick(lambda v: v[2] in (a[2], (1, a[2][1]), (a[2][0], 1)) and v is not a) or a
                dt = S.promote(a[1], b[1])
                shape = tuple(max(x, y) for x, y in zip(shape, b[2]))
                args = [a[0], b[0]]
            return self.define(f"where({c[0]}, {args[0]}, {args[1]})", dt, shape)
        raise AssertionError(kind)

    def broadcast_partner(self, a):
        """A value whose shape broadcasts with a's (a new weight when none does)."""
        d = self.draw
        shapes = [a[2], (1, a[2][1]), (a[2][0], 1)]
        b = self.pick(lambda v: v[2] in shapes and v is not a)
        if b is None:
            self.declare("weight", d(st.sampled_from(DTYPES)), d(st.sampled_from(shapes)))
            b = self.values[-1]
        return b


_IR = {"+": "add", "-": "sub", "*": "mul", "/": "div", "maximum": "maximum", "minimum": "minimum"}


@st.composite
def programs(draw, max_ops: int = 6, ops=OPS, dtypes=DTYPES) -> Dsl:
    """A random well-typed program over `dtypes` using op kinds from `ops`."""
    b = _Builder(draw)
    for _ in range(draw(st.integers(1, 2))):
        b.declare("input", draw(st.sampled_from(dtypes)), (draw(st.sampled_from(ROWS)), b.dim()))
    for _ in range(draw(st.integers(1, max_ops))):
        b.op(draw(st.sampled_from(ops)))
    defined = [v for v in b.values if not v[0].startswith(("x", "w"))] or b.values[:1]
    outs = [defined[-1]]
    if len(defined) > 1 and draw(st.booleans()):
        outs.append(draw(st.sampled_from(defined[:-1])))
    lines = list(b.decls) + b.body
    for i, v in enumerate(outs):
        lines.append(f"output y{i} = {v[0]}")
    return Dsl("\n".join(lines) + "\n", [f"y{i}" for i in range(len(outs))])


def tiny_dict() -> dict:
    with open(os.path.join(MACHINES_DIR, "tiny.toml"), "rb") as f:
        return tomllib.load(f)


@st.composite
def machines(draw) -> MachineConfig:
    """A small machine derived from tiny.toml."""
    d = tiny_dict()
    d["name"] = "random"
    d["superlanes"] = draw(st.sampled_from((1, 2)))
    d["lanes_per_superlane"] = draw(st.sampled_from((4, 8)))
    d["mem_slices_per_hemisphere"] = draw(st.sampled_from((4, 8, 12)))
    d["streams_per_direction"] = draw(st.integers(8, 16))      # >= 8: two f32 operands side by side
    d["lw_ports_per_plane"] = draw(st.sampled_from((1, 2, 4)))
    d["f16_pair_cycles"] = draw(st.sampled_from((1, 2)))
    d["vxm_alus"] = draw(st.sampled_from((2, 3, 4)))   # configs need 2 (isa/machine.py)
    d["sxm_queues_per_hemisphere"] = draw(st.sampled_from((1, 2)))
    d["icu_skew"] = draw(st.sampled_from((0, 1, 3)))
    d["latency"] = {k: draw(st.integers(1, 5)) for k in d["latency"]}
    return MachineConfig.from_dict(d, source="<hypothesis>")
