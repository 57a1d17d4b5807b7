"""Stateful test of the SRAM slot allocator: allocate and release at random; regions never
overlap, nothing leaks, capacity is respected, and a released space is reusable."""
from __future__ import annotations

import pytest
from hypothesis import note, strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from lpu.compiler.alloc import ALIGN, SlotAllocator
from lpu.isa.errors import CapacityError
from tests.strategies import tiny_dict
from lpu.isa.machine import MachineConfig


def small_machine():
    d = tiny_dict()
    d["addresses_per_bank"] = 8          # 16 slices x 2 banks x 8 = 256 slots: fills up quickly
    return MachineConfig.from_dict(d)


class AllocatorMachine(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        self.a = SlotAllocator(small_machine())
        self.live: dict[int, int] = {}   # start -> rounded size

    @rule(n=st.integers(1, 70))
    def alloc(self, n):
        size = -(-n // ALIGN) * ALIGN
        try:
            start = self.a.alloc(n, "test")
        except CapacityError:
            note(f"alloc({n}) -> full")
            assert self.a.largest_free() < size
            return
        note(f"alloc({n}) -> {start}")
        assert start % ALIGN == 0 and 0 <= start and start + size <= self.a.capacity
        self.live[start] = size

    @precondition(lambda self: self.live)
    @rule(data=st.data())
    def release(self, data):
        start = data.draw(st.sampled_from(sorted(self.live)))
        note(f"release({start}, {self.live[start]})")
        self.a.release(start, self.live.pop(start))

    @invariant()
    def no_overlap_no_leak(self):
        spans = sorted(self.live.items())
        for (s0, n0), (s1, _) in zip(spans, spans[1:]):
            assert s0 + n0 <= s1, "two live regions overlap"
        free = self.a.free
        for (s0, n0), (s1, _) in zip(free, free[1:]):
            assert s0 + n0 < s1, "free list not sorted and coalesced"
        used = sum(self.live.values())
        assert self.a.in_use == used
        assert used + sum(n for _, n in free) == self.a.capacity, "slots leaked"
        assert self.a.peak >= used and self.a.peak <= self.a.capacity
        for s, n in free:
            assert all(not (s < ls + ln and ls < s + n) for ls, ln in spans), "a live region is on the free list"


TestAllocator = AllocatorMachine.TestCase


def test_full_release_gives_back_one_region():
    a = SlotAllocator(small_machine())
    starts = [a.alloc(16) for _ in range(a.capacity // 16)]
    with pytest.raises(CapacityError):
        a.alloc(1)
    for s in starts[::2] + starts[1::2]:
        a.release(s, 16)
    assert a.free == [[0, a.capacity]] and a.in_use == 0
