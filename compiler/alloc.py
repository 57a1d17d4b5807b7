"""SRAM allocation: where every vector of every tensor lives.

SRAM is seen as one space of *plane slots*, each one byte plane of one vector (lanes bytes)
at one (slice, bank, address). Slot g is in row r = g // slices, slice g % slices, with rows
alternating banks (bank = r % banks, address = r // banks): consecutive slots sit in
different slices, so the planes of a vector and neighbouring vectors can be read in the same
cycle. A vector of a w-byte dtype takes w consecutive slots starting at a multiple of w within a
4-aligned range, so its planes stay in one hemisphere (slices per hemisphere is a multiple of
4) and can travel as one stream group.

Persistent tensors (inputs, weights, states, constants, outputs) are placed first and never
freed; temporaries are placed first-fit in program order and freed after their last use, so
dead regions are reused. A tensor's storage is an array of base slots, one per vector, shaped
like its vector grid (leading axes..., chunks); views (slices, reshapes, transposes that keep the
last axis) are index operations on that array and need no copy.
"""
from __future__ import annotations

import bisect

import numpy as np

from lpu.isa.errors import CapacityError

ALIGN = 4


class SlotAllocator:
    def __init__(self, machine):
        self.m = machine
        self.slices = machine.mem_slices
        self.capacity = machine.mem_slices * machine.banks_per_slice * machine.addresses_per_bank
        self.free: list[list[int]] = [[0, self.capacity]]   # sorted [start, length]
        self.in_use = 0
        self.peak = 0
        self.touched = 0          # slots below this may have held a temporary
        self.top = self.capacity  # fresh regions are carved downwards from here
        self.log: list | None = None  # when a list: every alloc ("a", n, start) and release ("r", start, n)

    def alloc_fresh(self, n: int, what: str = "") -> int:
        """A region that no temporary has ever used (for constants placed during lowering:
        the host loads them before cycle 0, so no earlier write may land there). Taken from
        the top of SRAM."""
        n = -(-n // ALIGN) * ALIGN
        start, length = self.free[-1] if self.free else (0, 0)
        if start + length == self.top and length >= n and self.top - n >= self.touched:
            self.free[-1][1] -= n
            if self.free[-1][1] == 0:
                self.free.pop()
            self.in_use += n
            self.peak = max(self.peak, self.in_use)
            self.top -= n
            return self.top
        return self._fail(n, what)

    def alloc(self, n: int, what: str = "") -> int:
        n = -(-n // ALIGN) * ALIGN
        for start, length in self.free:
            if length >= n:
                self.alloc_at(start, n)
                return start
        return self._fail(n, what)

    def alloc_near(self, n: int, cost, margin: int, what: str = "") -> int:
        """A region of n slots whose slices are near a unit (`cost`: a list by slice, a region's
        cost its largest): first fit unless that costs more than `margin` over the least a
        region can, else of every free block the start of least cost, the lowest among equals."""
        n = -(-n // ALIGN) * ALIGN
        phases = self._phases(n, cost)
        least = phases[0][0]
        first = next((start for start, length in self.free if length >= n), None)
        if first is not None and self._cost(first, n, cost) <= least + margin:
            self.alloc_at(first, n)     # first fit is near enough
            return first
        best = None
        for start, length in self.free:
            if length < n:
                continue
            for c, p in phases:
                if best is not None and c >= best[0]:
                    break
                s = start + (p - start) % self.slices
                if s + n <= start + length:
                    best = (c, s)
                    break
            if best is not None and best[0] == least:
                break
        if best is None:
            return self._fail(n, what)
        self.alloc_at(best[1], n)
        return best[1]

    def _cost(self, start: int, n: int, cost) -> int:
        return max(cost[(start + k) % self.slices] for k in range(min(n, self.slices)))

    def _phases(self, n: int, cost) -> list:
        """(cost, first slice) of every aligned first slice, cheapest first, for regions of n slots."""
        key = (n, id(cost))
        cache = self.__dict__.setdefault("_phase_cache", {})
        if key not in cache:
            cache[key] = sorted((self._cost(p, n, cost), p) for p in range(0, self.slices, ALIGN))
        return cache[key]

    def alloc_at(self, start: int, n: int) -> bool:
        """Take [start, start + n) if it is free (logged like `alloc`); False if not."""
        n = -(-n // ALIGN) * ALIGN
        i = bisect.bisect_right(self.free, [start, float("inf")]) - 1
        if i < 0:
            return False
        s, length = self.free[i]
        if start + n > s + length:
            return False
        pieces = [p for p in ([s, start - s], [start + n, s + length - start - n]) if p[1] > 0]
        self.free[i:i + 1] = pieces
        self.in_use += n
        self.peak = max(self.peak, self.in_use)
        self.touched = max(self.touched, start + n)
        if self.log is not None:
            self.log.append(("a", n, start))
        return True

    def alloc_congruent(self, n: int, residue: int, period: int) -> int | None:
        """First-fit for a region whose start is `residue` modulo `period` (so that its vectors
        sit in the same slices and banks as a region starting at `residue`); None if none fits."""
        n = -(-n // ALIGN) * ALIGN
        for s, length in self.free:
            start = s + (residue - s) % period
            if start + n <= s + length:
                self.alloc_at(start, n)
                return start
        return None

    def take_held(self, start: int, n: int):
        """A region allocated earlier for a node is handed to it now: logged as an alloc at this
        point, so that replaying the log (`replays`) allocates it where the node is lowered."""
        if self.log is not None:
            self.log.append(("a", -(-n // ALIGN) * ALIGN, start))

    def _fail(self, n, what):
        raise CapacityError(
            f"out of SRAM while placing {what or 'a temporary'}: {n * self.m.lanes:,} bytes needed, "
            f"{self.largest_free() * self.m.lanes:,} bytes free in one piece "
            f"({self.in_use * self.m.lanes:,} of {self.m.sram_bytes:,} bytes in use)",
            bytes_needed=(self.in_use + n) * self.m.lanes, bytes_available=self.m.sram_bytes,
            chips_needed=-(-(self.in_use + n) * self.m.lanes // self.m.sram_bytes))

    def release(self, start: int, n: int):
        n = -(-n // ALIGN) * ALIGN
        if self.log is not None:
            self.log.append(("r", start, n))
        self.in_use -= n
        i = bisect.bisect_left(self.free, [start, 0])
        self.free.insert(i, [start, n])
        # coalesce with neighbours
        if i + 1 < len(self.free) and self.free[i][0] + self.free[i][1] == self.free[i + 1][0]:
            self.free[i][1] += self.free.pop(i + 1)[1]
        if i > 0 and self.free[i - 1][0] + self.free[i - 1][1] == self.free[i][0]:
            self.free[i - 1][1] += self.free.pop(i)[1]

    def state(self) -> tuple:
        return [list(f) for f in self.free], self.in_use, self.peak, self.touched

    def set_state(self, st: tuple):
        self.free, self.in_use, self.peak, self.touched = st

    def replays(self, log: list) -> bool:
        """Whether `log`'s allocs and releases can be done now in the same regions (each region
        free when it is taken); if so they are done (and logged), else nothing changes."""
        saved, outer = self.state(), self.log
        self.log = None
        try:
            for kind, a, b in log:
                if kind == "r":
                    self.release(a, b)
                elif not self.alloc_at(b, a):
                    self.set_state(saved)
                    return False
        finally:
            self.log = outer
        if outer is not None:
            outer.extend(log)
        return True

    def largest_free(self) -> int:
        return max((length for _, length in self.free), default=0)

    def where(self, slots: np.ndarray):
        """(slice, bank, address) arrays of plane slots."""
        return slot_place(slots, self.slices, self.m.banks_per_slice)


def slot_place(slot, slices: int, banks: int):
    """(slice, bank, address) of a plane slot (an int, or an array of them)."""
    row = slot // slices
    return slot % slices, row % banks, row // banks


def period_stride(shape: tuple, width: int, lanes: int, period: int) -> int:
    """Slots between the blocks of a periodic layout (first axis): one block, rounded up to
    a multiple of `period`."""
    block = int(np.prod(grid_shape(shape[1:], lanes))) * width
    return -(-block // period) * period


def grid_shape(shape: tuple, lanes: int) -> tuple:
    """Shape of the vector grid: leading axes, then chunks of the last axis ([1, C] for 1-D)."""
    if len(shape) == 0:
        return (1, 1)
    lead = tuple(shape[:-1]) if len(shape) > 1 else (1,)
    return lead + (max(1, -(-shape[-1] // lanes)),)


def layout(start: int, shape: tuple, width: int, lanes: int, chunk_major: bool, period: int = 0) -> np.ndarray:
    """Base slots of a fresh tensor: vector i of the chosen order at start + i * width.
    chunk_major orders vectors (leading..., chunk, row) so that a weight's K-tile rows for one
    output chunk are consecutive (one per slice): the MXM loads them without bank conflicts.
    period > 0: each index of the first axis gets a block of its own whose start is a multiple
    of `period` slots apart (see `period_stride`), so every block has the same slice and bank
    pattern (the trips of a loop that each use one block are then alike)."""
    if period:
        stride = period_stride(shape, width, lanes, period)
        block = layout(0, shape[1:], width, lanes, chunk_major)
        out = (np.arange(shape[0], dtype=np.int64) * stride).reshape((-1,) + (1,) * block.ndim) + block[None]
        return start + out.reshape(grid_shape(shape, lanes))
    g = grid_shape(shape, lanes)
    n = int(np.prod(g))
    if not chunk_major or len(g) < 2:
        return (start + np.arange(n, dtype=np.int64) * width).reshape(g)
    lead, rows, chunks = g[:-2], g[-2], g[-1]
    order = np.arange(n, dtype=np.int64).reshape(lead + (chunks, rows))
    return (start + np.swapaxes(order, -1, -2) * width).reshape(g)
