"""Tensor-parallel GPU groups (Megatron-style): which tensors of an IR graph are split N ways,
how each matmul shrinks, and where the all-reduces go.

Rules, applied to any graph:
  - A matmul with a weight operand whose activation input is whole is column-parallel: each GPU
    holds N / gpus of the weight's columns and produces that slice of the output (split).
  - A weight matmul whose activation input is split is row-parallel: each GPU holds K / gpus
    rows and produces a partial sum of the whole output; an all-reduce of that output follows.
  - A column-parallel matmul whose output never reaches a row-parallel one (the LM head) stays
    whole on every GPU, as gpt-fast (tp.py) and Megatron's default do for the output layer.
  - Every other op is split when an input is split (heads of attention, the FFN activation,
    the KV cache written from split keys and values), else replicated (norms, residual adds).
  - A matmul of two activations with split inputs (attention scores and values) splits its
    batch (heads) axis, or its rows when there is no batch axis.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from lpu.compiler.ir import LEAVES


def _to_leaf(nodes, free, i) -> list:
    """The nodes from i back through views and casts (a weight stored as i8 and widened for the
    matmul is still that weight) to the first other node."""
    path = [i]
    while (i in free or nodes[i].op == "cast") and nodes[i].op not in LEAVES and nodes[i].inputs:
        i = nodes[i].inputs[0]
        path.append(i)
    return path


def _is_weight_matmul(nodes, free, n) -> int | None:
    """The input index (0 or 1) of the activation of a matmul with a weight operand, else None."""
    if n.op != "matmul":
        return None
    for side, i in enumerate(n.inputs):
        if nodes[_to_leaf(nodes, free, i)[-1]].op == "weight":
            return 1 - side
    return None


@dataclass
class TpPlan:
    gpus: int
    split: dict = field(default_factory=dict)      # node id -> gpus for split tensors
    mode: dict = field(default_factory=dict)       # matmul node id -> "col" | "row" | "heads"
    allreduce: list = field(default_factory=list)  # (row-parallel matmul node id, bytes)

    def matmul_dims(self, nid: int, batch: int, m: int, k: int, n: int) -> tuple:
        mode, g = self.mode.get(nid), self.gpus
        if mode == "col":
            return batch, m, k, math.ceil(n / g)
        if mode == "row":
            return batch, m, math.ceil(k / g), n
        if mode == "heads":
            return (math.ceil(batch / g), m, k, n) if batch > 1 else (batch, math.ceil(m / g), k, n)
        return batch, m, k, n


def plan(nodes: dict, free: set, gpus: int, act_bytes: int = 2) -> TpPlan:
    """The split of every tensor for a group of `gpus`. All-reduces move the row-parallel output
    in the activation dtype (act_bytes per element; f16/bf16 in every framework we compare with)."""
    p = TpPlan(gpus)
    if gpus == 1:
        return p
    order = sorted(nodes)
    col_off: set = set()
    for _ in range(2):                       # second pass: LM-head-like columns stay whole
        split: set = set()
        mode: dict = {}
        for nid in order:
            n = nodes[nid]
            if n.op in LEAVES:
                continue
            ins = n.inputs[1:] if n.op == "store" else n.inputs
            act = _is_weight_matmul(nodes, free, n)
            if act is not None:
                if n.inputs[act] in split:
                    mode[nid] = "row"
                elif nid not in col_off:
                    mode[nid] = "col"
                    split.add(nid)
            elif any(i in split for i in ins):
                split.add(nid)
                if n.op == "matmul":
                    mode[nid] = "heads"
        reached_row = _cols_feeding_rows(nodes, order, mode, split)
        extra = {nid for nid, md in mode.items() if md == "col" and nid not in reached_row}
        if not extra - col_off:
            break
        col_off |= extra
    for nid, md in mode.items():
        if md in ("col", "row"):
            split.update(_to_leaf(nodes, free, nodes[nid].inputs[1 - _is_weight_matmul(nodes, free, nodes[nid])]))
    for nid in order:                        # state leaves written from split values
        n = nodes[nid]
        if n.op == "store" and nid in split:
            split.add(n.inputs[0])
    p.split = {nid: gpus for nid in split}
    p.mode = mode
    p.allreduce = [(nid, nodes[nid].size * act_bytes) for nid in order if mode.get(nid) == "row"]
    return p


def _cols_feeding_rows(nodes, order, mode, split) -> set:
    """Column-parallel matmuls whose split output reaches a row-parallel matmul."""
    users: dict = {}
    for nid in order:
        for i in nodes[nid].inputs:
            users.setdefault(i, []).append(nid)
    out = set()
    for nid, md in mode.items():
        if md != "col":
            continue
        stack, seen = [nid], set()
        while stack:
            u = stack.pop()
            for v in users.get(u, ()):
                if v in seen:
                    continue
                seen.add(v)
                if mode.get(v) == "row":
                    out.add(nid)
                    stack.clear()
                    break
                if v in split:
                    stack.append(v)
    return out


def allreduce_us(gpu, gpus: int, nbytes: float) -> float:
    """Ring all-reduce: fixed latency plus 2 (g - 1) / g of the bytes over NVLink (bus bandwidth)."""
    if gpus == 1:
        return 0.0
    bw = gpu.nvlink_gbs * 1e9 * gpu.nvlink_efficiency
    return gpu.allreduce_latency_us + 1e6 * 2 * (gpus - 1) / gpus * nbytes / bw
