"""Jitted loops of the `.lpubin` instruction section and its validation (isa/encoding.py keeps
the format and the messages; these take and return arrays). A program of 14M instructions is
checked, written and read in well under a second instead of a Python or numpy pass per field.

Record layout per instruction (from the opcode table): queue u16, opcode u8, each field of the
opcode at `foff[op, j]` with `fsize[op, j]` bytes (0: unused; `fsigned` for i32 fields), then
line u32 and node i32 at the end of the record (`rsize[op]` bytes in all)."""
from __future__ import annotations

import numpy as np
from numba import njit

I32_LO, I32_HI = -2**31, 2**31 - 1


@njit(cache=True)
def first_invalid(queue, op, args, line, node, nq, q_unit, q_role, op_unit, op_role, kinds, dwidth, streams,
                  node_top, unit_icu, check_line, check_node):
    """Index of the first invalid instruction (-1 if none), by the rules of
    encoding.check_instructions: an unknown opcode or queue anywhere comes first, then any
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


@njit(cache=True)
def _put(buf, at, v, size):
    for b in range(size):
        buf[at + b] = (v >> (8 * b)) & 0xFF


@njit(cache=True)
def encode_records(queue, op, args, line, node, rsize, foff, fsize):
    n = op.shape[0]
    total = 0
    for i in range(n):
        total += rsize[op[i]]
    buf = np.zeros(total, np.uint8)
    at = 0
    for i in range(n):
        o = op[i]
        _put(buf, at, queue[i], 2)
        buf[at + 2] = o
        for j in range(args.shape[1]):
            if fsize[o, j]:
                _put(buf, at + foff[o, j], args[i, j], fsize[o, j])
        end = at + rsize[o]
        _put(buf, end - 8, line[i], 4)
        _put(buf, end - 4, node[i], 4)
        at = end
    return buf


@njit(cache=True)
def _get(buf, at, size, signed):
    v = np.int64(0)
    for b in range(size):
        v |= np.int64(buf[at + b]) << (8 * b)
    if signed and v >= (np.int64(1) << (8 * size - 1)):
        v -= np.int64(1) << (8 * size)
    return v


@njit(cache=True)
def decode_records(buf, n, rsize, foff, fsize, fsigned, nargs):
    """(status, at, queue, op, args, line, node, end): status 0 ok, 1 an unknown opcode in
    record `at`, 2 record `at` runs past the buffer."""
    queue = np.zeros(n, np.int64)
    op = np.zeros(n, np.int64)
    args = np.zeros((n, nargs), np.int64)
    line = np.zeros(n, np.int64)
    node = np.zeros(n, np.int64)
    nops = rsize.shape[0]
    at, size = 0, buf.shape[0]
    for i in range(n):
        if at + 3 > size:
            return 2, i, queue, op, args, line, node, at
        o = np.int64(buf[at + 2])
        if o >= nops:
            return 1, i, queue, op, args, line, node, at
        end = at + rsize[o]
        if end > size:      # named as the reader that walks record by record would: the next one
            return 2, min(i + 1, n - 1), queue, op, args, line, node, at
        op[i] = o
        queue[i] = _get(buf, at, 2, False)
        for j in range(nargs):
            if fsize[o, j]:
                args[i, j] = _get(buf, at + foff[o, j], fsize[o, j], fsigned[o, j])
        line[i] = _get(buf, end - 8, 4, False)
        node[i] = _get(buf, end - 4, 4, True)
        at = end
    return 0, n, queue, op, args, line, node, at
