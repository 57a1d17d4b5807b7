"""Per-queue instruction streams from placed instructions (jitted; arrays in, arrays out):
sorting by (queue, cycle), finding REPEAT runs, and writing the rows of the streams.

A run is an instruction followed on its queue by copies at a constant cycle distance d, each
with the same opcode, DSL line, IR node and args except the op's REPEAT field (address, row,
accumulator or column), which goes up by one per copy. Such a run is emitted as the
instruction plus `REPEAT n d` (see isa/opcodes.py; the emulator and the checker expand it).
"""
from __future__ import annotations

import numpy as np
from numba import njit


@njit(cache=True)
def find_runs(order, q, cyc, op, args, line, node, field):
    """All columns in placement order, read through `order` (sorted by queue, then cycle: row
    i of the sorted stream is instruction order[i]). Returns (count, dist) in sorted order:
    count[i] = copies that follow row i in its REPEAT (0: none), -1 where row i is such a copy."""
    n = len(order)
    count = np.zeros(n, np.int32)
    dist = np.zeros(n, np.int32)
    i = 0
    while i < n:
        a = order[i]
        f = field[op[a]]
        c, d = 0, 0
        j = i + 1
        while f >= 0 and j < n and q[order[j]] == q[a]:
            b = order[j]
            if op[b] != op[a] or line[b] != line[a] or node[b] != node[a]:
                break
            dd = cyc[b] - cyc[order[j - 1]]
            if c > 0 and dd != d:
                break
            same = args[b, f] == args[a, f] + c + 1
            for k in range(args.shape[1]):
                if k != f and args[b, k] != args[a, k]:
                    same = False
            if not same:
                break
            d = dd
            c += 1
            j += 1
        if c >= 2 or (c == 1 and d > 1):      # shorter than the instructions (and NOPs) it replaces
            count[i], dist[i] = c, d
            for k in range(i + 1, i + c + 1):
                count[k] = -1
            i += c + 1
        else:
            i += 1
    return count, dist


@njit(cache=True)
def queue_order(q, cyc, nq):
    """Instruction indices sorted by (queue, cycle), and the first cycle at which two
    instructions of one queue meet (-1 if none) with the index of the second."""
    n = len(q)
    start = np.zeros(nq + 1, np.int64)
    for i in range(n):
        start[q[i] + 1] += 1
    for k in range(nq):
        start[k + 1] += start[k]
    pos = start[:-1].copy()
    order = np.empty(n, np.int64)
    for i in range(n):
        order[pos[q[i]]] = i
        pos[q[i]] += 1
    for k in range(nq):
        a, b = start[k], start[k + 1]
        if b - a > 1:
            seg = order[a:b].copy()
            order[a:b] = seg[np.argsort(cyc[seg])]
            for i in range(a + 1, b):
                if cyc[order[i]] == cyc[order[i - 1]]:
                    return order, i
    return order, -1


@njit(cache=True)
def stream_rows(order, q, cyc, op, args, line, node, count, dist, notify, nop, sync, repeat):
    """The rows of every queue's stream: [SYNC] at the start of each used queue, [NOP gap]
    before an instruction that does not follow its predecessor's end, the instruction, and
    [REPEAT n d] after the first of a run (count > 0); row 0 is the ICU's NOTIFY."""
    n = len(order)
    rows = 1
    prev_q, end = -1, 0
    for i in range(n):
        if count[i] < 0:
            continue
        a = order[i]
        if q[a] != prev_q:
            rows += 1
            prev_q, end = q[a], 0
        if cyc[a] > end:
            rows += 1
        rows += 1 + (count[i] > 0)
        end = cyc[a] + count[i] * dist[i] + 1
    nargs = args.shape[1]
    out_q = np.zeros(rows, np.int32)
    out_op = np.zeros(rows, np.int32)
    out_args = np.zeros((rows, nargs), np.int32)
    out_line = np.zeros(rows, np.int32)
    out_node = np.full(rows, -1, np.int32)
    out_op[0] = notify
    r = 1
    prev_q, end = -1, 0
    for i in range(n):
        if count[i] < 0:
            continue
        a = order[i]
        qa = q[a]
        if qa != prev_q:
            out_q[r], out_op[r] = qa, sync
            r += 1
            prev_q, end = qa, 0
        if cyc[a] > end:
            out_q[r], out_op[r], out_args[r, 0] = qa, nop, cyc[a] - end
            r += 1
        out_q[r], out_op[r], out_line[r], out_node[r] = qa, op[a], line[a], node[a]
        for k in range(nargs):
            out_args[r, k] = args[a, k]
        r += 1
        if count[i] > 0:
            out_q[r], out_op[r], out_line[r], out_node[r] = qa, repeat, line[a], node[a]
            out_args[r, 0], out_args[r, 1] = count[i], dist[i]
            r += 1
        end = cyc[a] + count[i] * dist[i] + 1
    return out_q, out_op, out_args, out_line, out_node
