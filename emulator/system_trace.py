"""The trace of a system's run: one Perfetto/Chrome process per chip (each as emulator/trace.py
draws one chip), and every vector on a link as a flow event from its SEND to its RECV."""
from __future__ import annotations

import numpy as np

from lpu.emulator import trace as T
from lpu.isa import opcodes as O


def _c2c(r: T.Records) -> dict:
    """{(link, op): [(cycle, track)] in cycle order} of one chip's SENDs and RECVs."""
    out = {}
    sel = np.flatnonzero((r.op == O.SEND) | (r.op == O.RECV))
    m = r.program.machine
    for i in sel:
        link = m.queues[int(r.queue[i])][2]
        out.setdefault((link, int(r.op[i])), []).append((int(r.cycle[i]), int(r.track[i])))
    return out


def system_trace(sp, result, window=None, max_events: int = T.MAX_EVENTS) -> tuple[dict, list]:
    """(trace document, notes): chips as processes 1..N, links as flows (within the window)."""
    system, m = sp.system, sp.system.machine
    us = 1.0 / m.clock_mhz
    events, notes, recs = [], [], []
    per_chip = max(1, max_events // len(sp.chips))
    for c, (prog, res) in enumerate(zip(sp.chips, result.chips)):
        r = T.records(prog, res.trace, res.cycles)
        recs.append(r)
        doc, chip_notes = T.chrome_trace(r, window, per_chip)
        notes += [f"chip {c}: {n}" for n in chip_notes]
        for e in doc["traceEvents"]:
            e["pid"] = c + 1
            if e.get("name") == "process_name":
                e["args"]["name"] = f"chip {c}: " + e["args"]["name"]
        events += doc["traceEvents"]
    lo, hi = window or (0, result.cycles)
    ops = [_c2c(r) for r in recs]
    flow = 0
    for a, chip_ops in enumerate(ops):
        for (link, op), sends in sorted(chip_ops.items()):
            peer = system.peer(a, link)
            if op != O.SEND or peer < 0:
                continue
            back = system.link_between(a, peer)[1]
            for (sc, st), (rc, rt) in zip(sends, ops[peer].get((back, O.RECV), [])):
                if sc >= hi or rc < lo:
                    continue
                flow += 1
                name = f"link {a}->{peer}"
                events.append({"ph": "s", "id": flow, "pid": a + 1, "tid": st, "ts": sc * us, "name": name,
                               "cat": "c2c"})
                events.append({"ph": "f", "bp": "e", "id": flow, "pid": peer + 1, "tid": rt, "ts": rc * us,
                               "name": name, "cat": "c2c"})
    doc = {"traceEvents": events, "displayTimeUnit": "ns",
           "otherData": {"program": sp.chips[0].source_name, "machine": m.name, "chips": len(sp.chips),
                         "clock_mhz": m.clock_mhz, "cycles": result.cycles, "window": [lo, hi], "flows": flow}}
    return doc, notes
