"""The compile-time budget: a program's size on the target machine, estimated from its IR graph
before lowering, within limit 'vector_ops' (isa/limits.py). Kept apart from the front end: the
back end imports it, and must not import Lark."""
from __future__ import annotations

import math

from lpu.compiler.errors import SourceError, SourceText
from lpu.compiler.ir import IRGraph
from lpu.isa.limits import how_to_raise, limit


def check_size(graph: IRGraph, machine) -> None:
    """Refuse, before lowering, a program whose ops add up to more than limit 'vector_ops'
    vector operations on `machine` (each op: the vectors it produces; a matmul: one per row, K
    tile and N tile). The bundled programs need at most ~2 million on tsp-v1. A program whose
    tensors do not fit is left to the capacity check, whose message says more."""
    lanes = machine.lanes
    resident = sum(graph.node(i).nbytes for i in [*graph.decls.values(), *graph.outputs.values()])
    if resident > machine.sram_bytes:
        return
    total, most = 0, limit("vector_ops")
    for n in graph.nodes():
        if n.op in ("input", "weight", "state", "const", "output"):
            continue
        shape = tuple(n.shape) or (1,)
        vectors = math.prod(shape[:-1]) * -(-shape[-1] // lanes)
        if n.op == "matmul":
            k = graph.node(n.inputs[0]).shape[-1]
            vectors *= -(-k // lanes)
        total += vectors
        if total > most:
            src = SourceText(graph.source_name, graph.source)
            raise SourceError([src.diagnostic(n.line, n.col, f"the program needs more than {most:,} vector "
                                              f"operations on a {lanes}-lane machine (by this op)",
                                              how_to_raise("vector_ops"))])
