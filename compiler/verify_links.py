"""The independent checker for a system of chips: every chip's program by compiler/verify.py,
and the links between them, from the binaries alone (the SEND and RECV of every chip, their
issue cycles re-derived from the instruction streams, the topology from the system config):

  link-none       a SEND or RECV on a link that leads to no chip of the system
  link-busy       two SENDs on one link less than a slot (slot_cycles) apart
  link-early      the k-th RECV on a link before the k-th vector sent to it arrives
                  (its SEND + the link's latency)
  link-unmatched  a link's far end receives fewer or more vectors than are sent on it

Violations name the chip in their queue (`chip 1 c2c0`)."""
from __future__ import annotations

import numpy as np

from lpu.compiler.verify import Violation, _Expanded, verify
from lpu.isa import opcodes as O


def _c2c(prog):
    """{(link, op): [(cycle, src)] in cycle order} of a chip's SENDs and RECVs."""
    e = _Expanded(prog)
    sel = np.flatnonzero((e.op == O.SEND) | (e.op == O.RECV))
    out = {}
    for i in sel:
        out.setdefault((int(e.unit[i]), int(e.op[i])), []).append((int(e.cycle[i]), int(e.src[i])))
    return out


def _violation(prog, chip, kind, cycle, src, message) -> Violation:
    q = prog.machine.queues[int(prog.queue[src])][0]
    line = int(prog.line[src])
    return Violation(kind, cycle, f"chip {chip} {q}", src, O.OPS[int(prog.op[src])].name, line, message,
                     prog.source_line(line))


def verify_links(system, chips: list, limit: int = 1000) -> list[Violation]:
    out = []
    ops = [_c2c(p) for p in chips]
    for a, prog in enumerate(chips):
        for (link, op), items in sorted(ops[a].items()):
            peer = system.peer(a, link)
            if peer < 0:
                cyc, src = items[0]
                out.append(_violation(prog, a, "link-none", cyc, src, f"link {link} of chip {a} leads to no chip of "
                                      f"this {system.chips}-chip system"))
                continue
            if op != O.SEND:
                continue
            for (c0, _), (c1, s1) in zip(items, items[1:]):
                if c1 - c0 < system.slot_cycles:
                    out.append(_violation(prog, a, "link-busy", c1, s1, f"SEND {c1 - c0} cycles after the previous "
                                          f"on link {link}; a vector takes {system.slot_cycles}"))
            back = system.link_between(a, peer)[1]
            recvs = ops[peer].get((back, O.RECV), [])
            hop = system.hop_between(a, peer)
            for (sc, _), (rc, rs) in zip(items, recvs):
                if rc < sc + hop:
                    out.append(_violation(chips[peer], peer, "link-early", rc, rs, f"RECV of a vector that chip {a} "
                                          f"sends at cycle {sc} and that arrives at cycle {sc + hop}"))
            if len(recvs) != len(items):
                cyc, src = items[0]
                out.append(_violation(prog, a, "link-unmatched", cyc, src, f"{len(items)} vectors sent on link {link} "
                                      f"to chip {peer}, which receives {len(recvs)} on its link {back}"))
        for (link, op), items in sorted(ops[a].items()):     # receives on links nobody sends on
            peer = system.peer(a, link)
            if op == O.RECV and peer >= 0 and (system.link_between(a, peer)[1], O.SEND) not in ops[peer]:
                cyc, src = items[0]
                out.append(_violation(prog, a, "link-unmatched", cyc, src, f"{len(items)} RECVs on link {link}, and "
                                      f"chip {peer} sends nothing on it"))
    for c, prog in enumerate(chips):
        for v in verify(prog, limit):
            v.queue = f"chip {c} {v.queue}"
            out.append(v)
    return out[:limit]
