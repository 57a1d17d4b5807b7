"""Jitted copies between tensors' bytes and the compact SRAM image (used by emulator/run.py's
`load` and `_fetch`): one pass over a tensor's bytes instead of numpy's padded, transposed
temporaries."""
from numba import njit


@njit(cache=True)
def store(mem, rows, by, chunks):
    """mem[rows[r * chunks + c, b], l] = by[r, c * lanes + l, b] (byte b of the element in column
    c * lanes + l of row r; 0 past the last column): by uint8 [rows, cols, width], the tensor's
    little-endian bytes as they lie in memory (read once, no transposed copy)."""
    lanes = mem.shape[1]
    nrow, cols, width = by.shape
    for r in range(nrow):
        src = by[r]
        for c in range(chunks):
            n = min(lanes, cols - c * lanes)
            for b in range(width):
                dst = mem[rows[r * chunks + c, b]]
                for l in range(n):
                    dst[l] = src[c * lanes + l, b]
                for l in range(n, lanes):
                    dst[l] = 0


@njit(cache=True)
def fetch(mem, rows, planes, chunks):
    """The inverse of `store`: planes[r, b, c * lanes + l] = mem[rows[r * chunks + c, b], l]."""
    lanes = mem.shape[1]
    nrow, width, cols = planes.shape
    for r in range(nrow):
        for b in range(width):
            dst = planes[r, b]
            for c in range(chunks):
                n = min(lanes, cols - c * lanes)
                src, run = mem[rows[r * chunks + c, b]], dst[c * lanes:c * lanes + n]
                for l in range(n):
                    run[l] = src[l]


@njit(cache=True)
def clear(mem, rows):
    """mem[rows] = 0."""
    for i in range(rows.shape[0]):
        dst = mem[rows[i]]
        for l in range(dst.shape[0]):
            dst[l] = 0
