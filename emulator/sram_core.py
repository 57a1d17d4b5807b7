"""Jitted copies between tensors' bytes and the compact SRAM image (used by emulator/run.py's
`load`): one pass over a tensor's bytes instead of numpy's padded, transposed temporaries."""
from numba import njit


@njit(cache=True)
def store(mem, rows, bits, chunks):
    """mem[rows[r * chunks + c, b], l] = bits[r, c * lanes + l, b] (byte b of the element in
    column c * lanes + l of row r; 0 past the last column): bits uint8 [rows, cols, width]."""
    lanes = mem.shape[1]
    nrow, cols, width = bits.shape
    for r in range(nrow):
        for c in range(chunks):
            n = min(lanes, cols - c * lanes)
            for b in range(width):
                dst = mem[rows[r * chunks + c, b]]
                for l in range(n):
                    dst[l] = bits[r, c * lanes + l, b]
                for l in range(n, lanes):
                    dst[l] = 0


@njit(cache=True)
def clear(mem, rows):
    """mem[rows] = 0."""
    for i in range(rows.shape[0]):
        dst = mem[rows[i]]
        for l in range(dst.shape[0]):
            dst[l] = 0
