"""Link transfers of a chip of a system, as chains its own scheduler places (compiler/system.py
for pipeline stages, compiler/system_tp.py for tensor-parallel nodes in a pipeline): a value's
byte planes sent (READ -> SEND, after the plane's last write, a link's SENDs one slot apart) and
received (RECV -> WRITE at or after each vector's arrival), where the chip's symbols live, and
the SEND cycles of a compiled program."""
from __future__ import annotations

import numpy as np

from lpu.compiler.chains import ChainBuilder, Ctx
from lpu.compiler.chainspec import Ins, Registry
from lpu.compiler.lower import Lowerer
from lpu.compiler.place_core import NONE
from lpu.compiler.verify import UNIT
from lpu.isa import opcodes as O
from lpu.isa.machine import UNIT_ICU
from lpu.isa.program import vector_grid

FILL = 0.85      # of a chip's SRAM for a stage's resident tensors and transfers (the rest: its temporaries)


def slot(sym, v: int, b: int, m) -> int:
    """The plane slot (alloc.slot_place's numbering) of byte plane b of vector v of a symbol."""
    return (int(sym.addrs[v, b]) * m.banks_per_slice + int(sym.banks[v, b])) * m.mem_slices + int(sym.slices[v, b])


def planes(sym):
    return [(v, b) for v in range(sym.slices.shape[0]) for b in range(sym.slices.shape[1])]


def planes_by_chunk(sym, lanes: int):
    """The byte planes of a symbol, column chunk by column chunk (vector v is row v // chunks,
    chunk v % chunks): a receiver's matmul over the value can start on the first chunk of
    every row (its first K block) while the rest is still on the link."""
    nrow, chunks, _ = vector_grid(tuple(sym.shape), lanes)
    return [(r * chunks + c, b) for c in range(chunks) for r in range(nrow) for b in range(sym.slices.shape[1])]


def send_chains(system, sends, log):
    """after(sched, reg, low): per value sent (name, link), per byte plane, a chain READ -> SEND
    (the READ after the plane's last write, by the scheduler's data rule), each link's SENDs in
    order one slot apart. `log[link]` receives the (name, plane) of each SEND, in link order."""
    m = system.machine

    def after(sched, reg, low):
        ctx = low.ctx
        syms = {y.name: y for y in low.symbols}
        for name, link, line in sends:
            sym, q, lp = syms[name], m.c2c_queue(link), m.c2c_pos(link)
            for v, b in planes_by_chunk(sym, m.lanes):
                cb = ChainBuilder(ctx, line)
                gi = cb.read(slot(sym, v, b, m), 1, lp, 0)
                cb.ins.append(Ins((q,), 0, O.SEND, [0], patch=((0, gi, 0, 0),), after=((("send", link), 0),),
                                  mark=((("send", link), system.slot_cycles),)))
                sched.place(cb.chain())
                log.setdefault(link, []).append((name, v, b))
    return after


def recv_chains(system, layout, recvs):
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
                gi = cb.write(slot(layout[name], v, b, m), 1, lp, 0)
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


def persistent_layout(graph, machine) -> dict:
    """Where lowering puts the stage's inputs, weights and states (name -> Symbol): it places
    them first, before any chain, and the same way whatever the schedule."""
    low = Lowerer(graph, machine, Registry())
    low.place_persistent()
    return {y.name: y for y in low.symbols}


def send_cycles(prog, link: int) -> list:
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
