"""Pass `codegen`: placed instructions to per-queue instruction streams.

Each queue's instructions are sorted by cycle; gaps become `NOP n`; every used queue starts
with SYNC and the ICU queue with NOTIFY (all queues start in cycle 0).
"""
from __future__ import annotations

import numpy as np

from isa import opcodes as O
from isa.opcodes import NARGS
from isa.program import Program


def codegen(machine, placed, symbols, tables, nodes, predicted, source_name="", source_lines=()):
    n = len(placed.cycle)
    cyc = np.asarray(placed.cycle, np.int64)
    q = np.asarray(placed.queue, np.int64)
    order = np.lexsort((cyc, q))
    args = np.zeros((max(n, 1), NARGS), np.int32)
    for i, a in enumerate(placed.args):
        args[i, :len(a)] = a
    ops = np.asarray(placed.op, np.int32)
    lines = np.asarray(placed.line, np.int32)
    node = np.asarray(placed.node, np.int32)
    out_q, out_op, out_args, out_line, out_node = [], [], [], [], []

    def emit(qq, op, a=(), line=0, nd=-1):
        out_q.append(qq)
        out_op.append(op)
        row = np.zeros(NARGS, np.int32)
        row[:len(a)] = a
        out_args.append(row)
        out_line.append(line)
        out_node.append(nd)

    emit(0, O.NOTIFY)
    cur_q, cursor = -1, 0
    for i in order:
        qq = int(q[i])
        if qq != cur_q:
            cur_q, cursor = qq, 0
            emit(qq, O.SYNC)
        t = int(cyc[i])
        if t < cursor:
            raise AssertionError(f"queue {machine.queues[qq][0]} issues twice in cycle {t}")
        if t > cursor:
            emit(qq, O.NOP, (t - cursor,))
        emit(qq, int(ops[i]), args[i], int(lines[i]), int(node[i]))
        cursor = t + 1
    order2 = np.argsort(np.asarray(out_q, np.int64), kind="stable")
    return Program(
        machine=machine,
        queue=np.asarray(out_q, np.int32)[order2],
        op=np.asarray(out_op, np.int32)[order2],
        args=np.asarray(out_args, np.int32).reshape(-1, NARGS)[order2],
        line=np.asarray(out_line, np.int32)[order2],
        node=np.asarray(out_node, np.int32)[order2],
        symbols=symbols, tables=tables, nodes=list(nodes), predicted_cycles=predicted,
        source_name=source_name, source_lines=list(source_lines))
