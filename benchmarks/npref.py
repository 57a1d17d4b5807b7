"""A plain float32 numpy evaluation of an IR graph: the "numpy time" baseline of the emulator
speed benchmark (issue 7: "the time numpy (float32, same machine, same run) takes to compute
the same program's reference").

Every tensor is float32; a matmul is one `a @ b` in float32 (BLAS); other ops are their numpy
formula in float32. Casts round as the language says (f16 through np.float16, integers by rint
and saturation) so the result stays close to the golden model (compiler/reference.py), which
a test checks, but none of the golden model's f64 K-tiling is done: this is the arithmetic a
numpy user would write, done once."""
from __future__ import annotations

import numpy as np

from lpu.compiler import semantics as S
from lpu.compiler.ir import IRGraph, Node
from lpu.compiler.ops import ELEMENTWISE, OPS, REDUCE
from lpu.compiler.reference import MOVES, move
from lpu.isa.dtypes import INT_RANGE

F32 = np.float32


def _cast(x: np.ndarray, dtype: str) -> np.ndarray:
    if dtype in ("f16", "bf16"):
        return S.convert(x, dtype).astype(F32)
    if dtype in INT_RANGE:
        lo, hi = INT_RANGE[dtype]
        return np.clip(np.rint(x), lo, hi).astype(F32)
    return x


def _eval(n: Node, xs: list[np.ndarray]) -> np.ndarray:
    op, a = n.op, n.attrs
    if op == "const":
        return np.asarray(a["value"], F32)
    if op == "cast":
        return _cast(xs[0], n.dtype)
    if op in ELEMENTWISE:
        return OPS[op].fn(*xs).astype(F32, copy=False)
    if op in REDUCE:
        r = OPS[op].fn(xs[0], axis=a["axis"], keepdims=True)
        return (r / F32(xs[0].shape[a["axis"]])) if op == "mean" else r
    if op == "matmul":
        return xs[0] @ xs[1]
    if op in MOVES:
        return move(n, xs)
    if op == "rope":
        return S.rope(xs[0], a["pos"], a["theta"], "f32")
    if op == "store":
        out = xs[0].copy()
        out[tuple(slice(lo, hi) for lo, hi in a["index"])] = xs[1]
        return out
    if op == "output":
        return xs[0]
    raise AssertionError(f"npref: no float32 formula for op {op}")


def prepare(graph: IRGraph, values: dict) -> dict[int, np.ndarray]:
    """The declared tensors as float32 arrays, keyed by leaf node id (done once, not timed)."""
    return {nid: np.asarray(values[name], F32) for name, nid in graph.decls.items()}


def evaluate(graph: IRGraph, leaves: dict[int, np.ndarray], nodes: list[Node] | None = None) -> dict:
    """Outputs (name -> float32 array) of the graph on the prepared leaves."""
    env = dict(leaves)
    with np.errstate(all="ignore"):
        for n in nodes if nodes is not None else graph.nodes():
            if n.id not in env:
                env[n.id] = _eval(n, [env[i] for i in n.inputs])
    return {name: env[nid] for name, nid in graph.outputs.items()}
