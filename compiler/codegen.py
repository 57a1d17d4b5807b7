"""Pass `codegen`: placed instructions to per-queue instruction streams.

Each queue's instructions are sorted by cycle; a run of copies at a constant distance whose
address (row, accumulator, column) goes up by one becomes the first plus `REPEAT n d`; a gap
becomes `NOP n`; every used queue starts with SYNC and the ICU queue with NOTIFY (all queues
start in cycle 0). The loops are jitted (repeat_core.py) on instruction records (one int32 row
each: cycle, op, line, node, args): each placed batch is appended to its queues' segments
(sequential reads, one sequential write stream per queue), each segment sorted by cycle where
it is not already, one pass for the runs, two for the rows.
"""
from __future__ import annotations

import numpy as np

from lpu.compiler.repeat_core import ARGS, CYC, find_runs, scatter_by_queue, sort_segments, stream_rows
from lpu.isa import opcodes as O
from lpu.isa.program import Program

REPEAT_FIELD = np.array(O.REPEAT_FIELD, np.int64)


def codegen(machine, placed, symbols, tables, nodes, predicted, source_name="", source_lines=(), repeat=True):
    """placed: schedule.Placed (emptied here). repeat: emit regular runs as one instruction
    plus REPEAT (repeat_core.find_runs)."""
    start, rec = by_queue(placed.take_parts(), machine.queues)
    if repeat and len(rec):
        count, dist = find_runs(start, rec, REPEAT_FIELD)
    else:
        count, dist = np.zeros(len(rec), np.int32), np.zeros(len(rec), np.int32)
    cols = stream_rows(start, rec, count, dist, O.NOTIFY, O.NOP, O.SYNC, O.REPEAT)
    del count, dist, rec
    out_q, out_op, out_args, out_line, out_node = cols
    return Program(machine=machine, queue=out_q, op=out_op, args=out_args, line=out_line, node=out_node,
                   symbols=symbols, tables=tables, nodes=list(nodes), predicted_cycles=predicted,
                   source_name=source_name, source_lines=list(source_lines))


def by_queue(parts: list, queues) -> tuple:
    """The placed batches' columns (cycle, queue, op, args, line, node) as (start, rec): queue
    q's instruction records in rows [start[q], start[q+1]) of rec, sorted by cycle; each batch
    is freed once it is copied. A queue that issues twice in one cycle is a scheduler bug."""
    nq = len(queues)
    start = np.zeros(nq + 1, np.int64)
    for p in parts:
        start[1:] += np.bincount(p[1], minlength=nq)
    np.cumsum(start, out=start)
    if any(len(p[0]) and int(p[0].max()) >= 1 << 31 for p in parts):
        raise AssertionError("scheduler: a cycle beyond an instruction record's 31 bits")
    rec = np.empty((int(start[-1]), ARGS + O.NARGS), np.int32)
    pos = start[:-1].copy()
    while parts:
        c, q, o, a, ln, nd = parts.pop(0)
        scatter_by_queue(pos, q, c, o, a, ln, nd, rec)
    twice = sort_segments(start, rec)
    if twice >= 0:
        q = int(np.searchsorted(start, twice, side="right")) - 1
        raise AssertionError(f"queue {queues[q][0]} issues twice in cycle {int(rec[twice, CYC])}")
    return start, rec
