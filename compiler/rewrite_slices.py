"""Pass `compose_slices` (after `heads_rope`): a slice of a slice of one row reads its root.

In a decode step, q = qkv[:, 0:D] and the heads' q[:, i*HD:(i+1)*HD] are two copies in turn
when neither starts on a vector chunk: each an SXM PERMUTE, a trip between the VXM and the chip's
edge, on the way to the heads' scores. A slice that is a copy anyway (its lanes do not keep
whole chunks of its source) reads the same lanes of the root directly: one trip. Only for
tensors of one row (a prefill's slices feed the transposed scores of compiler/rewrite.py).
"""
from __future__ import annotations

import numpy as np

from lpu.compiler.ir import IRGraph
from lpu.compiler.plan import _aligned_last
from lpu.compiler.rewrite import _loops, _prune


def _plain(n) -> bool:
    return n.op == "slice" and all(not isinstance(e, int) for e in n.attrs["index"])


def _composable(g: IRGraph, n, lanes) -> bool:
    if not _plain(n) or len(n.shape) != 2 or int(np.prod(n.shape[:-1])) != 1:
        return False
    s = g.node(n.inputs[0])
    return _plain(s) and len(s.attrs["index"]) == len(g.node(s.inputs[0]).shape) \
        and len(n.attrs["index"]) == len(s.shape) and not _aligned_last(n, s.shape, lanes)


def compose_slices(g: IRGraph, lanes: int) -> IRGraph:
    """g with every one-row copying slice of a slice reading the inner slice's source (g if none)."""
    cands = {n.id for n in g.nodes() if _composable(g, n, lanes)}
    if not cands:
        return g
    new = IRGraph(g.source_name, g.source)
    new.params = dict(g.params)
    m: dict[int, int] = {}
    first: dict[int, int] = {}
    root: dict[int, tuple] = {}          # new id of a composed slice -> (old root id, index)
    for n in g.nodes():
        first[n.id] = len(new)
        if n.id in cands:
            s = g.node(n.inputs[0])
            src, outer = (s.inputs[0], s.attrs["index"]) if s.id not in root else root[s.id]
            idx = tuple((a[0] + b[0], a[0] + b[1]) for a, b in zip(outer, n.attrs["index"]))
            root[n.id] = (src, idx)
            m[n.id] = new.add("slice", (m[src],), n.shape, n.dtype, {"index": idx}, n.line, n.col)
        else:
            m[n.id] = new.add(n.op, tuple(m[i] for i in n.inputs), n.shape, n.dtype, dict(n.attrs), n.line, n.col)
    new.decls = {k: m[v] for k, v in g.decls.items()}
    new.outputs = {k: m[v] for k, v in g.outputs.items()}
    new.final_states = {k: m[v] for k, v in g.final_states.items()}
    new.loops = _loops(g.loops, first, len(new))
    return _prune(new)
