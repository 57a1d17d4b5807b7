"""Pass `codegen`: placed instructions to per-queue instruction streams.

Each queue's instructions are sorted by cycle; a run of copies at a constant distance whose
address (row, accumulator, column) goes up by one becomes the first plus `REPEAT n d`; a gap
becomes `NOP n`; every used queue starts with SYNC and the ICU queue with NOTIFY (all queues
start in cycle 0).
"""
from __future__ import annotations

import numpy as np

from lpu.compiler.repeat_core import find_runs
from lpu.isa import opcodes as O
from lpu.isa.opcodes import NARGS

REPEAT_FIELD = np.array(O.REPEAT_FIELD, np.int64)
from lpu.isa.program import Program


def codegen(machine, placed, symbols, tables, nodes, predicted, source_name="", source_lines=(), repeat=True):
    """placed: schedule.Placed (emptied here: each of its arrays is freed once copied out).
    repeat: emit regular runs as one instruction plus REPEAT (repeat_core.find_runs)."""
    cyc, q, ops, args, lines, node = placed.take()
    n = len(cyc)
    order = np.lexsort((cyc, q))             # the columns are read through `order`, not copied
    cyc, q = cyc[order], q[order]
    first = np.ones(n, bool)
    first[1:] = q[1:] != q[:-1]
    if np.any(~first[1:] & (cyc[1:] <= cyc[:-1])):
        i = int(np.nonzero(~first[1:] & (cyc[1:] <= cyc[:-1]))[0][0]) + 1
        raise AssertionError(f"queue {machine.queues[int(q[i])][0]} issues twice in cycle {int(cyc[i])}")
    if repeat and n:
        count, dist = find_runs(order, q, cyc, ops, args, lines, node, REPEAT_FIELD)
    else:
        count, dist = np.zeros(n, np.int64), np.zeros(n, np.int64)
    keep = count >= 0
    sel = order[keep]                          # kept instructions, in (queue, cycle) order
    del order
    cyc, q, count, dist, first = cyc[keep], q[keep], count[keep], dist[keep], first[keep]
    del keep
    n = len(cyc)
    prev_end = np.zeros(n, np.int64)          # the queue's next free cycle before instruction i
    prev_end[1:] = (cyc + count * dist)[:-1] + 1
    prev_end[first] = 0
    gap = cyc - prev_end
    # rows out: [SYNC]? [NOP gap]? instruction [REPEAT n d]?, per kept instruction
    n_sync, n_nop, n_rep = first.astype(np.int64), (gap > 0).astype(np.int64), (count > 0).astype(np.int64)
    per = n_sync + n_nop + 1 + n_rep
    end = np.cumsum(per)
    total = 1 + int(end[-1]) if n else 1
    out_q = np.zeros(total, np.int32)
    out_op = np.zeros(total, np.int32)
    out_args = np.zeros((total, NARGS), np.int32)
    out_line = np.zeros(total, np.int32)
    out_node = np.full(total, -1, np.int32)
    out_op[0] = O.NOTIFY                       # queue 0 (ICU): NOTIFY
    if n:
        at = end - n_rep                       # row of each instruction (row 0 is the NOTIFY)
        out_q[at] = q
        out_op[at] = ops[sel]
        del ops
        out_args[at] = args[sel]
        del args
        out_line[at] = lines[sel]
        out_node[at] = node[sel]
        nop_at = at[gap > 0] - 1
        out_q[nop_at], out_op[nop_at] = q[gap > 0], O.NOP
        out_args[nop_at, 0] = gap[gap > 0]
        sync_at = at[first] - 1 - n_nop[first]
        out_q[sync_at], out_op[sync_at] = q[first], O.SYNC
        r = count > 0
        rep_at = at[r] + 1
        out_q[rep_at], out_op[rep_at] = q[r], O.REPEAT
        out_args[rep_at, 0], out_args[rep_at, 1] = count[r], dist[r]
        out_line[rep_at], out_node[rep_at] = out_line[at[r]], out_node[at[r]]
    return Program(machine=machine, queue=out_q, op=out_op, args=out_args, line=out_line, node=out_node,
                   symbols=symbols, tables=tables, nodes=list(nodes), predicted_cycles=predicted,
                   source_name=source_name, source_lines=list(source_lines))
