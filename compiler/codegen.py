"""Pass `codegen`: placed instructions to per-queue instruction streams.

Each queue's instructions are sorted by cycle; a run of copies at a constant distance whose
address (row, accumulator, column) goes up by one becomes the first plus `REPEAT n d`; a gap
becomes `NOP n`; every used queue starts with SYNC and the ICU queue with NOTIFY (all queues
start in cycle 0). The loops are jitted (repeat_core.py): one sort, one gather, one pass for
the runs, two for the rows.
"""
from __future__ import annotations

import numpy as np

from lpu.compiler.repeat_core import find_runs, queue_order, sorted_columns, stream_rows
from lpu.isa import opcodes as O
from lpu.isa.program import Program

REPEAT_FIELD = np.array(O.REPEAT_FIELD, np.int64)


def codegen(machine, placed, symbols, tables, nodes, predicted, source_name="", source_lines=(), repeat=True):
    """placed: schedule.Placed (emptied here). repeat: emit regular runs as one instruction
    plus REPEAT (repeat_core.find_runs)."""
    cyc, q, ops, args, lines, node = placed.take()
    order, twice = queue_order(q, cyc, len(machine.queues))
    if twice >= 0:
        i = int(order[twice])
        raise AssertionError(f"queue {machine.queues[int(q[i])][0]} issues twice in cycle {int(cyc[i])}")
    q, cyc, ops, args, lines, node = sorted_columns(order, q, cyc, ops, args, lines, node)
    del order
    if repeat and len(q):
        count, dist = find_runs(q, cyc, ops, args, lines, node, REPEAT_FIELD)
    else:
        count, dist = np.zeros(len(q), np.int32), np.zeros(len(q), np.int32)
    cols = stream_rows(q, cyc, ops, args, lines, node, count, dist, O.NOTIFY, O.NOP, O.SYNC, O.REPEAT)
    del count, dist, cyc, q, ops, args, lines, node
    out_q, out_op, out_args, out_line, out_node = cols
    return Program(machine=machine, queue=out_q, op=out_op, args=out_args, line=out_line, node=out_node,
                   symbols=symbols, tables=tables, nodes=list(nodes), predicted_cycles=predicted,
                   source_name=source_name, source_lines=list(source_lines))
