"""Compiling for a system of chips (isa/system.py): pipeline stages (compiler/partition.py),
each compiled by the one-chip back end (`driver.compile_graph`) together with its link
transfers, which its scheduler places like every other chain:

  receive  per vector sent to this chip, in its link's order: a chain RECV -> WRITE (the byte
           plane where the stage expects that input), the RECV at or after the vector's
           arrival (its SEND + the link's latency: a marker preset to that cycle) and after the
           link's previous RECV. They are placed first, so the stage's reads of a received
           plane wait for its WRITE (the scheduler's data rule) and everything else goes ahead.
  send     per vector a later stage needs: a chain READ -> SEND, placed after the stage's own
           chains: the READ follows the plane's last write, so a value leaves as soon as it is
           final; a link's SENDs go in order, one slot (slot_cycles) apart.

Stage i is compiled after stage i-1, so its RECVs are placed knowing every SEND: nothing waits
at run time, and the emulator reports a RECV before its vector's arrival as a hazard. Where a
stage's inputs live is known before it is compiled: lowering places the persistent tensors
first, the same way whatever the schedule (checked after the compile).
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

from lpu.compiler import partition as P
from lpu.compiler.driver import CompileStats, compile_graph
from lpu.compiler.links import FILL
from lpu.compiler.pipeline_bound import pipeline_bound
from lpu.compiler.system_pp import compile_stages
from lpu.compiler.system_tp import compile_tp
from lpu.isa.errors import CapacityError, LpuError
from lpu.isa.system import MAX_CHIPS, SystemConfig


@dataclass
class SystemProgram:
    """Every chip's program, and the system they run on."""
    system: SystemConfig
    chips: list                          # [Program], one per chip
    outputs: dict = field(default_factory=dict)    # output name -> chip that holds it
    params: dict = field(default_factory=dict)
    rows: list = field(default_factory=list)       # per chip: split tensor name -> its part (emulator.system.part_index)
    parallel: str = "pp"                           # how the chips share the program: "pp" or "tp"

    @property
    def predicted_cycles(self) -> int:
        return max(p.predicted_cycles for p in self.chips)

    @property
    def n_instructions(self) -> int:
        return sum(p.n_instructions for p in self.chips)


def compile_system(graph, system: SystemConfig, stats: CompileStats | None = None,
                   parallel: str = "pp") -> SystemProgram:
    """Partition `graph` over system.chips chips and compile every chip. parallel: "pp"
    (pipeline), "tp" (tensor parallel in a node, or a pipeline of such nodes: compiler/system_tp.py)
    or "auto" (the one the compiler predicts faster; a tie keeps the pipeline). Auto compiles
    tensor parallel first and the pipeline only if a pipeline could be faster: when the bound on
    any pipeline schedule over the same cuts (compiler/pipeline_bound.py, from the IR alone)
    already exceeds tensor parallel's predicted cycles, the compiled pipeline would exceed them
    too and lose, so it is not compiled (llama2_7b_decode on 40 chips: 267,746 > 254,255)."""
    if system.chips > 1 and parallel in ("tp", "auto"):
        try:
            progs, outputs, rows = compile_tp(graph, system, stats)
            tp = SystemProgram(system, progs, outputs, dict(graph.params), rows, "tp")
        except LpuError:
            if parallel == "tp":
                raise
            tp = None
        if parallel == "tp":
            return tp
        if tp is not None and pipeline_loses(graph, system, tp.predicted_cycles):
            return tp
        try:
            pp = compile_system(graph, system, stats, "pp")
        except LpuError:
            if tp is None:
                raise
            return tp
        return tp if tp is not None and tp.predicted_cycles < pp.predicted_cycles else pp
    if system.chips == 1:
        prog = compile_graph(graph, system.machine, stats)
        prog.params = dict(graph.params)
        return SystemProgram(system, [prog], {name: 0 for name in graph.outputs}, dict(graph.params), [{}])
    stages = P.split(graph, pipeline_cuts(graph, system), system.route)
    progs = compile_stages(system, stages, stats)
    outputs = {name: s for s, st in enumerate(stages) for name in st.graph.outputs
               if not name.startswith(P.LINK_PREFIX)}
    return SystemProgram(system, progs, outputs, dict(graph.params), [dict(st.rows) for st in stages])


def pipeline_cuts(graph, system: SystemConfig) -> list[int]:
    """Where the pipeline's stages begin (partition.choose_cuts, the chip's SRAM less FILL)."""
    try:
        return P.choose_cuts(graph, system.chips, int(system.machine.sram_bytes * FILL))
    except ValueError as e:
        raise LpuError(f"cannot split the program over {system.chips} chips: {e}") from None


def pipeline_loses(graph, system: SystemConfig, cycles: int) -> bool:
    """Whether every pipeline schedule of `graph` on `system` takes more than `cycles` (its
    bound over the cuts the pipeline would take does)."""
    try:
        cuts = pipeline_cuts(graph, system)
    except LpuError:
        return False
    return pipeline_bound(graph, system, cuts) > cycles


def compile_auto(graph, system: SystemConfig, stats: CompileStats | None = None,
                 max_chips: int | None = None, parallel: str = "pp") -> SystemProgram:
    """The fewest chips (from the bytes of weights and states, then up while a chip runs out of
    SRAM) on which the program compiles (in tensor parallel: one node, or whole nodes)."""
    m = system.machine
    resident = sum(n.nbytes for n in graph.nodes() if n.op in ("weight", "state", "const"))
    chips = max(1, -(-resident // m.sram_bytes))
    top = max_chips or min(MAX_CHIPS, max(2 * chips, system.chips_per_node))
    if parallel == "tp":      # each rank holds its share of the weights: from that share, in
        chips = max(1, -(-resident // int(m.sram_bytes * FILL)))    # counts a node or whole nodes
    elif chips > 1:           # the fewest whose stages fit, before compiling any
        chips = P.fewest_chips(graph, chips, top, int(m.sram_bytes * FILL))
    last = None
    while chips <= top:
        if parallel == "tp" and chips > system.chips_per_node and chips % system.chips_per_node:
            chips += 1
            continue
        try:
            return compile_system(graph, replace(system, chips=chips), stats, parallel)
        except CapacityError as e:
            last = e
            chips += 1
    raise CapacityError(f"the program does not fit {top} chips of '{m.name}' (the most tried): {last}",
                        **(last.info if last else {}))
