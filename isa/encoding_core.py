"""Jitted loops of the `.lpubin` instruction columns (isa/encoding.py keeps the format): the
order grouping instructions by (queue, opcode), and one column read through that order as
values or deltas, with its range, in one pass instead of numpy's gather, diff and min/max."""
from __future__ import annotations

import numpy as np
from numba import njit


@njit(cache=True)
def grouped_order(queue, op, nops):
    """Indices sorted by queue * nops + op, stable (a counting sort); all keys must be in
    [0, nkeys) for nkeys = (max queue + 1) * nops."""
    n = queue.shape[0]
    nkeys = 1
    for i in range(n):
        k = queue[i] * nops + op[i] + 1
        if k > nkeys:
            nkeys = k
    start = np.zeros(nkeys + 1, np.int64)
    for i in range(n):
        start[queue[i] * nops + op[i] + 1] += 1
    for k in range(nkeys):
        start[k + 1] += start[k]
    order = np.empty(n, np.int64)
    for i in range(n):
        k = queue[i] * nops + op[i]
        order[start[k]] = i
        start[k] += 1
    return order


@njit(cache=True)
def column(src, order, delta):
    """(src[order] as values, or as each minus the one before it; its min; its max)."""
    n = order.shape[0]
    out = np.empty(n, np.int64)
    lo, hi, prev = np.int64(0), np.int64(0), np.int64(0)
    for i in range(n):
        v = np.int64(src[order[i]])
        x = v - prev if delta else v
        prev = v
        out[i] = x
        if i == 0 or x < lo:
            lo = x
        if i == 0 or x > hi:
            hi = x
    return out, lo, hi


@njit(cache=True)
def uncolumn(vals, delta, order, out, j):
    """out[order[i], j] = the i-th value (vals[i], or the running sum of vals if delta); the
    first i whose value is outside 32 bits, or -1."""
    prev = np.int64(0)
    for i in range(vals.shape[0]):
        v = prev + np.int64(vals[i]) if delta else np.int64(vals[i])
        if v < -2**31 or v > 2**31 - 1:
            return i
        out[order[i], j] = v
        prev = v
    return -1
