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
              fuse="eager" (PyTorch eager) keeps those attention kernels and then makes every
              other op a kernel of its own.
  4. cost:    per kernel. GEMM and attention kernels: max(compute, memory) + gemm_fixed_us.
              compute: GEMMs by gemm_plan (a cuBLAS-like choice of output tile and split-K from
              the config's tiles, wave-quantized over the SMs at the tensor peak x tensor
              efficiency, steered away from tiles L2 cannot feed; with the config's gemm_plan_bound
              the plan's memory time bounds the kernel too); flash attention by query-row
              blocks at the tensor peak x attention efficiency. memory: bytes at HBM bandwidth x
              HBM efficiency, or at L2 bandwidth for intermediates that fit in L2. Weights and
              states (KV cache) stream from HBM, read once per kernel.
              Memory-bound kernels (norms, softmax, elementwise, stores): kernel_fixed_us + the
              chain of dependent loads (row_chain_us, at the DRAM latency; a reduction that feeds
              its own ops adds a pass over the row, re-read from L1/L2) + bytes at the HBM and L2
              peaks; CUDA-core flops bound it from below. launch: none (kernel durations), CUDA
              graph (a gap per kernel) or stream (a kernel costs at least one host launch).
  5. groups:  with gpus > 1, tensor_parallel.py splits the graph Megatron-style; each GPU's
              kernels shrink and an all-reduce follows every row-parallel matmul.

Every factor comes from the GpuConfig (gpus/*.toml, each with its source or the fit that set it,
fit.py on the fit set only); nothing is fitted per validation case. Passes 1-3 live in
kernels.py, whose cost_class() is the one place that classifies IR ops for this model.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from lpu.compiler import ops
from lpu.compiler.ir import IRGraph
from lpu.compiler.ops import LEAVES, REDUCE
from lpu.gpu_baseline import tensor_parallel
from lpu.gpu_baseline.gpus import GpuConfig
from lpu.gpu_baseline.kernels import (Kernel, batch_heads, consumers, form_kernels, free_nodes, merge_attention,
                                      read_inputs, sources, unfuse_but_attention)
from lpu.isa.errors import ConfigError

# CUDA-core flops per output element (per input element for reductions), from the op table.
# Transcendentals use the SFU at a quarter of the FMA rate, hence 4 (assumption; these kernels
# are memory-bound anyway).
FLOPS_PER_ELEMENT = {d.name: d.flops for d in ops.OPS.values()}


BOUNDS = ("compute", "hbm", "latency", "launch", "comm")
# fuse: True (compiled: epilogue, row-kernel and attention fusion), False (every op a kernel), "eager"
# (PyTorch eager: a fused attention call, every other op a kernel)
FUSE_MODES = (True, False, "eager")
GROUP_SIZES = (1, 2, 4, 8)


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
    gpus: int = 1        # tensor-parallel group size; ops and times are per GPU of the group

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


def cost_graph(graph: IRGraph, gpu: GpuConfig, launch: str = "stream", fuse: bool = True,
               gpus: int = 1, host: bool = False, inputs_in_l2=False,
               row_style: str = "vector") -> GpuCost:
    """Kernels of `graph` on one GPU, or on each GPU of a tensor-parallel group of `gpus` (the
    all-reduces are kernels too). host=True adds the config's host time per forward pass (for
    end-to-end figures). launch: "stream", "graph", or "none" (kernel durations alone).
    fuse: True (compiled), False (every op a kernel) or "eager" (FUSE_MODES)
    inputs_in_l2: graph inputs that fit in L2 are read from there (a preceding kernel wrote them;
    per-operator profiles of a running model); True for every input, or a list of input names. row_style: how the memory-bound (non-GEMM) kernels
    load their data, "vector" (16-byte loads, PyTorch) or "scalar" (row_chain_us)."""
    gpu.launch_us(launch)                               # validates the mode
    if gpus not in GROUP_SIZES:
        raise ConfigError(f"a GPU group has {', '.join(map(str, GROUP_SIZES))} GPUs, got {gpus}")
    if fuse not in FUSE_MODES:
        raise ConfigError(f"fuse must be one of {', '.join(map(repr, FUSE_MODES))}, got {fuse!r}")
    nodes = {n.id: n for n in graph.nodes()}
    free = free_nodes(nodes, fuse is True)
    kernels, kernel_of = form_kernels(nodes, free, bool(fuse))
    if fuse:
        kernels = merge_attention(graph, nodes, free, kernels, kernel_of)
        kernels = batch_heads(graph, nodes, free, kernels, kernel_of)
    if fuse == "eager":
        kernels = unfuse_but_attention(kernels, kernel_of, nodes)
    tp = tensor_parallel.plan(nodes, free, gpus) if gpus > 1 else None
    ops = [_cost_kernel(graph, nodes, free, k, kernel_of, gpu, launch, tp, inputs_in_l2, row_style)
           for k in kernels]
    if tp:
        for nid, nbytes in tp.allreduce:
            body = tensor_parallel.allreduce_us(gpu, gpus, nbytes)
            t, _ = _with_launch(gpu, launch, body)
            ops.append(OpCost(node=nid, op="all_reduce", line=nodes[nid].line, flops=0.0, bytes=nbytes,
                              time_us=t, bound="comm", fused=(nid,)))
    if host and gpu.step_host_us(launch):
        ops.append(OpCost(node=-1, op="host", line=0, flops=0.0, bytes=0.0, time_us=gpu.step_host_us(launch),
                          bound="launch"))
    return GpuCost(gpu.name, launch, fuse, sum(o.time_us for o in ops), ops, gpus=gpus)


# ---- pass 4: cost ------------------------------------------------------------------------------
def _matmul_dims(nodes, n):
    a, b = nodes[n.inputs[0]], nodes[n.inputs[1]]
    m, k = a.shape[-2], a.shape[-1]
    batch = n.shape[0] if len(n.shape) == 3 else 1
    return batch, m, k, b.shape[-1], a.dtype, b.dtype


def _stored_width(nodes, free, nid) -> float:
    """Bytes an element of operand `nid` takes where the kernel reads it from: a free view or cast
    of a stored tensor reads that tensor (an i8 weight dequantized in the GEMM: 1 byte, not the
    cast's 2)."""
    return sum(nb for _, nb in sources(nodes, free, nid)) / max(nodes[nid].size, 1)


def _tensor_peak(gpu: GpuConfig, da: str, db: str):
    """Tensor-core peak (flop/s) for the operand dtypes, or None for CUDA-core matmuls."""
    if da == db == "i8":
        return gpu.tensor_i8_tops * 1e12
    if {da, db} <= {"f16", "bf16", "i8"}:
        return gpu.tensor_f16_tflops * 1e12
    return None                               # f32 / i32 operands: CUDA cores (PyTorch default)


SPLITS = (1, 2, 3, 4, 6, 8, 12, 16)
MIN_K_PER_SPLIT = 256         # assumption: split-K slices no thinner than 256 (cuBLAS k-tiles of 64 x 4 stages)


@dataclass(frozen=True)
class GemmPlan:
    tile_m: int               # output tile rows (tokens) of one thread block
    tile_n: int               # output tile columns
    split_k: int              # K split across thread blocks (partials reduced by a second kernel)
    ctas: int                 # thread blocks launched
    waves: int
    compute_us: float         # wave-quantized tensor time of the padded tiles
    memory_us: float          # operands once from HBM, plus split-K partials
    time_us: float            # max(compute, memory) + the reduce kernel's fixed cost


def gemm_plan(gpu: GpuConfig, batch: int, m: int, k: int, n: int, peak: float, a_bytes: int = 2,
              b_bytes: int = 2, out_bytes: int = 2) -> GemmPlan:
    """cuBLAS-like heuristic: of the config's tiles and split-K factors, the plan with the least
    time. Each thread block computes a padded tile_m x tile_n x (K / split) block at the SM's
    share of the tensor peak x tensor_efficiency; blocks run in waves of sm_count. Operands come
    from HBM once at the share of the SMs that have a block (each at most gemm_hbm_share times its
    own), and L2 serves every block its (tile_m + tile_n) x K operands (small tiles on a fast GPU
    are L2-bound); split-K (up to gemm_split_k_max_rows rows) adds f32 partials and one reduce
    kernel. With gemm_narrow_tiles_own_rows a tile under 128 rows serves only M up to its rows.
    The rule's fields are per GPU generation (gpus/*.toml). a_bytes, b_bytes: the width of an
    element of A (m x k) and B (k x n) as they lie in HBM (i8 weights: 1, dequantized in the
    kernel: a weight-only int8 GEMV streams half the bytes of an f16 one)."""
    rate_sm = peak * gpu.tensor_efficiency / gpu.sm_count
    bw = gpu.hbm_gbs * 1e9 * gpu.hbm_efficiency
    l2_bw = gpu.l2_gbs * 1e9 * gpu.hbm_efficiency
    base = batch * (m * k * a_bytes + n * k * b_bytes) + batch * m * n * out_bytes
    best = None
    for tm, tn in gpu.gemm_tiles:
        if tm < 64 and m > 4 * tm:   # skinny tiles (8, 16 rows) serve only few rows (H200 kernel names)
            continue
        if gpu.gemm_narrow_tiles_own_rows and tm < 128 and m > tm:
            continue
        tiles = batch * math.ceil(m / tm) * math.ceil(n / tn)
        for s in SPLITS:
            if s > 1 and (k / s < MIN_K_PER_SPLIT or tiles >= gpu.sm_count or m > gpu.gemm_split_k_max_rows):
                break
            ctas = tiles * s
            waves = math.ceil(ctas / gpu.sm_count)
            compute = 1e6 * waves * 2.0 * tm * tn * math.ceil(k / s) / rate_sm
            # fewer blocks than SMs leave SMs idle; a busy SM streams up to gemm_hbm_share times its share
            memory = 1e6 * (base + (2 * s * batch * m * n * 4 if s > 1 else 0)) / bw / min(
                1.0, gpu.gemm_hbm_share * ctas / gpu.sm_count)
            # every block streams its A rows and B columns through L2: small tiles re-read more
            memory = max(memory, 1e6 * ctas * (tm * a_bytes + tn * b_bytes) * math.ceil(k / s) / l2_bw)
            t = max(compute, memory) + (gpu.kernel_fixed_us if s > 1 else 0.0)   # + the reduce kernel
            if best is None or t < best.time_us:
                best = GemmPlan(tm, tn, s, ctas, waves, compute, memory, t)
    return best


def _causal_fraction(n) -> float:
    rows, cols = n.shape[-2], n.shape[-1]
    off = int(n.attrs.get("offset", 0))
    period = int(n.attrs.get("period", rows))        # GQA: g query heads' rows stacked (workloads.py)
    kept = sum(min(cols, max(0, r % period + off + 1)) for r in range(rows))
    return kept / (rows * cols)


ATTN_TILE_Q = 128             # FlashAttention-2 forward: 128 query rows per thread block (Dao 2023)


def _flash_compute_us(gpu: GpuConfig, batch: int, m: int, cols: int, flops: float, causal: bool) -> float:
    """Fused attention: thread blocks of ATTN_TILE_Q query rows per head. With fewer blocks than
    SMs the longest block (the last row tile under a causal mask sees every column) sets the time;
    decode (one query row) splits the KV sequence across SMs (flash-decoding)."""
    rate_sm = gpu.tensor_f16_tflops * 1e12 * gpu.attention_efficiency / gpu.sm_count
    per_sm = flops / gpu.sm_count
    blocks = batch * math.ceil(m / ATTN_TILE_Q)
    if m > 1 and blocks < gpu.sm_count:
        per_sm = max(per_sm, flops / (batch * m * (0.5 if causal else 1.0)) * min(m, ATTN_TILE_Q))
    return 1e6 * per_sm / rate_sm


THREADS_PER_SM = 2048        # resident threads per SM on sm_80 and sm_90 (CUDA C++ Programming Guide,
                             # "Compute Capabilities" table: A100, H100, H200)
ROW_STYLES = {"vector": 16, "scalar": 0}   # bytes per load; 0: one element per load
# A pass that re-reads a row the same block has just read finds it in L1 or L2: assumption, at half
# the DRAM latency. Chosen among 1, 0.5, 0.25 and 0 by the fit-set loss of fit.py (H100 0.0774,
# 0.0761, 0.0793, 0.0822; H200 0.0692, 0.0678, 0.0691, 0.0705; A100's fit set has no row norm).
REREAD_LATENCY = 0.5


def row_chain_us(nodes, k, gpu: GpuConfig, split: dict, passes: int, style: str = "vector") -> float:
    """The chain of dependent loads a memory-bound kernel waits on, at the config's loaded memory
    latency (hbm_latency_us; the queueing under load is the bytes term beside it, at the HBM peak:
    time = fixed + chain + bytes / bandwidth, an M/M/1 queue's delay): each thread issues a load, waits for it, moves on. A row kernel (with
    a reduction) runs a block of up to 1,024 threads per row, each thread taking ceil(D / (threads
    x elements per load)) steps per pass over its row (a reduction that feeds its own ops makes a
    pass more, at REREAD_LATENCY); blocks fill THREADS_PER_SM per SM in waves. An elementwise kernel gives each thread
    one load of every input. style "vector": 16-byte loads (PyTorch's vectorized kernels);
    "scalar": one element per load and one block per row for every op (the vLLM / Sarathi
    kernels of 2023, which Vidur profiled)."""
    if style not in ROW_STYLES:
        raise ConfigError(f"row kernel style must be one of {', '.join(ROW_STYLES)}, got {style!r}")
    # a store writes its value into a state (a KV cache row), not the whole state
    out = max((nodes[nodes[m].inputs[1]] if nodes[m].op == "store" else nodes[m] for m in k.members),
              key=lambda n: n.size)
    reads = [nodes[i] for m in k.members for i in read_inputs(nodes[m]) if i not in k.members]
    itemsize = min((n.nbytes / max(n.size, 1) for n in reads if n.size), default=2.0)
    per_load = max(1, int(ROW_STYLES[style] // itemsize))
    red = [nodes[m] for m in k.members if nodes[m].op in REDUCE]
    if red:
        src = nodes[red[0].inputs[0]]
        d = src.shape[int(red[0].attrs.get("axis", -1))]
        elems = src.size / split.get(src.id, 1)
    elif style == "scalar" and out.shape:
        d, elems = out.shape[-1], out.size / split.get(out.id, 1)
    else:                                   # grid-wide elementwise: one load per thread and input
        slots = out.size / split.get(out.id, 1) / per_load
        return gpu.hbm_latency_us * max(1.0, slots / (THREADS_PER_SM * gpu.sm_count))
    rows = max(1.0, elems / max(d, 1))
    threads = min(1024, 32 * math.ceil(math.ceil(d / per_load) / 32))
    steps = math.ceil(d / (threads * per_load))
    waves = max(1.0, rows / (max(1, THREADS_PER_SM // threads) * gpu.sm_count))
    return gpu.hbm_latency_us * (1 + REREAD_LATENCY * (passes - 1)) * steps * waves


def _cost_kernel(graph, nodes, free, k: Kernel, kernel_of, gpu: GpuConfig, launch: str, tp=None,
                 inputs_in_l2=False, row_style: str = "vector") -> OpCost:
    members = set(k.members)
    split = tp.split if tp else {}
    causal = [nodes[m] for m in k.members if nodes[m].op == "causal"]
    mm_frac = _causal_fraction(causal[0]) if k.flash and causal else 1.0
    tc_us = cuda_flops = mm_flops = extra_bytes = plan_memory_us = 0.0
    flash_flops, flash_dims = 0.0, None
    for m in k.members:
        n = nodes[m]
        if n.op == "matmul":
            batch, mm, kk, nn, da, db = _matmul_dims(nodes, n)
            if tp:
                batch, mm, kk, nn = tp.matmul_dims(m, batch, mm, kk, nn)
            f = 2.0 * batch * mm * kk * nn * mm_frac
            mm_flops += f
            peak = _tensor_peak(gpu, da, db)
            if peak is None:
                cuda_flops += f
            elif k.flash:
                flash_flops += f
                flash_dims = flash_dims or (batch, mm, nn)
            else:
                plan = gemm_plan(gpu, batch, mm, kk, nn, peak, *(_stored_width(nodes, free, i) for i in n.inputs[:2]))
                reduce_us = gpu.kernel_fixed_us if plan.split_k > 1 else 0.0
                tc_us += plan.compute_us + reduce_us
                if gpu.gemm_plan_bound:     # the plan's HBM share and L2 feed bound the kernel too
                    plan_memory_us = max(plan_memory_us, plan.memory_us + reduce_us)
                if plan.split_k > 1:
                    extra_bytes += 2 * plan.split_k * batch * mm * nn * 4
        else:
            per = FLOPS_PER_ELEMENT[n.op]
            size = nodes[n.inputs[0]].size / split.get(n.inputs[0], 1) if n.op in REDUCE else n.size / split.get(m, 1)
            cuda_flops += per * size
    if flash_dims:
        batch, mm, nn = flash_dims
        tc_us += _flash_compute_us(gpu, batch * k.heads, mm, nn, flash_flops, bool(causal))
    # in a flash kernel the softmax runs between the tensor-core steps: attention_efficiency covers it
    cuda_us = 0.0 if k.flash else 1e6 * cuda_flops / (gpu.cuda_f32_tflops * 1e12 * gpu.cuda_efficiency)
    compute_us = tc_us + cuda_us

    reads: dict[int, float] = {}
    for m in k.members:
        for i in read_inputs(nodes[m]):
            for b, nb in sources(nodes, free, i):
                if b not in members:
                    reads[b] = min(reads.get(b, 0.0) + nb, float(nodes[b].nbytes))
    hbm, l2 = extra_bytes, 0.0
    for b, nb in reads.items():
        nb /= split.get(b, 1)
        if _in_l2(nodes[b], gpu, inputs_in_l2):
            l2 += nb
        else:
            hbm += nb
    for m in k.members:
        n = nodes[m]
        if n.op == "store":
            hbm += float(nodes[n.inputs[1]].nbytes) / split.get(m, 1)      # the state (KV cache) lives in HBM
        elif consumers(graph, nodes, free, m) - members:
            nb = float(n.nbytes) / split.get(m, 1)
            if _in_l2(n, gpu, written=not k.has_matmul):
                l2 += nb
            else:
                hbm += nb
    extra_passes = 0 if k.flash else sum(
        1 for m in k.members if nodes[m].op in REDUCE and any(u in members for u in graph.users(m)))
    row = not k.has_matmul
    if extra_passes:          # a row kernel whose reduction feeds its own ops re-reads its rows,
        # which the same thread block just read: from L1/L2, not HBM
        l2 += extra_passes * sum(nb / split.get(b, 1) for b, nb in reads.items())
    eff = gpu.hbm_efficiency
    memory_us = 1e6 * (hbm / (gpu.hbm_gbs * 1e9 * eff) + l2 / (gpu.l2_gbs * 1e9 * eff))
    if plan_memory_us:        # the epilogue's CUDA-core work follows the plan's last operand bytes
        memory_us = max(memory_us, plan_memory_us + cuda_us)

    if row:                   # memory-bound kernel: fixed + its chain of dependent loads + bytes
        memory_us = 1e6 * (hbm / (gpu.hbm_gbs * 1e9) + l2 / (gpu.l2_gbs * 1e9))
        latency_us = gpu.kernel_fixed_us + row_chain_us(nodes, k, gpu, split, 1 + extra_passes, row_style)
        body = max(compute_us, memory_us + latency_us)
    else:
        latency_us = gpu.gemm_fixed_us
        body = max(compute_us, memory_us) + latency_us
    time_us, launch_us = _with_launch(gpu, launch, body)
    parts = {"compute": compute_us, "hbm": memory_us, "latency": latency_us, "launch": launch_us}
    bound = max(BOUNDS[:4], key=lambda b: parts[b])
    head = nodes[k.head]
    return OpCost(node=k.head, op="attention" if k.flash else head.op, line=head.line,
                  flops=mm_flops + cuda_flops, bytes=hbm + l2, time_us=time_us, bound=bound,
                  hbm_bytes=hbm, compute_us=compute_us, memory_us=memory_us,
                  fused=tuple(k.members))


def _with_launch(gpu: GpuConfig, launch: str, body_us: float) -> tuple:
    """(wall time, launch share) of a kernel of duration body_us. In a CUDA graph each kernel adds
    the graph's per-kernel gap; on a stream the host issues kernels asynchronously, so a kernel
    costs at least one launch (the host-bound pipeline) and hides the launch when longer."""
    if launch == "none":
        return body_us, 0.0
    if launch == "graph":
        return body_us + gpu.launch_graph_us, gpu.launch_graph_us
    t = max(body_us + gpu.launch_graph_us, gpu.launch_stream_us)
    return t, t - body_us


def _in_l2(n, gpu: GpuConfig, inputs_in_l2=False, written: bool = False) -> bool:
    """Computed intermediates that fit in L2 stay there; weights and states come from HBM, and
    so do inputs unless a preceding kernel just wrote them (inputs_in_l2). A row kernel's output
    (written=True) stays in L2 only when it fits in a quarter of it, as inputs do: a row kernel
    streams its input through L2 while it writes, and dirty lines beyond that go back to HBM."""
    if n.op in LEAVES:            # a quarter of L2: the rest holds other data (and is split in two halves)
        hot = inputs_in_l2 is True or (isinstance(inputs_in_l2, (list, tuple)) and n.attrs.get("name") in inputs_in_l2)
        return hot and n.op == "input" and n.nbytes <= gpu.l2_bytes / 4
    return n.op != "store" and n.nbytes <= gpu.l2_bytes / (4 if written else 1)


# ---- summaries -------------------------------------------------------------------------------
def is_decode(graph: IRGraph) -> bool:
    """Heuristic: a decode step multiplies single rows (M == 1) by weights."""
    mms = [n for n in graph.nodes() if n.op == "matmul"]
    with_weight = [n for n in mms if any(graph.node(i).op == "weight" for i in n.inputs)]
    mms = with_weight or mms
    return bool(mms) and all(graph.node(n.inputs[0]).shape[-2] == 1 for n in mms)


def summarize(graph: IRGraph, gpu: GpuConfig, launch: str = "stream", fuse: bool = True,
              gpus: int = 1, host: bool = False) -> dict:
    """Phase, total time and the user-facing rate: tokens/s for decode, time to first token
    (ms) for prefill."""
    cost = cost_graph(graph, gpu, launch, fuse, gpus, host)
    out = {"gpu": gpu.name, "gpus": gpus, "time_us": cost.total_us, "kernels": len(cost.ops),
           "phase": "decode" if is_decode(graph) else "prefill"}
    if out["phase"] == "decode":
        out["tokens_per_s"] = 1e6 / cost.total_us
    else:
        out["ttft_ms"] = cost.total_us / 1e3
    return out
