"""The array work of replaying a node's chains (replay.py), jitted: arrays in, arrays out.

`shift_slots` moves the SRAM slots of the inputs that moved (and the address of the READ or
WRITE that touches each); `renamed` gives each chain's node its name in the new trip.
"""
from __future__ import annotations

import numpy as np
from numba import njit

@njit(cache=True)
def shift_table(grids, widths, deltas, starts):
    """(lo, table): table[s - lo] = the shift of slot s (0: none), from the moved inputs' grids
    (grids: their vector slots, one after another; input k's are grids[starts[k]:starts[k+1]],
    each the first of widths[k] slots, shifted by deltas[k]); lo = -1 where a slot would move
    by two amounts."""
    n = len(widths)
    lo, hi = 1 << 62, -(1 << 62)
    for k in range(n):
        for j in range(starts[k], starts[k + 1]):
            lo = min(lo, grids[j])
            hi = max(hi, grids[j] + widths[k] - 1)
    if lo > hi:
        return 0, np.zeros(0, np.int64)
    table = np.zeros(hi - lo + 1, np.int64)
    for k in range(n):
        for j in range(starts[k], starts[k + 1]):
            for x in range(widths[k]):
                s = grids[j] + x - lo
                if table[s] != 0 and table[s] != deltas[k]:
                    return -1, table
                table[s] = deltas[k]
    return lo, table


@njit(cache=True)
def _moved(i, ptr, data, out, lo, table, op, read, write):
    """Slots of instruction i in data[ptr[i]:ptr[i+1]] moved into out; returns (ok, the shift
    of its moved slot or 0), not ok where it may not move (not a READ or WRITE of one slot)."""
    shift = 0
    for j in range(ptr[i], ptr[i + 1]):
        s = data[j] - lo
        if s < 0 or s >= len(table) or table[s] == 0:
            continue
        if (op[i] != read and op[i] != write) or ptr[i + 1] - ptr[i] != 1:
            return False, 0
        out[j] = data[j] + table[s]
        shift = table[s]
    return True, shift


@njit(cache=True)
def shift_slots(lo, table, r_ptr, r_data, w_ptr, w_data, op, args, period, addr_arg, read, write):
    """(ok, r_data, w_data, args): the slots read and written moved by the table (the shifts of
    slots lo ..), and each moved slot's READ or WRITE addressed shift / period further; ok is
    False where an instruction that is not a READ or WRITE of one slot touches a moved slot
    (the arrays are then not meaningful)."""
    r_new, w_new = r_data.copy(), w_data.copy()
    args_new = args.copy()
    for i in range(len(op)):
        for k in range(2):
            ok, d = _moved(i, r_ptr, r_data, r_new, lo, table, op, read, write) if k == 0 else \
                _moved(i, w_ptr, w_data, w_new, lo, table, op, read, write)
            if not ok:
                return False, r_new, w_new, args_new
            args_new[i, addr_arg] += d // period
    return True, r_new, w_new, args_new


@njit(cache=True)
def distinct(nodes):
    """The distinct values of nodes, in order of first appearance (they are few)."""
    seen = np.empty(0, np.int64)
    for x in nodes:
        found = False
        for y in seen:
            if y == x:
                found = True
                break
        if not found:
            seen = np.append(seen, x)
    return seen


@njit(cache=True)
def renamed(nodes, old, new):
    """nodes with each value old[k] replaced by new[k] (old: the distinct values, few)."""
    out = np.empty(len(nodes), np.int64)
    for i in range(len(nodes)):
        x = nodes[i]
        for k in range(len(old)):
            if old[k] == x:
                out[i] = new[k]
                break
    return out
