"""Compiling for a system of chips (isa/system.py): pipeline stages (compiler/partition.py),
each compiled by the one-chip back end (`driver.compile_graph`), joined by link transfers
placed statically here.

A chip's program has three phases, in this order (each one's cycles known when it is built):

  receive  per vector of a value sent to this chip: RECV on the link's queue at or after its
           arrival (send cycle + hop_cycles), then WRITE of its byte plane where the stage's
           body expects that input; a link's RECVs keep the order of its SENDs
  body     the stage as compiled alone, every instruction shifted by the end of the receive phase
  send     per vector of a value a later stage needs: READ of its byte plane, on a stream to the
           link's edge of the chip, and SEND there; one vector per link slot (slot_cycles)

Between phases a gap of n_positions + the longest latency keeps a phase's stream diagonals
apart from the other's. Stage i is compiled after stage i-1, so its RECVs are placed knowing
every SEND: nothing waits at run time, and the emulator reports a RECV before its vector's
arrival as a hazard. Link transfers use stream `link % streams_per_direction`, flowing from
the slices to the link's edge (send) or from the edge to the slices (receive).
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from lpu.compiler import partition as P
from lpu.compiler.codegen import codegen
from lpu.compiler.driver import CompileStats, compile_graph
from lpu.compiler.verify import _Expanded
from lpu.isa import opcodes as O
from lpu.isa.errors import CapacityError, LpuError
from lpu.isa.machine import EAST, WEST
from lpu.isa.opcodes import NARGS, make_ref
from lpu.isa.program import Program
from lpu.isa.system import MAX_CHIPS, SystemConfig


@dataclass
class SystemProgram:
    """Every chip's program, and the system they run on."""
    system: SystemConfig
    chips: list                          # [Program], one per chip
    outputs: dict = field(default_factory=dict)    # output name -> chip that holds it
    params: dict = field(default_factory=dict)
    rows: list = field(default_factory=list)       # per chip: split tensor name -> (start, stop) of axis 0

    @property
    def predicted_cycles(self) -> int:
        return max(p.predicted_cycles for p in self.chips)

    @property
    def n_instructions(self) -> int:
        return sum(p.n_instructions for p in self.chips)


class _Rows:
    """Placed instructions being collected for codegen (it calls `take`)."""

    def __init__(self):
        self.rows = []

    def add(self, cyc, q, op, args, line=0, node=-1):
        a = list(args) + [0] * (NARGS - len(args))
        self.rows.append((cyc, q, op, a, line, node))

    def take(self):
        r = self.rows
        return (np.array([x[0] for x in r], np.int64), np.array([x[1] for x in r], np.int32),
                np.array([x[2] for x in r], np.int32), np.array([x[3] for x in r], np.int32).reshape(-1, NARGS),
                np.array([x[4] for x in r], np.int32), np.array([x[5] for x in r], np.int32))


class _Busy:
    """Queue cycles, bank cycles and stream diagonals taken by a transfer phase."""

    def __init__(self):
        self.q, self.bank, self.diag = set(), set(), set()

    def mem_free(self, m, sl, bank, t) -> int:
        """A free port of slice sl in cycle t with its bank free, or -1."""
        if (sl, bank, t) in self.bank:
            return -1
        for port in (0, 1):
            if (m.mem_queue(sl, port), t) not in self.q:
                return port
        return -1


def _planes(sym):
    """(slice, bank, addr) of every byte plane of a symbol, vector by vector."""
    return [(int(sym.slices[v, b]), int(sym.banks[v, b]), int(sym.addrs[v, b]))
            for v in range(sym.slices.shape[0]) for b in range(sym.slices.shape[1])]


def _gap(m) -> int:
    return m.n_positions + max(m.latency.values()) + 1


def place_sends(system, prog, start, sends, rows, line_of):
    """Append the send phase from cycle `start`: sends = [(name, link)]. Returns the send cycles
    [(name, link, [cycle per vector])] and the phase's last cycle."""
    m = system.machine
    busy, out, last = _Busy(), [], start
    lat = m.latency["mem_read"]
    link_free = {}
    for name, link in sends:
        sym = prog.symbol(name)
        lp = m.c2c_pos(link)
        d = WEST if lp == 0 else EAST
        stream = link % m.streams_per_direction
        ref = make_ref(0, d, stream)
        cycles = []
        for sl, bank, addr in _planes(sym):
            dist = abs(m.slice_pos(sl) - lp)
            t = max(link_free.get(link, start), start + lat + dist)
            while True:
                r = t - lat - dist
                port = busy.mem_free(m, sl, bank, r)
                if port >= 0 and (d, stream, t + (lp if d == WEST else -lp)) not in busy.diag:
                    break
                t += 1
            busy.q.add((m.mem_queue(sl, port), r))
            busy.bank.add((sl, bank, r))
            busy.diag.add((d, stream, t + (lp if d == WEST else -lp)))
            rows.add(r, m.mem_queue(sl, port), O.READ, [bank, addr, ref], line_of(name))
            rows.add(t, m.c2c_queue(link), O.SEND, [ref], line_of(name))
            cycles.append(t)
            link_free[link] = t + system.slot_cycles
            last = max(last, t)
        out.append((name, link, cycles))
    return out, last


def place_recvs(system, prog, recvs, rows, line_of):
    """The receive phase: recvs = [(name, link, [arrival cycle per vector])] in the order the
    link delivers them. Returns its last cycle (-1: none)."""
    m = system.machine
    busy, last = _Busy(), -1
    link_next = {}
    for name, link, arrivals in recvs:
        sym = prog.symbol(name)
        lp = m.c2c_pos(link)
        d = EAST if lp == 0 else WEST
        stream = link % m.streams_per_direction
        ref = make_ref(0, d, stream)
        for (sl, bank, addr), arrive in zip(_planes(sym), arrivals):
            dist = abs(m.slice_pos(sl) - lp)
            t = max(arrive, link_next.get(link, 0))
            while True:
                port = busy.mem_free(m, sl, bank, t + dist)
                if port >= 0 and (d, stream, t - (lp if d == EAST else -lp)) not in busy.diag:
                    break
                t += 1
            busy.q.add((m.mem_queue(sl, port), t + dist))
            busy.bank.add((sl, bank, t + dist))
            busy.diag.add((d, stream, t - (lp if d == EAST else -lp)))
            rows.add(t, m.c2c_queue(link), O.RECV, [ref], line_of(name))
            rows.add(t + dist, m.mem_queue(sl, port), O.WRITE, [bank, addr, ref], line_of(name))
            link_next[link] = t + 1
            last = max(last, t + dist)
    return last


def _body_rows(prog: Program, shift: int, rows: _Rows) -> None:
    e = _Expanded(prog)
    for i in range(len(e.cycle)):
        src = int(e.src[i])
        rows.rows.append((int(e.cycle[i]) + shift, int(e.queue[i]), int(e.op[i]), [int(x) for x in e.args[i]],
                          int(prog.line[src]), int(prog.node[src])))


def compile_stages(system: SystemConfig, stages: list, stats: CompileStats | None = None) -> list[Program]:
    """Each stage's program with its link transfers (stages from partition.split)."""
    m = system.machine
    bodies = []
    for s, st in enumerate(stages):
        try:
            bodies.append(compile_graph(st.graph, m, stats))
        except CapacityError as e:
            raise CapacityError(f"chip {s} of {len(stages)}: {e}", **e.info) from None
    arrivals = {}                  # (node id, to stage) -> [arrival cycle per vector]
    progs = []
    for s, (st, body) in enumerate(zip(stages, bodies)):
        rows = _Rows()
        line_of = lambda name, g=st.graph: g.node(g.decls.get(name, g.outputs.get(name, 0))).line  # noqa: E731
        recvs = []
        for nid, frm in st.recv:
            link = system.link_between(frm, s)[1]
            if (nid, s) not in arrivals:
                raise AssertionError(f"chip {s} receives @{nid} from chip {frm}, which sends it later")
            recvs.append((P.link_name(nid), link, arrivals[(nid, s)]))
        recvs.sort(key=lambda r: (r[1], r[2][0]))        # per link, in the order sent
        last = place_recvs(system, body, recvs, rows, line_of)
        shift = last + _gap(m) if last >= 0 else 0
        _body_rows(body, shift, rows)
        end = shift + body.predicted_cycles
        sends = [(nid, system.link_between(s, to)[0], to) for nid, to in st.send]
        placed, _ = place_sends(system, body, end + _gap(m), [(P.send_name(n), lk) for n, lk, _ in sends], rows,
                                line_of)
        for (_, _, cycles), (nid, _, to) in zip(placed, sends):
            arrivals[(nid, to)] = [c + system.hop_between(s, to) for c in cycles]
        cyc = np.array([r[0] for r in rows.rows], np.int64)
        lat = np.array(O.latency_table(m), np.int64)[np.array([r[2] for r in rows.rows], np.int64)]
        predicted = int((cyc + lat).max()) + 1 + m.icu_skew if len(cyc) else 0
        symbols = [_as_link(sym) if sym.name.startswith(P.LINK_PREFIX) and sym.kind == "input" else sym
                   for sym in body.symbols]
        prog = codegen(m, rows, symbols, body.tables, body.nodes, predicted, body.source_name, body.source_lines)
        prog.params = dict(st.graph.params)
        progs.append(prog)
    return progs


def _as_link(sym):
    return replace(sym, kind="link")


def compile_system(graph, system: SystemConfig, stats: CompileStats | None = None) -> SystemProgram:
    """Partition `graph` over system.chips chips (pipeline parallel) and compile every chip."""
    if system.chips == 1:
        prog = compile_graph(graph, system.machine, stats)
        prog.params = dict(graph.params)
        return SystemProgram(system, [prog], {name: 0 for name in graph.outputs}, dict(graph.params), [{}])
    try:
        cuts = P.choose_cuts(graph, system.chips)
    except ValueError as e:
        raise LpuError(f"cannot split the program over {system.chips} chips: {e}") from None
    stages = P.split(graph, cuts, system.route)
    progs = compile_stages(system, stages, stats)
    outputs = {name: s for s, st in enumerate(stages) for name in st.graph.outputs
               if not name.startswith(P.LINK_PREFIX)}
    return SystemProgram(system, progs, outputs, dict(graph.params), [dict(st.rows) for st in stages])


def compile_auto(graph, system: SystemConfig, stats: CompileStats | None = None,
                 max_chips: int | None = None) -> SystemProgram:
    """The fewest chips (from the bytes of weights and states, then up while a chip runs out of
    SRAM) on which the program compiles."""
    m = system.machine
    resident = sum(n.nbytes for n in graph.nodes() if n.op in ("weight", "state", "const"))
    chips = max(1, -(-resident // m.sram_bytes))
    top = max_chips or min(MAX_CHIPS, max(2 * chips, system.chips_per_node))
    last = None
    while chips <= top:
        try:
            return compile_system(graph, replace(system, chips=chips), stats)
        except CapacityError as e:
            last = e
            chips += 1
    raise CapacityError(f"the program does not fit {top} chips of '{m.name}' (the most tried): {last}",
                        **(last.info if last else {}))
