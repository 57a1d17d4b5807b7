"""The stages of a pipeline compiled with their link transfers (compiler/system.py), a cut over
several paths at once.

A cut of a pipeline of one input happens while every chip but its two ends is idle, and a node's
chips are fully connected: a long cut (at least RELAY_HOPS hop latencies on one link) is sent
over the direct link and, through each other chip of the node (a *relay*), over two more links:
its byte planes go round robin over the paths, column chunk by column chunk, or, when the sender
makes the value a group of rows at a time (a layernorm's, compiler/rewrite_rows.py), group by
group (the receiver's first matmul takes them as blocks of rows: attr `arrives` of its link
input), each group column chunk by column chunk. A relay receives its share into a buffer of its
own (an input `@<node>^`, kind link) and sends each plane on as soon as it is written (RECV ->
WRITE, READ -> SEND: the chains of compiler/links.py). bert_large on 4 chips: 3,072 vectors a
cut, 73.7k cycles on one link, about a third of that on three.

Every transfer is placed by its chip's scheduler, so each chip needs the SEND cycles of the
vectors it receives before it places their RECVs. A relay may be a chip compiled before the cut's
sender (chip 0 relays the cut from chip 2 to chip 3, long after its own work), so the chips are
compiled at once, one thread each, and each waits where it needs another's cycles:

  before its own chains   relays of cuts to an earlier chip (placed first: the chip is idle),
                          then its own receives;
  after its own chains    its own sends, then relays of cuts from a later chip.

A chip's transfers on one link are placed in the order (cut's sender, to a relay first, value),
the same order at both ends. The threads run one at a time (lowering is Python); a failure in
one stops the others."""
from __future__ import annotations

import threading
from dataclasses import dataclass, replace

import numpy as np

from lpu.compiler import partition as P
from lpu.compiler.chains import Ctx
from lpu.compiler.driver import compile_graph, rewritten
from lpu.compiler.links import persistent_layout, place_recvs, place_sends, planes_of
from lpu.isa import opcodes as O
from lpu.isa.dtypes import dtype_width
from lpu.isa.errors import CapacityError
from lpu.isa.program import send_cycles

RELAY_HOPS = 8       # a cut goes over several paths when one link would take this many hop latencies


@dataclass(frozen=True)
class Hop:
    """One link's share of a value sent from stage `cut`: planes [(v, b)] from chip src to dst."""
    cut: int
    kind: int            # 0: to a relay, 1: to the value's stage
    nid: int
    src: int
    dst: int
    name_src: str
    name_dst: str
    planes: tuple
    line: int

    @property
    def order(self):
        return (self.cut, self.kind, self.nid)


def plan(system, stages) -> tuple[list, list]:
    """(hops, relays): every hop of every value sent, and per relayed value (sender, relay, value's
    stage, the hop in, the hop out)."""
    m = system.machine
    hops, relays = [], []
    for s, st in enumerate(stages):
        for nid, to in st.send:
            g = st.graph
            node = g.node(g.outputs[P.send_name(nid)])
            bounds = _groups_sent(st.graph, P.send_name(nid), m)
            planes = planes_of(node.shape, dtype_width(node.dtype), m.lanes, bounds)
            if bounds:                   # the receiver's matmuls take it a group at a time
                tg = stages[to].graph
                tg.node(tg.decls[P.link_name(nid)]).attrs["arrives"] = tuple(zip(bounds, bounds[1:]))
            via = [r for r in range(system.chips) if r not in (s, to) and system.node_of(r) == system.node_of(s)
                   == system.node_of(to)] if to == s + 1 else []
            if len(planes) * system.slot_cycles < RELAY_HOPS * system.hop_cycles:
                via = []
            paths = [None] + via
            for k, r in enumerate(paths):
                share = tuple(planes[k::len(paths)])
                if r is None:
                    hops.append(Hop(s, 1, nid, s, to, P.send_name(nid), P.link_name(nid), share, node.line))
                    continue
                a = Hop(s, 0, nid, s, r, P.send_name(nid), P.relay_name(nid), share, node.line)
                b = Hop(s, 1, nid, r, to, P.relay_name(nid), P.link_name(nid), share, node.line)
                hops += [a, b]
                relays.append((s, r, to, a, b))
                rg = stages[r].graph
                if P.relay_name(nid) not in rg.decls:
                    rg.decls[P.relay_name(nid)] = rg.add("input", [], node.shape, node.dtype,
                                                         {"name": P.relay_name(nid)}, node.line, node.col)
    return hops, relays


def _groups_sent(graph, name, m) -> list | None:
    """Where the row groups of output `name` start, and its rows, when the stage makes it a group
    of rows at a time (a layernorm's result joined from its groups: compiler/rewrite_rows.py),
    else None."""
    g = rewritten(graph, m)
    n = g.node(g.outputs[name])
    if n.op == "output":
        n = g.node(n.inputs[0])
    if n.op != "concat" or n.attrs["axis"] not in (0, -2) or len(n.shape) != 2:
        return None
    parts = [g.node(i) for i in n.inputs]
    if not all("rows" in p.attrs for p in parts):
        return None
    return [0] + [int(x) for x in np.cumsum([p.shape[0] for p in parts])]


class _Board:
    """The arrivals each chip publishes for the others: (chip, link, hop order) -> items."""

    def __init__(self):
        self.cv = threading.Condition()
        self.items = {}
        self.failed = False

    def put(self, key, items):
        with self.cv:
            self.items[key] = items
            self.cv.notify_all()

    def get(self, key):
        with self.cv:
            while key not in self.items and not self.failed:
                self.cv.wait()
            if self.failed:
                raise _Stopped()
            return self.items[key]

    def fail(self):
        with self.cv:
            self.failed = True
            self.cv.notify_all()


class _Stopped(Exception):
    """Another chip's compile failed."""


def compile_stages(system, stages: list, stats=None) -> list:
    """Each stage's program with its link transfers (stages from partition.split)."""
    hops, relays = plan(system, stages)
    board, progs, errors = _Board(), [None] * len(stages), [None] * len(stages)

    def run(c):
        try:
            progs[c] = _compile_chip(system, stages, c, hops, relays, board, stats)
        except BaseException as e:      # noqa: BLE001  (handed to the caller below)
            errors[c] = e
            board.fail()

    if len(stages) == 1 or not relays:
        for c in range(len(stages)):       # in order, each from the cycles of the ones before
            run(c)
            if errors[c] is not None:
                break
    else:
        old = threading.stack_size(64 << 20)
        try:
            threads = [threading.Thread(target=run, args=(c,), name=f"chip{c}") for c in range(len(stages))]
        finally:
            threading.stack_size(old)
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    for c, e in enumerate(errors):
        if e is not None and not isinstance(e, _Stopped):
            if isinstance(e, CapacityError):
                raise CapacityError(f"chip {c} of {len(stages)}: {e}", **e.info) from None
            raise e
    return progs


def _compile_chip(system, stages, c, hops, relays, board, stats):
    m = system.machine
    st = stages[c]
    g = st.graph
    early = [x for x in relays if x[1] == c and x[1] > x[2]]
    late = [x for x in relays if x[1] == c and x[1] < x[0]]
    own_in = sorted((h for h in hops if h.dst == c and h.kind == 1), key=Hop.order.fget)
    own_out = sorted((h for h in hops if h.src == c and h.cut == c), key=Hop.order.fget)
    sent = {}                              # link -> SEND cycles placed, in order

    def relay(sched, ctx, layout, x):
        _, r, _, a, b = x
        receive(sched, ctx, layout, [a])
        send(sched, ctx, layout, [b])

    def receive(sched, ctx, layout, hs):
        recvs = [(system.link_between(c, h.src)[0], [(h.name_dst, v, b, t, h.line) for (v, b), t in
                                                    zip(h.planes, board.get((c, h.src, h.order)))]) for h in hs]
        place_recvs(system, sched, ctx, layout, recvs)

    def send(sched, ctx, layout, hs):
        sched.flush()
        n0 = sched.out.n
        items = [(h.name_src, system.link_between(c, h.dst)[0], h.line, h.planes) for h in hs]
        place_sends(system, sched, ctx, layout, items)
        cycles = _placed_sends(sched, n0, m)
        for h in hs:
            link = system.link_between(c, h.dst)[0]
            mine, cycles[link] = cycles[link][:len(h.planes)], cycles[link][len(h.planes):]
            sent.setdefault(link, []).extend(mine)
            board.put((h.dst, c, h.order), [t + system.hop_between(c, h.dst) for t in mine])

    layout = persistent_layout(g, m) if early or own_in else None

    def before(sched, reg):
        ctx = Ctx(m, None, reg)
        for x in early:
            relay(sched, ctx, layout, x)
        receive(sched, ctx, layout, own_in)

    def after(sched, reg, low):
        syms = {y.name: y for y in low.symbols}
        send(sched, low.ctx, syms, own_out)
        for x in late:
            relay(sched, low.ctx, syms, x)

    prog = compile_graph(g, m, stats, before=before if layout is not None else None,
                         after=after if own_out or late else None)
    if layout is not None:
        moved = [y.name for y in prog.symbols if y.name in layout and y != layout[y.name]]
        if moved:
            raise AssertionError(f"chip {c}: the layout of {moved[0]} changed between two compilations")
    for link, cycles in sent.items():
        assert send_cycles(prog, link) == cycles, f"chip {c}: link {link}'s SENDs moved in code generation"
    prog = replace(prog, symbols=[replace(y, kind="link") if y.name.startswith(P.LINK_PREFIX) and y.kind == "input"
                                  else y for y in prog.symbols])
    prog.params = dict(g.params)
    return prog


def _placed_sends(sched, n0: int, m) -> dict:
    """link -> the cycles of the SENDs placed since the scheduler had placed n0 instructions."""
    sched.flush()
    cyc, queue, op = [], [], []
    seen = 0
    for part in sched.out.parts:
        n = len(part[0])
        if seen + n > n0:
            a = max(0, n0 - seen)
            cyc.append(part[0][a:])
            queue.append(part[1][a:])
            op.append(part[2][a:])
        seen += n
    if not cyc:
        return {}
    cyc, queue, op = np.concatenate(cyc), np.concatenate(queue), np.concatenate(op)
    out = {}
    for link in range(m.c2c_links):
        sel = (op == O.SEND) & (queue == m.c2c_queue(link))
        if sel.any():
            out[link] = [int(t) for t in cyc[sel]]
    return out
