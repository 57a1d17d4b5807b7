"""The analytical GPU cost model: the same IR graph the LPU compiles, costed kernel by kernel as
a GPU framework would run it.

Passes, in order:
  1. views:   reshape, transpose, slice and `output` are free (strided views, labels); with
              fusion a concat of computed tensors is free too (producers write in place).
  2. kernels: every other non-leaf node is a kernel. With fuse=True an elementwise op (unary,
              binary, cast, causal, rope), a reduction or a store joins the kernel of its latest
              computed input when every other input is ready before that kernel starts (epilogue
              and row-kernel fusion; reductions never join a GEMM). The intermediate then costs
              no launch and no HBM round trip.
  3. attention: with fuse=True, score GEMM -> row softmax kernel -> value GEMM chains whose
              intermediates have no other consumer merge into one flash-attention kernel
              (scores never leave the SM; a causal mask skips the masked half of the work).
  4. cost:    per kernel, time = max(compute, memory) + HBM latency x dependent passes + launch.
              compute = GEMM flops / (tensor peak of the operand dtype x tensor efficiency x wave
              efficiency) + other flops / (CUDA-core f32 peak x CUDA efficiency). memory = bytes
              at HBM bandwidth x HBM efficiency, or at L2 bandwidth (same efficiency) for
              intermediates that fit in L2. Leaves and states (weights, KV cache) always stream
              from HBM, each read once per kernel. Wave efficiency = tiles / (waves x SMs) with
              128x128 output tiles: the tile and wave quantization of cuBLAS GEMMs.

Every factor comes from the GpuConfig (gpus/*.toml, each with its source); nothing here is fitted
to a validation case.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from lpu.compiler import ops
from lpu.compiler.ir import IRGraph
from lpu.compiler.ops import LEAVES, REDUCE
from lpu.gpu_baseline.gpus import GpuConfig

# the op table's GPU cost classes (compiler/ops.py)
ELEMENTWISE = ops.gpu_class("elementwise")
VIEWS = ops.gpu_class("view")
# CUDA-core flops per output element (per input element for reductions), from the op table.
# Transcendentals use the SFU at a quarter of the FMA rate, hence 4 (assumption; these kernels
# are memory-bound anyway).
FLOPS_PER_ELEMENT = {d.name: d.flops for d in ops.OPS.values()}
BOUNDS = ("compute", "hbm", "latency", "launch")


@dataclass
class OpCost:
    node: int            # the kernel's first node (its head)
    op: str              # the head's op ("attention" for a merged flash-attention kernel)
    line: int            # DSL source line of the head
    flops: float
    bytes: float         # bytes moved (HBM + L2)
    time_us: float
    bound: str           # which term dominates: compute | hbm | latency | launch
    hbm_bytes: float = 0.0
    compute_us: float = 0.0
    memory_us: float = 0.0
    fused: tuple = ()    # every node id in the kernel, head first


@dataclass
class GpuCost:
    gpu: str
    launch: str
    fuse: bool
    total_us: float
    ops: list = field(default_factory=list)

    @property
    def flops(self) -> float:
        return sum(o.flops for o in self.ops)

    @property
    def bytes(self) -> float:
        return sum(o.bytes for o in self.ops)

    def by_bound(self) -> dict:
        out = {b: 0.0 for b in BOUNDS}
        for o in self.ops:
            out[o.bound] += o.time_us
        return out

    def by_line(self) -> dict:
        out: dict[int, float] = {}
        for o in self.ops:
            out[o.line] = out.get(o.line, 0.0) + o.time_us
        return out


class _Kernel:
    def __init__(self, head: int, has_matmul: bool):
        self.head = head
        self.members = [head]
        self.has_matmul = has_matmul
        self.flash = False


def _read_inputs(n) -> tuple:
    """The inputs a node actually reads: a store reads its value, not the old state version."""
    return n.inputs[1:] if n.op == "store" else n.inputs


def cost_graph(graph: IRGraph, gpu: GpuConfig, launch: str = "stream", fuse: bool = True) -> GpuCost:
    launch_us = gpu.launch_us(launch)
    nodes = {n.id: n for n in graph.nodes()}
    free = _free_nodes(nodes, fuse)
    kernels, kernel_of = _form_kernels(nodes, free, fuse)
    if fuse:
        kernels = _merge_attention(graph, nodes, free, kernels, kernel_of)
    ops = [_cost_kernel(graph, nodes, free, k, kernel_of, gpu, launch_us) for k in kernels]
    return GpuCost(gpu.name, launch, fuse, sum(o.time_us for o in ops), ops)


# ---- passes 1-3: views, kernels, attention ---------------------------------------------------
def _free_nodes(nodes: dict, fuse: bool) -> set:
    free = set()
    for n in nodes.values():
        if n.op in LEAVES or n.op in VIEWS:
            free.add(n.id)
        elif n.op == "concat" and fuse and all(nodes[i].op not in LEAVES for i in n.inputs):
            free.add(n.id)
    return free


def _sources(nodes: dict, free: set, nid: int) -> list:
    """(base node, bytes read) for reading node `nid`: views resolve to the tensors they view."""
    n = nodes[nid]
    if nid not in free or n.op in LEAVES:
        return [(nid, float(n.nbytes))]
    out = []
    if n.op == "concat":
        for i in n.inputs:
            out += _sources(nodes, free, i)
        return out
    src = nodes[n.inputs[0]]
    scale = n.size / max(src.size, 1)
    return [(b, nb * scale) for b, nb in _sources(nodes, free, src.id)]


def _form_kernels(nodes: dict, free: set, fuse: bool):
    kernels: list[_Kernel] = []
    kernel_of: dict[int, _Kernel] = {}
    for n in sorted(nodes.values(), key=lambda m: m.id):
        if n.id in free:
            continue
        target = None
        if fuse and (n.op in ELEMENTWISE or n.op in REDUCE or n.op == "store"):
            bases = {b for i in _read_inputs(n) for b, _ in _sources(nodes, free, i)}
            cands = sorted({kernel_of[b] for b in bases if b in kernel_of}, key=lambda k: -k.head)
            for k in cands:
                if n.op in REDUCE and k.has_matmul:
                    continue
                if all(b not in kernel_of or kernel_of[b] is k or kernel_of[b].head < k.head for b in bases):
                    target = k
                    break
        if target is None:
            target = _Kernel(n.id, n.op == "matmul")
            kernels.append(target)
        else:
            target.members.append(n.id)
        kernel_of[n.id] = target
    return kernels, kernel_of


def _consumers(graph: IRGraph, nodes: dict, free: set, nid: int) -> set:
    """Kernel nodes that read `nid` (through views); -1 stands for a graph output."""
    out = set()
    for u in graph.users(nid):
        if nodes[u].op == "output":
            out.add(-1)
        elif u in free:
            out |= _consumers(graph, nodes, free, u)
        elif not (nodes[u].op == "store" and nodes[u].inputs[0] == nid):
            out.add(u)
    return out


def _merge_attention(graph, nodes, free, kernels, kernel_of):
    """score GEMM kernel S -> softmax kernel R -> value GEMM kernel C  =>  one flash kernel."""
    def ext_bases(k):
        return {b for m in k.members for i in _read_inputs(nodes[m])
                for b, _ in _sources(nodes, free, i) if kernel_of.get(b) is not k}

    def readers(k):
        return {kernel_of[c] if c >= 0 else None for m in k.members
                for c in _consumers(graph, nodes, free, m)} - {k}

    for c in [k for k in kernels if k.has_matmul and not k.flash]:
        a_bases = [b for b, _ in _sources(nodes, free, nodes[c.head].inputs[0])]
        r = kernel_of.get(a_bases[0]) if len(a_bases) == 1 else None
        if r is None or r.has_matmul or not any(nodes[m].op in REDUCE for m in r.members):
            continue
        s_set = {kernel_of[b] for b in ext_bases(r) if b in kernel_of}
        if len(s_set) != 1:
            continue
        s = s_set.pop()
        if not s.has_matmul or s.flash or readers(s) != {r} or readers(r) != {c}:
            continue
        if any(kernel_of[b].head >= s.head for b in ext_bases(c) if b in kernel_of and kernel_of[b] not in (r, s)):
            continue
        s.members += r.members + c.members
        s.flash = True
        for m in r.members + c.members:
            kernel_of[m] = s
        kernels = [k for k in kernels if k is not r and k is not c]
    return kernels


# ---- pass 4: cost ------------------------------------------------------------------------------
def _matmul_dims(nodes, n):
    a, b = nodes[n.inputs[0]], nodes[n.inputs[1]]
    m, k = a.shape[-2], a.shape[-1]
    batch = n.shape[0] if len(n.shape) == 3 else 1
    return batch, m, k, b.shape[-1], a.dtype, b.dtype


def _tensor_peak(gpu: GpuConfig, da: str, db: str):
    """Tensor-core peak (flop/s) for the operand dtypes, or None for CUDA-core matmuls."""
    if da == db == "i8":
        return gpu.tensor_i8_tops * 1e12
    if {da, db} <= {"f16", "bf16", "i8"}:
        return gpu.tensor_f16_tflops * 1e12
    return None                               # f32 / i32 operands: CUDA cores (PyTorch default)


def _wave_efficiency(gpu: GpuConfig, batch: int, m: int, n: int) -> float:
    tiles = batch * math.ceil(m / gpu.gemm_tile_m) * math.ceil(n / gpu.gemm_tile_n)
    waves = math.ceil(tiles / gpu.sm_count)
    return tiles / (waves * gpu.sm_count)


def _causal_fraction(n) -> float:
    rows, cols = n.shape[-2], n.shape[-1]
    off = int(n.attrs.get("offset", 0))
    kept = sum(min(cols, max(0, r + off + 1)) for r in range(rows))
    return kept / (rows * cols)


def _cost_kernel(graph, nodes, free, k: _Kernel, kernel_of, gpu: GpuConfig, launch_us: float) -> OpCost:
    members = set(k.members)
    causal = [nodes[m] for m in k.members if nodes[m].op == "causal"]
    mm_frac = _causal_fraction(causal[0]) if k.flash and causal else 1.0
    tc_s = cuda_flops = mm_flops = 0.0
    for m in k.members:
        n = nodes[m]
        if n.op == "matmul":
            batch, mm, kk, nn, da, db = _matmul_dims(nodes, n)
            f = 2.0 * batch * mm * kk * nn * mm_frac
            mm_flops += f
            peak = _tensor_peak(gpu, da, db)
            if peak is None:
                cuda_flops += f
            else:
                tc_s += f / (peak * gpu.tensor_efficiency * _wave_efficiency(gpu, batch, mm, nn))
        else:
            per = FLOPS_PER_ELEMENT[n.op]
            size = nodes[n.inputs[0]].size if n.op in REDUCE else n.size
            cuda_flops += per * size
    compute_us = 1e6 * (tc_s + cuda_flops / (gpu.cuda_f32_tflops * 1e12 * gpu.cuda_efficiency))

    reads: dict[int, float] = {}
    for m in k.members:
        for i in _read_inputs(nodes[m]):
            for b, nb in _sources(nodes, free, i):
                if b not in members:
                    reads[b] = min(reads.get(b, 0.0) + nb, float(nodes[b].nbytes))
    hbm = l2 = 0.0
    for b, nb in reads.items():
        if _in_l2(nodes[b], gpu):
            l2 += nb
        else:
            hbm += nb
    for m in k.members:
        n = nodes[m]
        if n.op == "store":
            nb = float(nodes[n.inputs[1]].nbytes)
            hbm += nb                               # the state (KV cache) lives in HBM
        elif _consumers(graph, nodes, free, m) - members:
            nb = float(n.nbytes)
            if _in_l2(n, gpu):
                l2 += nb
            else:
                hbm += nb
    eff = gpu.hbm_efficiency
    memory_us = 1e6 * (hbm / (gpu.hbm_gbs * 1e9 * eff) + l2 / (gpu.l2_gbs * 1e9 * eff))

    passes = 1 if k.flash else 1 + sum(
        1 for m in k.members if nodes[m].op in REDUCE and any(u in members for u in graph.users(m)))
    latency_us = passes * gpu.hbm_latency_us
    parts = {"compute": compute_us, "hbm": memory_us, "latency": latency_us, "launch": launch_us}
    bound = max(BOUNDS, key=lambda b: parts[b])
    head = nodes[k.head]
    return OpCost(node=k.head, op="attention" if k.flash else head.op, line=head.line,
                  flops=mm_flops + cuda_flops, bytes=hbm + l2,
                  time_us=max(compute_us, memory_us) + latency_us + launch_us, bound=bound,
                  hbm_bytes=hbm, compute_us=compute_us, memory_us=memory_us,
                  fused=tuple(k.members))


def _in_l2(n, gpu: GpuConfig) -> bool:
    """Computed intermediates that fit in L2 stay there; leaves and states come from HBM."""
    return n.op not in LEAVES and n.op != "store" and n.nbytes <= gpu.l2_bytes


# ---- summaries -------------------------------------------------------------------------------
def is_decode(graph: IRGraph) -> bool:
    """Heuristic: a decode step multiplies single rows (M == 1) by weights."""
    mms = [n for n in graph.nodes() if n.op == "matmul"]
    with_weight = [n for n in mms if any(graph.node(i).op == "weight" for i in n.inputs)]
    mms = with_weight or mms
    return bool(mms) and all(graph.node(n.inputs[0]).shape[-2] == 1 for n in mms)


def summarize(graph: IRGraph, gpu: GpuConfig, launch: str = "stream", fuse: bool = True) -> dict:
    """Phase, total time and the user-facing rate: tokens/s for decode, time to first token
    (ms) for prefill."""
    cost = cost_graph(graph, gpu, launch, fuse)
    out = {"gpu": gpu.name, "time_us": cost.total_us, "kernels": len(cost.ops),
           "phase": "decode" if is_decode(graph) else "prefill"}
    if out["phase"] == "decode":
        out["tokens_per_s"] = 1e6 / cost.total_us
    else:
        out["ttft_ms"] = cost.total_us / 1e3
    return out
