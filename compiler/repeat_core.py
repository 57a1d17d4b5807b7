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
def find_runs(q, cyc, op, args, line, node, field):
    """All columns sorted by queue, then cycle (`sorted_columns`). Returns (count, dist):
    count[i] = copies that follow row i in its REPEAT (0: none), -1 where row i is such a copy."""
    n = len(q)
    count = np.zeros(n, np.int32)
    dist = np.zeros(n, np.int32)
    i = 0
    while i < n:
        f = field[op[i]]
        c, d = 0, 0
        j = i + 1
        while f >= 0 and j < n and q[j] == q[i]:
            if op[j] != op[i] or line[j] != line[i] or node[j] != node[i]:
                break
            dd = cyc[j] - cyc[j - 1]
            if c > 0 and dd != d:
                break
            same = args[j, f] == args[i, f] + c + 1
            for k in range(args.shape[1]):
                if k != f and args[j, k] != args[i, k]:
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
def sorted_columns(order, q, cyc, op, args, line, node):
    """Every column read through `order`, in one pass."""
    n = len(order)
    nargs = args.shape[1]
    q2, c2, o2 = np.empty(n, q.dtype), np.empty(n, cyc.dtype), np.empty(n, op.dtype)
    a2, l2, n2 = np.empty((n, nargs), args.dtype), np.empty(n, line.dtype), np.empty(n, node.dtype)
    for i in range(n):
        a = order[i]
        q2[i], c2[i], o2[i], l2[i], n2[i] = q[a], cyc[a], op[a], line[a], node[a]
        for k in range(nargs):
            a2[i, k] = args[a, k]
    return q2, c2, o2, a2, l2, n2


@njit(cache=True)
def queue_order(q, cyc, nq):
    """Instruction indices sorted by (queue, cycle), and the first position in that order at
    which two instructions of one queue meet in one cycle (-1 if none). Two counting sorts
    (cycles are bounded by the schedule's length): by cycle, then stably by queue."""
    n = len(q)
    order = np.empty(n, np.int64)
    if n == 0:
        return order, -1
    lo, hi = cyc[0], cyc[0]
    for i in range(n):
        lo = min(lo, cyc[i])
        hi = max(hi, cyc[i])
    count = np.zeros(hi - lo + 2, np.int64)
    for i in range(n):
        count[cyc[i] - lo + 1] += 1
    for k in range(hi - lo + 1):
        count[k + 1] += count[k]
    by_cycle = np.empty(n, np.int64)
    for i in range(n):
        k = cyc[i] - lo
        by_cycle[count[k]] = i
        count[k] += 1
    start = np.zeros(nq + 1, np.int64)
    for i in range(n):
        start[q[i] + 1] += 1
    for k in range(nq):
        start[k + 1] += start[k]
    for j in range(n):
        i = by_cycle[j]
        order[start[q[i]]] = i
        start[q[i]] += 1
    for j in range(1, n):
        a, b = order[j - 1], order[j]
        if q[a] == q[b] and cyc[a] == cyc[b]:
            return order, j
    return order, -1


@njit(cache=True)
def stream_rows(q, cyc, op, args, line, node, count, dist, notify, nop, sync, repeat):
    """The rows of every queue's stream: [SYNC] at the start of each used queue, [NOP gap]
    before an instruction that does not follow its predecessor's end, the instruction, and
    [REPEAT n d] after the first of a run (count > 0); row 0 is the ICU's NOTIFY. Columns
    sorted by queue, then cycle."""
    n = len(q)
    rows = 1
    prev_q, end = -1, 0
    for i in range(n):
        if count[i] < 0:
            continue
        a = i
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
        a = i
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
