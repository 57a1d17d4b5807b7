"""Bounded integer draws equal to numpy's `Generator.integers(lo, hi, size)` (int64, a range
below 2**32) on a PCG64 generator, about 4x faster (the inputs of Llama-2-7B's i8 weights are
hundreds of millions of draws, made before every `lpu run`).

numpy draws each value with Lemire's method from one 32-bit output of the generator: m = u32 *
r (r = hi - lo), value lo + (m >> 32), the draw rejected (the next u32 taken) while the low 32
bits of m are below (2**32 - r) % r. PCG64 makes its 32-bit outputs as the low, then the high
half of each 64-bit output, keeping an unused high half in its state (`has_uint32`,
`uinteger`). `draw` takes the 64-bit outputs in bulk (`random_raw`), applies the method in a
jitted loop, and leaves the state as numpy's own draws would (the same outputs, the same half
kept), so every later draw is the same too."""
import sys

import numpy as np
from numba import njit

CHUNK = 1 << 20


@njit(cache=True)
def lemire(u32, r, threshold, lo, out) -> tuple:
    """Fill out[:] from the 32-bit outputs u32 in order: (outputs taken, values made). A chunk
    with no rejected draw (nearly every one: a draw is rejected with odds threshold / 2**32) is
    made in one branch-free pass that vectorizes; a chunk with one is made again draw by draw."""
    n = out.shape[0]
    if u32.shape[0] >= n:
        least = np.uint32(0xFFFFFFFF)      # the smallest low half: one compare after the pass
        for i in range(n):
            m = np.uint64(u32[i]) * np.uint64(r)
            least = min(least, np.uint32(m & np.uint64(0xFFFFFFFF)))
            out[i] = lo + np.int64(m >> np.uint64(32))
        if least >= threshold:
            return n, n
    j = 0
    for i in range(out.shape[0]):
        while True:
            if j == u32.shape[0]:
                return j, i
            m = np.uint64(u32[j]) * np.uint64(r)
            j += 1
            if (m & np.uint64(0xFFFFFFFF)) >= threshold:
                break
        out[i] = lo + np.int64(m >> np.uint64(32))
    return j, out.shape[0]


def usable(bitgen, lo: int, hi: int) -> bool:
    return isinstance(bitgen, np.random.PCG64) and sys.byteorder == "little" and 1 < hi - lo < (1 << 32)


def draw(bitgen, lo: int, hi: int, out: np.ndarray) -> None:
    """out (1-D, any integer dtype holding [lo, hi)) = Generator(bitgen).integers(lo, hi, out.size)."""
    r = hi - lo
    threshold = ((1 << 32) - r) % r
    st = bitgen.state
    left = np.array([st["uinteger"]] if st["has_uint32"] else [], np.uint32)
    done = 0
    while done < out.size:
        need = min(CHUNK, out.size - done)
        raw = bitgen.random_raw(max(0, (need - len(left) + 1) // 2))
        u32 = np.concatenate([left, raw.view(np.uint32)]) if len(left) else raw.view(np.uint32)
        taken, made = lemire(u32, r, threshold, lo, out[done:done + need])
        done += made
        left = u32[taken:]
    st = bitgen.state
    st["has_uint32"], st["uinteger"] = (1, int(left[0])) if len(left) else (0, 0)
    bitgen.state = st
