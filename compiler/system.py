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

import numpy as np

from lpu.compiler import partition as P
from lpu.compiler.chains import ChainBuilder, Ctx
from lpu.compiler.chainspec import Ins, Registry
from lpu.compiler.driver import CompileStats, compile_graph
from lpu.compiler.lower import Lowerer
from lpu.compiler.verify import UNIT
from lpu.isa import opcodes as O
from lpu.isa.errors import CapacityError, LpuError
from lpu.compiler.place_core import NONE
from lpu.isa.machine import UNIT_ICU
from lpu.isa.program import Program
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


FILL = 0.85      # of a chip's SRAM for a stage's resident tensors and transfers (the rest: its temporaries)


def _slot(sym, v: int, b: int, m) -> int:
    """The plane slot (alloc.slot_place's numbering) of byte plane b of vector v of a symbol."""
    return (int(sym.addrs[v, b]) * m.banks_per_slice + int(sym.banks[v, b])) * m.mem_slices + int(sym.slices[v, b])


def _planes(sym):
    return [(v, b) for v in range(sym.slices.shape[0]) for b in range(sym.slices.shape[1])]


def _send_chains(system, sends, log):
    """after(sched, reg, low): per value sent (name, link), per byte plane, a chain READ -> SEND
    (the READ after the plane's last write, by the scheduler's data rule), each link's SENDs in
    order one slot apart. `log[link]` receives the (name, plane) of each SEND, in link order."""
    m = system.machine

    def after(sched, reg, low):
        ctx = low.ctx
        syms = {y.name: y for y in low.symbols}
        for name, link, line in sends:
            sym, q, lp = syms[name], m.c2c_queue(link), m.c2c_pos(link)
            for v, b in _planes(sym):
                cb = ChainBuilder(ctx, line)
                gi = cb.read(_slot(sym, v, b, m), 1, lp, 0)
                cb.ins.append(Ins((q,), 0, O.SEND, [0], patch=((0, gi, 0, 0),), after=((("send", link), 0),),
                                  mark=((("send", link), system.slot_cycles),)))
                sched.place(cb.chain())
                log.setdefault(link, []).append((name, v, b))
    return after


def _recv_chains(system, layout, recvs):
    """before(sched, reg): per vector received, in its link's order, a chain RECV -> WRITE with the
    RECV at or after the vector's arrival (a marker preset to it) and after the link's previous
    RECV. recvs: [(link, [(name, v, b, arrival, line)] in link order)]; layout: name -> Symbol."""
    m = system.machine

    def before(sched, reg):
        ctx = Ctx(m, None, reg)
        arrive = {}
        for link, items in recvs:
            q, lp = m.c2c_queue(link), m.c2c_pos(link)
            for k, (name, v, b, t, line) in enumerate(items):
                key = ("arrive", link, k)
                arrive[reg.marker(key)] = t
                cb = ChainBuilder(ctx, line)
                gi = cb.write(_slot(layout[name], v, b, m), 1, lp, 0)
                cb.ins.append(Ins((q,), 0, O.RECV, [0], patch=((0, gi, 0, 0),),
                                  after=((key, 0), (("recv", link), 0)), mark=((("recv", link), 1),)))
                sched.place(cb.chain())
        sched.markers = _grown(sched.markers, len(reg.markers))
        for i, t in arrive.items():
            sched.markers[i] = t
    return before


def _grown(a, n):
    if len(a) >= n:
        return a
    out = np.full(n, NONE, np.int64)
    out[:len(a)] = a
    return out


def _persistent_layout(graph, machine) -> dict:
    """Where lowering puts the stage's inputs, weights and states (name -> Symbol): it places
    them first, before any chain, and the same way whatever the schedule."""
    low = Lowerer(graph, machine, Registry())
    low.place_persistent()
    return {y.name: y for y in low.symbols}


def _send_cycles(prog, link: int) -> list:
    """Issue cycles of the SENDs on a link, from its C2C queue's instructions alone (a queue's
    instructions are one run in the program; NOPs wait, REPEAT reissues the one before it)."""
    idx = np.flatnonzero(prog.queue == prog.machine.c2c_queue(link))
    if len(idx) == 0:
        return []
    assert idx[-1] - idx[0] + 1 == len(idx), "a queue's instructions are one run"
    op, args = prog.op[idx].astype(np.int64), prog.args[idx].astype(np.int64)
    dur = np.where(op == O.NOP, args[:, 0], np.where(op == O.REPEAT, args[:, 0] * args[:, 1],
                                                  np.where(UNIT[op] == UNIT_ICU, 0, 1)))
    issue = np.cumsum(dur) - dur
    out = [int(c) for c in issue[op == O.SEND]]
    for r in np.flatnonzero((op == O.REPEAT)[1:]) + 1:
        if op[r - 1] == O.SEND:
            out += [int(issue[r - 1] + j * args[r, 1]) for j in range(1, int(args[r, 0]) + 1)]
    return sorted(out)


def compile_stages(system: SystemConfig, stages: list, stats: CompileStats | None = None) -> list[Program]:
    """Each stage's program with its link transfers (stages from partition.split), in stage
    order: a stage's receives are placed from the send cycles of the stages before it."""
    m = system.machine
    inbound = {}                 # (to stage, link on it) -> [(name, v, b, arrival, line)] in link order
    progs = []
    for s, st in enumerate(stages):
        g = st.graph
        line_of = lambda name, g=g: g.node(g.decls.get(name, g.outputs.get(name, 0))).line  # noqa: E731
        sends = [(P.send_name(nid), system.link_between(s, to)[0], line_of(P.send_name(nid))) for nid, to in st.send]
        log = {}
        after = _send_chains(system, sends, log) if sends else None
        try:
            if st.recv:
                layout = _persistent_layout(g, m)                                 # where the inputs live
                recvs = [(link, items) for (to, link), items in sorted(inbound.items()) if to == s]
                prog = compile_graph(g, m, stats, before=_recv_chains(system, layout, recvs), after=after)
                moved = [y.name for y in prog.symbols if y.name in layout and y != layout[y.name]]
                if moved:
                    raise AssertionError(f"chip {s}: the layout of {moved[0]} changed between two compilations")
            else:
                prog = compile_graph(g, m, stats, after=after)
        except CapacityError as e:
            raise CapacityError(f"chip {s} of {len(stages)}: {e}", **e.info) from None
        for nid, to in st.send:
            link, back = system.link_between(s, to)
            if (to, back) in inbound:
                continue
            cycles = _send_cycles(prog, link)
            hop = system.hop_between(s, to)
            inbound[(to, back)] = [(P.link_name(int(name[len(P.LINK_PREFIX):-1])), v, b, c + hop,
                                    line_of(name)) for (name, v, b), c in zip(log[link], cycles)]
        prog = replace(prog, symbols=[_as_link(y) if y.name.startswith(P.LINK_PREFIX) and y.kind == "input" else y
                                      for y in prog.symbols])
        prog.params = dict(g.params)
        progs.append(prog)
    return progs


def _as_link(sym):
    return replace(sym, kind="link")


def compile_system(graph, system: SystemConfig, stats: CompileStats | None = None,
                   parallel: str = "pp") -> SystemProgram:
    """Partition `graph` over system.chips chips and compile every chip. parallel: "pp"
    (pipeline), "tp" (tensor parallel in a node, or a pipeline of such nodes: compiler/system_tp.py)
    or "auto" (both where
    tensor parallel splits the program: the one the compiler predicts faster)."""
    if system.chips > 1 and parallel in ("tp", "auto"):
        from lpu.compiler.system_tp import compile_tp
        try:
            progs, outputs, rows = compile_tp(graph, system, stats)
            tp = SystemProgram(system, progs, outputs, dict(graph.params), rows, "tp")
        except LpuError:
            if parallel == "tp":
                raise
            tp = None
        if parallel == "tp":
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
    try:
        cuts = P.choose_cuts(graph, system.chips, int(system.machine.sram_bytes * FILL))
    except ValueError as e:
        raise LpuError(f"cannot split the program over {system.chips} chips: {e}") from None
    stages = P.split(graph, cuts, system.route)
    progs = compile_stages(system, stages, stats)
    outputs = {name: s for s, st in enumerate(stages) for name in st.graph.outputs
               if not name.startswith(P.LINK_PREFIX)}
    return SystemProgram(system, progs, outputs, dict(graph.params), [dict(st.rows) for st in stages])


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
