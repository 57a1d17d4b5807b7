"""Finding REPEAT runs in a queue's instruction stream (jitted; arrays in, arrays out).

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
    """q and cyc sorted by (queue, cycle); op, args, line, node in placement order, read
    through order (row i of the sorted stream is instruction order[i]). Returns (count, dist)
    in sorted order: count[i] = copies that follow row i in its REPEAT (0: none), -1 where row i
    is such a copy."""
    n = len(q)
    count = np.zeros(n, np.int64)
    dist = np.zeros(n, np.int64)
    i = 0
    while i < n:
        a = order[i]
        f = field[op[a]]
        c, d = 0, 0
        j = i + 1
        while f >= 0 and j < n and q[j] == q[i]:
            b = order[j]
            if op[b] != op[a] or line[b] != line[a] or node[b] != node[a]:
                break
            dd = cyc[j] - cyc[j - 1]
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
