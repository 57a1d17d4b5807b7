"""Arrays on transparent huge pages (2 MiB), where the kernel offers them (Linux, THP enabled
or `madvise`). The core's state and the SRAM image are tens of MB touched at random: with 4 KiB
pages nearly every access missed the TLB (a page walk, on a virtual machine a nested one):
bert_base L=1 ran 5-11% faster (CPU time, A/B) with the SRAM image on huge pages alone.
(numpy's own large arrays had landed on the brk heap, which is not eligible for huge pages.)"""
import mmap

import numpy as np

HUGE = 1 << 21


def zeros(shape, dtype):
    """np.zeros(shape, dtype), C-contiguous; from 2 MiB on, starting at a 2 MiB boundary of a
    private anonymous mapping advised MADV_HUGEPAGE (plain np.zeros where that is refused)."""
    dt = np.dtype(dtype)
    n = int(np.prod(shape, dtype=np.int64)) * dt.itemsize
    if n < HUGE:
        return np.zeros(shape, dt)
    try:
        buf = mmap.mmap(-1, n + HUGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        buf.madvise(mmap.MADV_HUGEPAGE)
    except (AttributeError, OSError, ValueError):
        return np.zeros(shape, dt)
    raw = np.frombuffer(buf, np.uint8)
    off = (-raw.ctypes.data) % HUGE
    return raw[off:off + n].view(dt).reshape(shape)
