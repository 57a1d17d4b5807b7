"""The jitted validation pass over instruction columns (isa/checks.py keeps the rules and the
messages; this takes arrays and returns the first bad index): a program of 14M instructions is
checked in well under a second instead of a numpy pass per field."""
from __future__ import annotations

from numba import njit

I32_LO, I32_HI = -2**31, 2**31 - 1


@njit(cache=True)
def first_invalid(queue, op, args, line, node, nq, q_unit, q_role, op_unit, op_role, kinds, dwidth, streams,
                  node_top, unit_icu, check_line, check_node):
    """Index of the first invalid instruction (-1 if none), by the rules of
    checks.check_instructions: an unknown opcode or queue anywhere comes first, then any
    other broken rule."""
    n = op.shape[0]
    nops = op_unit.shape[0]
    ndt = dwidth.shape[0]
    for i in range(n):
        if op[i] < 0 or op[i] >= nops or queue[i] < 0 or queue[i] >= nq:
            return i
    for i in range(n):
        o, q = op[i], queue[i]
        u = op_unit[o]
        if u != unit_icu:
            if u != q_unit[q]:
                return i
            if op_role[o] >= 0 and op_role[o] != q_role[q]:
                return i
        for j in range(args.shape[1]):
            k, v = kinds[o, j], args[i, j]
            if k == 0:
                if v != 0:
                    return i
            elif k == 1 or k == 4:
                if v < I32_LO or v > I32_HI:
                    return i
            elif k == 3:
                if v < 0 or v >= ndt:
                    return i
            elif k == 2:
                if v < 0 or v // 256 >= ndt or (v // 64) % 4 > 1 or v % 64 + dwidth[v // 256] > streams:
                    return i
        if check_line and (line[i] < 0 or line[i] > I32_HI):
            return i
        if check_node and (node[i] < -1 or node[i] > node_top):
            return i
    return -1
