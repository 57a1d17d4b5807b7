"""Jitted copies between tensors' bytes and the compact SRAM image (used by emulator/run.py's
`load` and `_fetch`): one pass over a tensor's bytes instead of numpy's padded, transposed
temporaries.

The rows of a tensor lie scattered over the image (a vector's byte planes in other banks, its
neighbours at other addresses), so each copy asks the cache for the rows of the vector AHEAD
vectors on (borrow.prefetch_row) while it copies this one: without it every row waited for its
lines (bert_base L=1's 15 MB of weights 2.1 ms a run, with it 1.4; gpt2_small_decode L=2's
24 MB 4.5 ms, 2.3; memcpy of as many bytes 0.9 and 1.4 ms).
"""
import numpy as np
from numba import njit

from lpu.emulator.borrow import prefetch_row

AHEAD = 8      # vectors


@njit(cache=True, inline="always")
def _ask(mem, rows, v):
    """Prefetch the rows of vector v (if there is one)."""
    if v < rows.shape[0]:
        for b in range(rows.shape[1]):
            prefetch_row(mem, rows[v, b])


@njit(cache=True)
def store(mem, rows, vals, chunks, width):
    """mem[rows[r * chunks + c, b], l] = byte b of vals[r, c * lanes + l] (0 past the last
    column): vals unsigned integers [rows, cols] of `width` bytes, the tensor's little-endian
    bits (read in place once: a shift per byte plane, which vectorizes)."""
    lanes = mem.shape[1]
    nrow, cols = vals.shape
    for r in range(nrow):
        src = vals[r]
        for c in range(chunks):
            _ask(mem, rows, r * chunks + c + AHEAD)
            n = min(lanes, cols - c * lanes)
            run = src[c * lanes:c * lanes + n]
            for b in range(width):
                dst = mem[rows[r * chunks + c, b]]
                for l in range(n):
                    dst[l] = np.uint8((run[l] >> (8 * b)) & 0xFF)
                for l in range(n, lanes):
                    dst[l] = 0


@njit(cache=True)
def fetch(mem, rows, vals, chunks):
    """The inverse of `store`: vals[r, c * lanes + l] = the bytes mem[rows[r * chunks + c, b], l],
    b = 0 .. width - 1, as one little-endian unsigned integer (vals [rows, cols] of width bytes:
    the tensor's bits in place, no byte-plane temporary to transpose)."""
    lanes = mem.shape[1]
    nrow, cols = vals.shape
    width = rows.shape[1]
    for r in range(nrow):
        dst = vals[r]
        for c in range(chunks):
            _ask(mem, rows, r * chunks + c + AHEAD)
            n = min(lanes, cols - c * lanes)
            run = dst[c * lanes:c * lanes + n]
            src = mem[rows[r * chunks + c, 0]]
            for l in range(n):
                run[l] = src[l]
            for b in range(1, width):
                src = mem[rows[r * chunks + c, b]]
                for l in range(n):
                    run[l] = run[l] | (np.uint32(src[l]) << np.uint32(8 * b))


@njit(cache=True)
def clear(mem, rows):
    """mem[rows] = 0."""
    for i in range(rows.shape[0]):
        dst = mem[rows[i]]
        for l in range(dst.shape[0]):
            dst[l] = 0
