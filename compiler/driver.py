"""The compiler as a list of named passes: elaborate -> plan -> lower (with alloc) ->
schedule -> codegen. `compile_graph` runs the back end on an IR graph; `compile_source` and
`compile_file` start from DSL text."""
from __future__ import annotations

import ctypes
import gc
import time
from dataclasses import dataclass, field

from lpu.compiler.chainspec import Registry
from lpu.compiler.codegen import codegen
from lpu.compiler.budget import check_size
from lpu.compiler.ir import IRGraph
from lpu.compiler.lower import lower
from lpu.compiler.rewrite import rewrite
from lpu.compiler.rewrite_pack import pack_heads, split_joins
from lpu.compiler.rewrite_decode import decode_heads
from lpu.compiler.rewrite_late import late_columns
from lpu.compiler.rewrite_defer import defer_norm
from lpu.compiler.rewrite_latency import one_pass_var, split_gemv
from lpu.compiler.rewrite_rope import heads_rope
from lpu.compiler.rewrite_rows import row_groups
from lpu.compiler.rewrite_pair import pair_heads
from lpu.compiler.schedule import Scheduler
from lpu.isa.machine import MachineConfig
from lpu.isa.program import Program


@dataclass
class CompileStats:
    pass_seconds: dict = field(default_factory=dict)
    chains: int = 0
    sram_peak_bytes: int = 0
    stage: str = ""            # the pass running now, and chains placed so far (for progress lines)
    placed: int = 0
    replayed: int = 0          # IR nodes lowered by replaying a loop trip's twin (compiler/replay.py)
    placed_again: int = 0      # chains placed as their twin in the trip before, shifted (compiler/segments.py)


def compile_graph(graph: IRGraph, machine: MachineConfig, stats: CompileStats | None = None,
                  repeat: bool = True, before=None, after=None, hooks=None) -> Program:
    """The back end (repeat=False: no REPEAT in the stream, every instruction spelled out).
    The cyclic garbage collector is paused meanwhile: lowering creates
    millions of small acyclic objects, and its passes over them cost more than the work.
    before(sched, reg) places chains ahead of the program's, after(sched, reg, low) after them
    (a chip of a system: its link receives and sends, compiler/system.py); hooks: output name ->
    fn(lowerer), called when that output is lowered (a tensor-parallel rank's all-reduces)."""
    was_enabled = gc.isenabled()
    check_size(graph, machine)            # limit 'vector_ops', before any lowering
    keep_freed_memory()
    gc.disable()
    try:
        return _compile_graph(graph, machine, stats, repeat, before, after, hooks)
    finally:
        if was_enabled:
            gc.enable()


def _compile_graph(graph: IRGraph, machine: MachineConfig, stats: CompileStats | None, repeat: bool,
                   before=None, after=None, hooks=None) -> Program:
    stats = stats if stats is not None else CompileStats()
    t0 = time.perf_counter()
    graph = rewritten(graph, machine)
    reg = Registry()
    sched = Scheduler(machine, reg)
    placing = [0.0]

    def sink(chain):     # lowering and scheduling interleave: chains are placed in batches
        t = time.perf_counter()
        sched.place(chain)
        stats.placed += chain.n_chains
        placing[0] += time.perf_counter() - t

    stats.stage = "lower and schedule"
    if before is not None:
        before(sched, reg)
    low = lower(graph, machine, sink, reg, hooks, sched.begin_segment)
    if after is not None:
        after(sched, reg, low)
    t1 = time.perf_counter() - placing[0]     # lowering's own time ends here
    nodes = [(n.op, n.line) for n in graph.nodes()]
    predicted = sched.predicted_cycles()
    stats.placed_again = sched.placed_again
    placed = sched.take_placed()
    sched = None                               # its tables are not needed any more
    t2 = time.perf_counter()
    stats.stage = "codegen"
    prog = codegen(machine, placed, low.symbols, low.ctx.table_array(), nodes,
                   predicted, graph.source_name, graph.source_lines(), repeat)
    t3 = time.perf_counter()
    stats.pass_seconds.update(lower=t1 - t0, schedule=t2 - t1, codegen=t3 - t2)
    stats.chains = low.n_chains
    stats.replayed = low.replayed
    stats.sram_peak_bytes = low.alloc.peak * machine.lanes
    return prog


_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3      # glibc's mallopt parameters
_HEAP_KEPT = 1 << 30     # bytes: arrays up to this size come from the heap, and it keeps this much free
_kept = [False]


def keep_freed_memory():
    """Once per process: have C's malloc (numpy's and Numba's arrays) keep freed memory for reuse
    instead of giving it back to the system (glibc maps an array over its mmap threshold
    fresh and unmaps it when freed; a fresh page costs a fault the first time it is written).
    A compile writes every placed instruction 3 times (the placed batches, codegen's records,
    the stream's rows: ~730 MB for bert_base's 4.9M instructions), all of it in arrays over
    the threshold; with the freed memory kept, a later compile in the process (a system's next
    chip, a benchmark's or test's next program) writes into pages it already has. bert_base
    compiled twice in one process, the second: 81K page faults and 0.26-0.87 s system time ->
    7.6K faults and 0.04-0.08 s (loaded machine); one compile alone (`lpu compile`): 385K ->
    162K faults, system time and peak RSS (1.05 GB) unchanged. No-op where there is no mallopt."""
    if _kept[0]:
        return
    _kept[0] = True
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return
    mallopt(_M_MMAP_THRESHOLD, _HEAP_KEPT)
    mallopt(_M_TRIM_THRESHOLD, _HEAP_KEPT)


def rewritten(graph: IRGraph, machine: MachineConfig) -> IRGraph:
    """The graph lowering sees: layout choices as graph rewrites."""
    lanes = machine.lanes
    graph = row_groups(split_gemv(one_pass_var(graph), machine))
    graph = decode_heads(heads_rope(split_joins(pack_heads(rewrite(graph, lanes), lanes), lanes), lanes), lanes)
    return pair_heads(defer_norm(late_columns(graph, lanes)), lanes)


def compile_source(text: str, name: str = "<string>", params=None, machine: MachineConfig | None = None,
                   stats: CompileStats | None = None) -> tuple[Program, IRGraph]:
    from lpu.compiler.frontend import elaborate_source
    machine = machine or MachineConfig.load("tsp-v1")
    t0 = time.perf_counter()
    stats = stats if stats is not None else CompileStats()
    stats.stage = "elaborate"
    graph = elaborate_source(text, name, params or {})
    stats.pass_seconds["elaborate"] = time.perf_counter() - t0
    prog = compile_graph(graph, machine, stats)
    prog.params = dict(graph.params)
    return prog, graph


def compile_file(path: str, params=None, machine: MachineConfig | None = None,
                 stats: CompileStats | None = None) -> tuple[Program, IRGraph]:
    with open(path) as f:
        text = f.read()
    return compile_source(text, path, params, machine, stats)
