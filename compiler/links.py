"""Link transfers of a chip of a system, as chains its own scheduler places (compiler/system.py
for pipeline stages, compiler/system_tp.py for tensor-parallel nodes in a pipeline): a value's
byte planes sent (READ -> SEND, after the plane's last write, a link's SENDs one slot apart) and
received (RECV -> WRITE at or after each vector's arrival), where the chip's symbols live, and
the SEND cycles of a compiled program."""
from __future__ import annotations

import numpy as np

from lpu.compiler.chains import ChainBuilder, Ctx
from lpu.compiler.chainspec import Ins, Registry
from lpu.compiler.driver import rewritten
from lpu.compiler.lower import Lowerer
from lpu.compiler.place_core import NONE
from lpu.isa import opcodes as O
from lpu.isa.program import vector_grid

FILL = 0.85      # of a chip's SRAM for a stage's resident tensors and transfers (the rest: its temporaries)


def slot(sym, v: int, b: int, m) -> int:
    """The plane slot (alloc.slot_place's numbering) of byte plane b of vector v of a symbol."""
    return (int(sym.addrs[v, b]) * m.banks_per_slice + int(sym.banks[v, b])) * m.mem_slices + int(sym.slices[v, b])


def planes(sym):
    return [(v, b) for v in range(sym.slices.shape[0]) for b in range(sym.slices.shape[1])]


def planes_of(shape, width: int, lanes: int, bounds: list | None = None) -> list:
    """The byte planes (v, b) of a value of `shape` and dtype `width` bytes, column chunk by
    column chunk (vector v is row v // chunks, chunk v % chunks): a receiver's matmul over the
    value can start on the first chunk of every row (its first K block) while the rest is still
    on the link. With `bounds` (where groups of rows start, and the rows), group by group, each
    group column chunk by column chunk: a group is sent as soon as the sender has it (a
    layernorm's rows come a group at a time: compiler/rewrite_rows.py) and a receiver's matmul
    takes it as a block of rows (lower_mxm)."""
    nrow, chunks, _ = vector_grid(tuple(shape), lanes)
    bounds = bounds or [0, nrow]
    return [(r * chunks + c, b) for r0, r1 in zip(bounds, bounds[1:]) for c in range(chunks)
            for r in range(r0, r1) for b in range(width)]


def planes_by_chunk(sym, lanes: int):
    return planes_of(sym.shape, sym.slices.shape[1], lanes)


def place_sends(system, sched, ctx, syms, items):
    """Per (name, link, line, planes) in order, per byte plane, a chain READ -> SEND (the READ
    after the plane's last write, by the scheduler's data rule), each link's SENDs in order one
    slot apart. syms: name -> Symbol."""
    m = system.machine
    for name, link, line, pl in items:
        sym, q, lp = syms[name], m.c2c_queue(link), m.c2c_pos(link)
        for v, b in pl:
            cb = ChainBuilder(ctx, line)
            gi = cb.read(slot(sym, v, b, m), 1, lp, 0)
            cb.ins.append(Ins((q,), 0, O.SEND, [0], patch=((0, gi, 0, 0),), after=((("send", link), 0),),
                              mark=((("send", link), system.slot_cycles),)))
            sched.place(cb.chain())


def send_chains(system, sends, log):
    """after(sched, reg, low): per value sent (name, link, line), every byte plane in column-chunk
    order (place_sends). `log[link]` receives the (name, plane) of each SEND, in link order."""
    m = system.machine

    def after(sched, reg, low):
        syms = {y.name: y for y in low.symbols}
        items = [(name, link, line, planes_by_chunk(syms[name], m.lanes)) for name, link, line in sends]
        for name, link, _, pl in items:
            log.setdefault(link, []).extend((name, v, b) for v, b in pl)
        place_sends(system, sched, low.ctx, syms, items)
    return after


def place_recvs(system, sched, ctx, layout, recvs):
    """Per vector received, in its link's order, a chain RECV -> WRITE with the RECV at or after
    the vector's arrival (a marker preset to it) and after the link's previous RECV.
    recvs: [(link, [(name, v, b, arrival, line)] in link order)]; layout: name -> Symbol."""
    m, reg = system.machine, ctx.reg
    arrive = {}
    for link, items in recvs:
        for name, v, b, t, _ in items:
            arrive[reg.marker(("arrive", link, name, v, b))] = t
    sched.markers = _grown(sched.markers, len(reg.markers))
    for i, t in arrive.items():
        sched.markers[i] = t
    for link, items in recvs:
        q, lp = m.c2c_queue(link), m.c2c_pos(link)
        for name, v, b, t, line in items:
            cb = ChainBuilder(ctx, line)
            gi = cb.write(slot(layout[name], v, b, m), 1, lp, 0)
            cb.ins.append(Ins((q,), 0, O.RECV, [0], patch=((0, gi, 0, 0),),
                              after=((("arrive", link, name, v, b), 0), (("recv", link), 0)),
                              mark=((("recv", link), 1),)))
            sched.place(cb.chain())


def recv_chains(system, layout, recvs):
    """before(sched, reg): place_recvs of recvs."""
    def before(sched, reg):
        place_recvs(system, sched, Ctx(system.machine, None, reg), layout, recvs)
    return before


def _grown(a, n):
    if len(a) >= n:
        return a
    out = np.full(n, NONE, np.int64)
    out[:len(a)] = a
    return out


def persistent_layout(graph, machine) -> dict:
    """Where lowering puts the stage's inputs, weights and states (name -> Symbol): it places
    them first, before any chain, and the same way whatever the schedule (in the graph as
    rewritten for lowering: the rewrites may change the order of the leaves)."""
    low = Lowerer(rewritten(graph, machine), machine, Registry())
    low.place_persistent()
    return {y.name: y for y in low.symbols}
