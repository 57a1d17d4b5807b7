"""Arrays on transparent huge pages (2 MiB), where the kernel offers them (Linux, THP enabled
or `madvise`). The core's state and the SRAM image are tens of MB touched at random: with 4 KiB
pages nearly every access missed the TLB (a page walk, on a virtual machine a nested one);
bert_base L=1 ran 11% faster with the SRAM image on huge pages alone."""
import mmap

import numpy as np

HUGE = 1 << 21
ALIGN = 64          # every array starts on a cache line


def _mapping(nbytes):
    """Zeroed bytes, nbytes long, starting at a 2 MiB boundary of a private mapping advised
    for huge pages (plain numpy zeros where there is no mmap or madvise)."""
    try:
        buf = mmap.mmap(-1, nbytes + HUGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        buf.madvise(mmap.MADV_HUGEPAGE)
    except (AttributeError, OSError, ValueError):
        return np.zeros(nbytes, np.uint8)
    raw = np.frombuffer(buf, np.uint8)
    off = (-raw.ctypes.data) % HUGE
    return raw[off:off + nbytes]


def arrays(specs):
    """C-contiguous arrays (shape, dtype, fill value) carved out of one huge-page mapping,
    in order."""
    sizes = [int(np.prod(shape, dtype=np.int64)) * np.dtype(dt).itemsize for shape, dt, _ in specs]
    offs, at = [], 0
    for n in sizes:
        offs.append(at)
        at += -(-n // ALIGN) * ALIGN
    raw = _mapping(max(at, 1))
    out = []
    for (shape, dt, fill), off, n in zip(specs, offs, sizes):
        a = raw[off:off + n].view(dt).reshape(shape)
        if fill != 0:
            a.fill(fill)
        out.append(a)
    return out


def zeros(shape, dtype):
    return arrays([(shape, dtype, 0)])[0]
