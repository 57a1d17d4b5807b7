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

CYC, OP, LINE, NODE, ARGS = 0, 1, 2, 3, 4     # an instruction record's columns (int32), then its args


@njit(cache=True)
def find_runs(start, rec, field):
    """rec: instruction records (CYC, OP, LINE, NODE, then the args), queue s's in rows
    [start[s], start[s+1]) sorted by cycle (`scatter_by_queue`, `sort_segments`). Returns
    (count, dist): count[i] = copies that follow row i in its REPEAT (0: none), -1 where row i
    is such a copy."""
    n, w = rec.shape
    count = np.zeros(n, np.int32)
    dist = np.zeros(n, np.int32)
    for s in range(len(start) - 1):
        i, last = start[s], start[s + 1]
        while i < last:
            f = field[rec[i, OP]]
            c, d = 0, 0
            j = i + 1
            while f >= 0 and j < last:
                if rec[j, OP] != rec[i, OP] or rec[j, LINE] != rec[i, LINE] or rec[j, NODE] != rec[i, NODE]:
                    break
                dd = rec[j, CYC] - rec[j - 1, CYC]
                if c > 0 and dd != d:
                    break
                same = rec[j, ARGS + f] == rec[i, ARGS + f] + c + 1
                for k in range(ARGS, w):
                    if k != ARGS + f and rec[j, k] != rec[i, k]:
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
def scatter_by_queue(pos, q, cyc, op, args, line, node, out):
    """One batch of placed instructions (columns) appended as records to its queues' segments
    of `out` (pos[q]: the next free row of queue q's segment). Reads are sequential and each
    queue's writes too (a record is one row), unlike a gather through a sorted order."""
    nargs = args.shape[1]
    for i in range(len(q)):
        d = pos[q[i]]
        pos[q[i]] = d + 1
        out[d, CYC], out[d, OP], out[d, LINE], out[d, NODE] = cyc[i], op[i], line[i], node[i]
        for k in range(nargs):
            out[d, ARGS + k] = args[i, k]


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
def sort_segments(start, rec):
    """Each queue's segment of records [start[q], start[q+1]) sorted by cycle in place.
    Returns the first row whose queue issues twice in its cycle (-1 if none)."""
    for s in range(len(start) - 1):
        a, b = start[s], start[s + 1]
        ordered = True
        for j in range(a + 1, b):
            if rec[j, CYC] < rec[j - 1, CYC]:
                ordered = False
                break
        if not ordered:
            perm = _cycle_order(rec[a:b, CYC].astype(np.int64))
            seg = rec[a:b].copy()
            for j in range(b - a):
                rec[a + j] = seg[perm[j]]
        for j in range(a + 1, b):
            if rec[j, CYC] == rec[j - 1, CYC]:
                return j
    return -1


@njit(cache=True)
def stream_rows(start, rec, count, dist, notify, nop, sync, repeat):
    """The rows of every queue's stream as columns (queue, op, args, line, node): [SYNC] at the
    start of each used queue, [NOP gap] before an instruction that does not follow its
    predecessor's end, the instruction, and [REPEAT n d] after the first of a run (count > 0);
    row 0 is the ICU's NOTIFY."""
    rows = 1
    for s in range(len(start) - 1):
        end = 0
        for i in range(start[s], start[s + 1]):
            if count[i] < 0:
                continue
            rows += (i == start[s]) + (rec[i, CYC] > end) + 1 + (count[i] > 0)
            end = rec[i, CYC] + count[i] * dist[i] + 1
    nargs = rec.shape[1] - ARGS
    out_q = np.zeros(rows, np.int32)
    out_op = np.zeros(rows, np.int32)
    out_args = np.zeros((rows, nargs), np.int32)
    out_line = np.zeros(rows, np.int32)
    out_node = np.full(rows, -1, np.int32)
    out_op[0] = notify
    r = 1
    for s in range(len(start) - 1):
        end = 0
        for i in range(start[s], start[s + 1]):
            if count[i] < 0:
                continue
            if i == start[s]:
                out_q[r], out_op[r] = s, sync
                r += 1
            t = rec[i, CYC]
            if t > end:
                out_q[r], out_op[r], out_args[r, 0] = s, nop, t - end
                r += 1
            out_q[r], out_op[r], out_line[r], out_node[r] = s, rec[i, OP], rec[i, LINE], rec[i, NODE]
            for k in range(nargs):
                out_args[r, k] = rec[i, ARGS + k]
            r += 1
            if count[i] > 0:
                out_q[r], out_op[r], out_line[r], out_node[r] = s, repeat, rec[i, LINE], rec[i, NODE]
                out_args[r, 0], out_args[r, 1] = count[i], dist[i]
                r += 1
            end = t + count[i] * dist[i] + 1
    return out_q, out_op, out_args, out_line, out_node
