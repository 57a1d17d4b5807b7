"""Pass `codegen`: placed instructions to per-queue instruction streams.

Each queue's instructions are sorted by cycle; a gap becomes `NOP n`; every used queue starts
with SYNC and the ICU queue with NOTIFY (all queues start in cycle 0).
"""
from __future__ import annotations

import numpy as np

from lpu.isa import opcodes as O
from lpu.isa.opcodes import NARGS
from lpu.isa.program import Program


def codegen(machine, placed, symbols, tables, nodes, predicted, source_name="", source_lines=()):
    """placed: (cycle, queue, op, args, line, node) arrays, one row per placed instruction."""
    cyc, q, ops, args, lines, node = placed
    n = len(cyc)
    order = np.lexsort((cyc, q))
    cyc, q = cyc[order], q[order]
    args, ops, lines, node = args[order], ops[order], lines[order], node[order]
    first = np.ones(n, bool)
    first[1:] = q[1:] != q[:-1]
    prev_end = np.zeros(n, np.int64)          # the queue's next free cycle before instruction i
    prev_end[1:] = cyc[:-1] + 1
    prev_end[first] = 0
    gap = cyc - prev_end
    if np.any(gap < 0):
        i = int(np.nonzero(gap < 0)[0][0])
        raise AssertionError(f"queue {machine.queues[int(q[i])][0]} issues twice in cycle {int(cyc[i])}")
    # rows out: [SYNC]? [NOP gap]? instruction, per placed instruction
    n_sync, n_nop = first.astype(np.int64), (gap > 0).astype(np.int64)
    per = n_sync + n_nop + 1
    end = np.cumsum(per)
    total = 1 + int(end[-1]) if n else 1
    out_q = np.zeros(total, np.int32)
    out_op = np.zeros(total, np.int32)
    out_args = np.zeros((total, NARGS), np.int32)
    out_line = np.zeros(total, np.int32)
    out_node = np.full(total, -1, np.int32)
    out_op[0] = O.NOTIFY                       # queue 0 (ICU): NOTIFY
    if n:
        at = 1 + end - 1                       # row of each instruction
        out_q[at], out_op[at], out_args[at] = q, ops, args
        out_line[at], out_node[at] = lines, node
        nop_at = at[gap > 0] - 1
        out_q[nop_at], out_op[nop_at] = q[gap > 0], O.NOP
        out_args[nop_at, 0] = gap[gap > 0]
        sync_at = at[first] - 1 - n_nop[first]
        out_q[sync_at], out_op[sync_at] = q[first], O.SYNC
    return Program(machine=machine, queue=out_q, op=out_op, args=out_args, line=out_line, node=out_node,
                   symbols=symbols, tables=tables, nodes=list(nodes), predicted_cycles=predicted,
                   source_name=source_name, source_lines=list(source_lines))
