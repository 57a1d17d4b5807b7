"""Tensor parallel on a system (`--parallel tp`): the chips of a node are the ranks of one split
graph (compiler/tensor_split.py). Every rank runs the same program, compiled once; the host
loads each rank's part of the split weights and states (the bundle's `rows`: per axis).

An all-reduce k of a partial sum P ([.., n] f32 for a row-split matmul) is placed by the
rank's own scheduler when P's output `@ar{k}>` is lowered (a lowering hook):

  send     per byte plane of P, per link j to another rank: a chain READ -> SEND (the READ
           after the plane's last write, by the scheduler's data rule), a link's SENDs in order
           one slot apart; each SEND marks the plane's arrival (its cycle + the hop latency).
  receive  per link j, per byte plane, in the order sent: a chain RECV -> WRITE into the input
           `@ar{k}.{j}`, the RECV at or after the latest arrival of that plane from any rank
           (every rank runs the same schedule, so a peer sends its plane when this rank sends
           its own) and after the link's previous RECV. The sum's reads of @ar{k}.{j} wait for
           these WRITEs (the data rule).

Every transfer is so placed statically, the same on every rank: a link carries one vector per
slot, and the emulator reports a RECV before its vector as a hazard.
"""
from __future__ import annotations

from dataclasses import replace

from lpu.compiler import partition as P
from lpu.compiler.chains import ChainBuilder
from lpu.compiler.chainspec import Ins
from lpu.compiler.driver import CompileStats, compile_graph
from lpu.compiler.links import FILL, persistent_layout, planes, recv_chains, send_chains, slot
from lpu.isa.program import send_cycles
from lpu.compiler.tensor_split import AR_PREFIX, TpError, ar_in, ar_out, split_graph
from lpu.isa import opcodes as O
from lpu.isa.errors import CapacityError, LpuError


def allreduce_hook(system, ranks: int, k: int, line: int):
    """The lowering hook of all-reduce k over `ranks` chips of a node (links 0 .. ranks-2)."""
    m = system.machine
    hop, slot_cycles = system.hop_cycles, system.slot_cycles

    def hook(low):
        ctx = low.ctx
        syms = {y.name: y for y in low.symbols}
        part = syms[ar_out(k)]
        vectors = planes(part)
        for v, b in vectors:
            for j in range(ranks - 1):
                q, lp = m.c2c_queue(j), m.c2c_pos(j)
                cb = ChainBuilder(ctx, line)
                gi = cb.read(slot(part, v, b, m), 1, lp, 0)
                cb.ins.append(Ins((q,), 0, O.SEND, [0], patch=((0, gi, 0, 0),), after=((("send", j), 0),),
                                  mark=((("send", j), slot_cycles), (("ar", k, v, b), hop))))
                low.chains.append(cb.chain())
        for j in range(ranks - 1):
            q, lp = m.c2c_queue(j), m.c2c_pos(j)
            into = syms[ar_in(k, j)]
            for v, b in vectors:
                cb = ChainBuilder(ctx, line)
                gi = cb.write(slot(into, v, b, m), 1, lp, 0)
                cb.ins.append(Ins((q,), 0, O.RECV, [0], patch=((0, gi, 0, 0),),
                                  after=((("ar", k, v, b), 0), (("recv", j), 0)), mark=((("recv", j), 1),)))
                low.chains.append(cb.chain())
    return hook


def compile_rank(tp, system, stats: CompileStats | None = None, before=None, after=None):
    """The one program every rank of `tp` (a TpGraph) runs, its all-reduce inputs of kind link."""
    hooks = {ar_out(k): allreduce_hook(system, tp.ranks, k, line) for k, (_, _, line) in enumerate(tp.allreduce)}
    prog = compile_graph(tp.graph, system.machine, stats, before=before, after=after, hooks=hooks)
    prog = replace(prog, symbols=[replace(y, kind="link") if y.kind == "input" and y.name.startswith("@") else y
                                  for y in prog.symbols])
    prog.params = dict(tp.graph.params)
    return prog


def tp_split(graph, ranks: int):
    try:
        return split_graph(graph, ranks)
    except TpError as e:
        raise LpuError(f"cannot split the program over {ranks} chips in tensor parallel: {e}") from None


def compile_tp(graph, system, stats: CompileStats | None = None):
    """(programs, outputs, rows) of `graph` in tensor parallel: over the system's chips when
    they are one node, else over each node of a pipeline of nodes (the graph cut into as many
    stages as nodes, compiler/partition.py; rank r of a node sends what the next node needs to
    rank r there, over their global link, as a pipeline's stages do, compiler/system.py)."""
    n = min(system.chips, system.chips_per_node)
    if system.chips % n:
        raise LpuError(f"tensor parallel over {system.chips} chips: a node has {system.chips_per_node}; "
                       f"past one node, whole nodes form a pipeline (a multiple of {n} chips)")
    nodes = system.chips // n
    m = system.machine
    if nodes == 1:
        stages = [P.Stage(graph, [])]
    else:
        try:
            cuts = P.choose_cuts(graph, nodes, int(m.sram_bytes * FILL) * n)
        except ValueError as e:
            raise LpuError(f"cannot split the program over {nodes} nodes: {e}") from None
        stages = P.split(graph, cuts, lambda a, b: list(range(a, b + 1)))
    progs, rows, outputs, inbound = [], [], {}, None
    for s, st in enumerate(stages):
        tp = tp_split(st.graph, n)
        g = tp.graph
        line_of = lambda name, g=g: g.node(g.decls.get(name, g.outputs.get(name, 0))).line  # noqa: E731
        sends = [(P.send_name(nid), system.rank_out, line_of(P.send_name(nid))) for nid, _ in st.send]
        log = {}
        before = recv_chains(system, persistent_layout(g, m), inbound) if inbound else None
        try:
            prog = compile_rank(tp, system, stats, before, send_chains(system, sends, log) if sends else None)
        except CapacityError as e:
            where = f"node {s} of {nodes}, " if nodes > 1 else ""
            raise CapacityError(f"{where}each of {n} chips in tensor parallel: {e}", **e.info) from None
        if sends:
            hop = system.global_hop_cycles
            inbound = [(system.rank_in, [(P.link_name(int(name[len(P.LINK_PREFIX):-1])), v, b, c + hop, line_of(name))
                                         for (name, v, b), c in zip(log[system.rank_out],
                                                                    send_cycles(prog, system.rank_out))])]
        shapes = {name: st.graph.node(leaf).shape for name, leaf in st.graph.decls.items()}
        for r in range(n):
            progs.append(replace(prog))
            rows.append(_parts(tp, st.rows, shapes, r))
        outputs.update({name: s * n for name in st.graph.outputs if not name.startswith(P.LINK_PREFIX)})
    return progs, outputs, rows


def _parts(tp, stage_rows: dict, shapes: dict, rank: int) -> dict:
    """A rank's part of each split tensor of its stage: the stage's rows of axis 0, then the
    rank's part of those (per axis)."""
    out = {}
    for name in set(tp.split) | set(stage_rows):
        part = list(tp.part(name, shapes[name], rank))
        if name in stage_rows:
            a = stage_rows[name][0]
            part[0] = (part[0][0] + a, part[0][1] + a)
        out[name] = tuple(part)
    return out


def is_link_name(name: str) -> bool:
    return name.startswith(AR_PREFIX)
