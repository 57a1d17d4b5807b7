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
    """All columns sorted by queue, then cycle (`scatter_by_queue`, `sort_segments`). Returns (count, dist):
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
def scatter_by_queue(pos, q, cyc, op, args, line, node, oq, ocyc, oop, oargs, oline, onode):
    """One batch of placed instructions appended to its queues' segments of the out columns
    (pos[q]: the next free row of queue q's segment). Reads are sequential and each queue's
    writes too, unlike a gather through a sorted order."""
    nargs = args.shape[1]
    for i in range(len(q)):
        qi = q[i]
        d = pos[qi]
        pos[qi] = d + 1
        oq[d], ocyc[d], oop[d], oline[d], onode[d] = qi, cyc[i], op[i], line[i], node[i]
        for k in range(nargs):
            oargs[d, k] = args[i, k]


@njit(cache=True)
def _cycle_order(c):
    """The stable sorting order of the cycles c: a radix sort, 11 bits a pass."""
    n = len(c)
    lo, hi = c[0], c[0]
    for i in range(n):
        lo = min(lo, c[i])
        hi = max(hi, c[i])
    perm = np.arange(n)
    tmp = np.empty(n, np.int64)
    count = np.empty(2049, np.int64)
    shift = 0
    while True:
        count[:] = 0
        for i in range(n):
            count[((c[i] - lo) >> shift & 2047) + 1] += 1
        for k in range(2048):
            count[k + 1] += count[k]
        for i in range(n):
            j = perm[i]
            k = (c[j] - lo) >> shift & 2047
            tmp[count[k]] = j
            count[k] += 1
        perm, tmp = tmp, perm
        shift += 11
        if (hi - lo) >> shift == 0:
            return perm


@njit(cache=True)
def sort_segments(start, cyc, op, args, line, node):
    """Each queue's segment [start[q], start[q+1]) sorted by cycle in place (chain order is
    nearly cycle order already: most segments need no sort). Returns the first row whose
    queue issues twice in its cycle (-1 if none)."""
    for s in range(len(start) - 1):
        a, b = start[s], start[s + 1]
        ordered = True
        for j in range(a + 1, b):
            if cyc[j] < cyc[j - 1]:
                ordered = False
                break
        if not ordered:
            perm = _cycle_order(cyc[a:b]) + a
            cyc[a:b] = cyc[perm]
            op[a:b] = op[perm]
            line[a:b] = line[perm]
            node[a:b] = node[perm]
            args[a:b] = args[perm]
        for j in range(a + 1, b):
            if cyc[j] == cyc[j - 1]:
                return j
    return -1


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
