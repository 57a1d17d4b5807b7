"""The numpy reference interpreter: evaluates every node of an IR graph with the rules of
compiler/semantics.py, giving the golden outputs and final states the emulator is compared with."""
from __future__ import annotations

import numpy as np

from lpu.compiler import draw_core
from lpu.compiler import semantics as S
from lpu.compiler.ir import IRGraph, Node
from lpu.compiler.ops import ELEMENTWISE, REDUCE
from lpu.isa.errors import LpuError


def _check_values(graph: IRGraph, values: dict) -> dict[int, np.ndarray]:
    env = {}
    for name, nid in graph.decls.items():
        n = graph.node(nid)
        if name not in values:
            raise LpuError(f"no value given for {n.op} `{name}` ({n.dtype}{list(n.shape)})")
        v = np.asarray(values[name])
        if v.shape != n.shape:
            raise LpuError(f"value for `{name}` has shape {list(v.shape)}, the program declares {list(n.shape)}")
        env[nid] = S.convert(v, n.dtype)
    return env


def _region(index) -> tuple:
    return tuple(slice(a, b) for a, b in index)


MOVES = frozenset({"transpose", "reshape", "slice", "concat", "causal"})


def move(n: Node, xs: list[np.ndarray]) -> np.ndarray:
    """The ops that only move (or mask) values: the same in every numeric model."""
    op, a = n.op, n.attrs
    if op == "transpose":
        return np.transpose(xs[0], a["perm"])
    if op == "reshape":
        return xs[0].reshape(a["shape"])
    if op == "slice":
        return xs[0][tuple(i if isinstance(i, int) else slice(*i) for i in a["index"])]
    if op == "concat":
        return np.concatenate(xs, axis=a["axis"])
    return S.causal(xs[0], a["offset"])


def _eval(n: Node, xs: list[np.ndarray], k_tile: int) -> np.ndarray:
    op, a = n.op, n.attrs
    if op == "const":
        return a["value"]
    if op == "cast":
        return S.convert(xs[0], n.dtype)
    if op in ELEMENTWISE:
        return S.elementwise(op, xs, n.dtype)
    if op in REDUCE:     # (a splat: the result in every lane, compiler/rewrite.py)
        r = S.reduce(op, xs[0], a["axis"], n.dtype)
        return np.broadcast_to(r, n.shape).copy() if a.get("splat") else r
    if op == "matmul":
        return S.matmul(xs[0], xs[1], n.dtype, k_tile)
    if op in MOVES:
        return move(n, xs)
    if op == "tfold":
        return S.tfold(xs[0], a["step"], a["parts"], a["starts"], a["count"])
    if op == "lanefold":
        return S.lanefold(xs[0], a["lanes"], a["scale"])
    if op == "rope":
        return S.rope(xs[0], a["pos"], a["theta"], n.dtype)
    if op == "store":
        out = xs[0].copy()
        out[_region(a["index"])] = S.convert(xs[1], n.dtype)
        return out
    if op == "output":
        return xs[0]
    raise AssertionError(f"no reference semantics for op {op}")


def run_reference(graph: IRGraph, values: dict, k_tile: int = 320) -> tuple[dict, dict]:
    """Evaluate the graph on `values` (declared name -> array). Returns (outputs, final_states),
    each a dict name -> array of the node's dtype. `k_tile` is the matmul K tile (the lanes)."""
    env = _check_values(graph, values)
    keep = set(graph.outputs.values()) | set(graph.final_states.values())
    last = {}                                # node id -> the last node that reads it
    for n in graph.nodes():
        for i in n.inputs:
            last[i] = n.id
    done_with = {}
    for i, u in last.items():
        if i not in keep:
            done_with.setdefault(u, []).append(i)
    for n in graph.nodes():
        if n.id in env:
            continue
        env[n.id] = _eval(n, [env[i] for i in n.inputs], k_tile)
        assert env[n.id].shape == n.shape and env[n.id].dtype == S.NP_DTYPE[n.dtype], (n, env[n.id].shape)
        for i in done_with.get(n.id, ()):    # a value no later node reads is let go (a model's
            env.pop(i, None)                 # casts of its weights, a state's old versions)
    outputs = {name: env[nid] for name, nid in graph.outputs.items()}
    states = {name: env[nid] for name, nid in graph.final_states.items()}
    return outputs, states


# ---- deterministic inputs ----------------------------------------------------------------

PASS_THROUGH = frozenset({"slice", "transpose", "reshape", "cast", "concat"})


def _matmul_fan_in(graph: IRGraph, nid: int) -> int | None:
    """K of the first matmul this leaf reaches as its right operand through shape ops, if any."""
    todo = [nid]
    while todo:
        cur = todo.pop()
        for u in graph.users(cur):
            n = graph.node(u)
            if n.op == "matmul" and n.inputs[1] == cur:
                return graph.node(cur).shape[-2]
            if n.op in PASS_THROUGH:
                todo.append(u)
    return None


CHUNK = 1 << 20     # integers drawn this many at a time (the same values as one draw of the whole)


def into_array(out: dict | None, name: str, shape, dtype) -> np.ndarray | None:
    """out[name] if it is an array of that shape and dtype (where the value is to be made)."""
    a = (out or {}).get(name)
    return a if a is not None and a.shape == tuple(shape) and a.dtype == np.dtype(dtype) else None


def random_integers(rng, shape, dtype, out: np.ndarray | None = None) -> np.ndarray:
    """rng.integers(-8, 9, size=shape).astype(dtype), drawn CHUNK values at a time into the
    result (`out` if given): the same values (numpy's bounded draw consumes the stream value by
    value), without the int64 array of the whole (Llama-2-7B's i8 weights: an 8-fold larger
    temporary, whose fresh pages cost more than the draw)."""
    out = np.empty(shape, dtype) if out is None else out
    flat = out.reshape(-1)
    if draw_core.usable(rng.bit_generator, -8, 9):         # the same draws, jitted
        draw_core.draw(rng.bit_generator, -8, 9, flat)
        return out
    for i in range(0, flat.size, CHUNK):
        flat[i:i + CHUNK] = rng.integers(-8, 9, size=min(CHUNK, flat.size - i))
    return out


def normals(rng, shape, scale: float, convert, out: np.ndarray) -> np.ndarray:
    """out[...] = convert(rng.standard_normal(shape) * scale), made CHUNK values at a time: the
    same values (the draws are made value by value), without float64 temporaries of the whole
    (Llama-2-7B's KV caches: 3 x 67 MB of fresh pages each)."""
    flat = out.reshape(-1)
    buf = np.empty(min(CHUNK, flat.size))
    for i in range(0, flat.size, CHUNK):
        b = buf[:min(CHUNK, flat.size - i)]
        rng.standard_normal(out=b)
        b *= scale
        flat[i:i + len(b)] = convert(b)
    return out


def integers(rng, name: str, shape, dtype, out: np.ndarray | None, defer=None) -> np.ndarray:
    """random_integers, or where `defer` takes the draws (`defer.draw(name, Plan)`: made by
    other processes into `out`, emulator/system_workers.py `Started`) only their Plan, the generator
    moved past them as if none is rejected (`defer.check()` then says whether that held); None
    where they are made only in the other processes (`out` None: `Started.own`)."""
    if defer is None or not draw_core.usable(rng.bit_generator, -8, 9) or not defer.takes(name, out):
        return random_integers(rng, shape, dtype, out)
    defer.draw(name, draw_core.plan(rng.bit_generator, -8, 9, int(np.prod(shape, dtype=np.int64))))
    return out


def random_values(graph: IRGraph, seed: int = 0, into: dict | None = None, defer=None) -> dict[str, np.ndarray]:
    """Deterministic values for every declared input, weight and state. Floats are N(0, 1)
    scaled by 1/sqrt(K) for matmul right operands (K = fan-in) and by 0.1 for other weights,
    so that deep programs stay well inside f16 range; integers are uniform in [-8, 8]. A value
    is made in `into[name]` where that is an array of its shape and dtype; integers there may
    be made by other processes (`defer`: see `integers`), the same values."""
    rng = np.random.default_rng(seed)
    out = {}
    for name, nid in graph.decls.items():
        n = graph.node(nid)
        at = into_array(into, name, n.shape, S.NP_DTYPE[n.dtype])
        if not S.is_float(n.dtype):
            out[name] = integers(rng, name, n.shape, S.NP_DTYPE[n.dtype], at, defer)
            continue
        k = _matmul_fan_in(graph, nid)
        scale = 1.0 / np.sqrt(k) if k else (0.1 if n.op == "weight" else 1.0)
        at = np.empty(n.shape, S.NP_DTYPE[n.dtype]) if at is None else at
        out[name] = normals(rng, n.shape, scale, lambda b, dt=n.dtype: S.convert(b, dt), at)
    if defer is not None and not defer.check():      # a deferred draw was rejected: all made here
        return random_values(graph, seed, into)
    return out
