"""Pass `schedule`: place chains of instructions on cycles, respecting every timing rule.

There are no interlocks on this machine: a value on a stream passes a position in exactly one
cycle, so a producer and its consumers form a rigid *chain* whose instructions sit at fixed
offsets from one anchor cycle T. The scheduler places chains one by one (in program order) at
the earliest T at which

  - every instruction's queue (or one of its alternative queues) is free at T + offset, and so
    are the extra queue cycles it reserves (an f16 product holds a plane pair 2 cycles);
  - every MEM bank it touches is free in that cycle (one access per bank per cycle);
  - every stream group (direction, diagonal T + koff, width w) finds w consecutive streams free
    on its diagonal (one value per stream position);
  - data is ready: an SRAM plane is read only after it was written (RAW), written only after
    the previous occupant's last read and write (WAR, WAW), and unit state is used in order
    (markers: LW after the previous IW, IW after the LWs and the last ABC, ACC after its
    accumulator row is ready, ...).

The result is a list of placed instructions (cycle, queue, opcode, args, line, node), which
`codegen` turns into per-queue streams with NOP padding.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from lpu.isa.opcodes import OPS, latency_table

BIG = 1 << 32


@dataclass(slots=True)
class Ins:
    """One instruction of a chain. `args` holds plain ints; `patch` lists (arg index, group,
    plane offset, dtype code) for stream refs filled in when the group gets its streams."""
    queues: tuple          # alternative queues (the first free one is taken)
    off: int               # cycle offset from the chain's anchor T
    op: int
    args: list
    patch: tuple = ()
    bank: int = -1         # global bank id (slice * banks + bank), -1 if none
    reads: tuple = ()      # SRAM plane slots read
    writes: tuple = ()     # SRAM plane slots written
    after: tuple = ()      # ((marker key, delta), ...): T + off >= marker + delta
    mark: tuple = ()       # ((marker key, add), ...): marker = max(marker, T + off + add)
    extra: tuple = ()      # ((queue, off), ...) additional queue cycles held


@dataclass(slots=True)
class Chain:
    ins: list
    groups: list           # [(dir, koff, width)]: diagonal k = T + koff
    line: int = 0
    node: int = -1
    hint: tuple = ()       # (key, delta): start the search at the anchor of the previous chain
                           # with this key + delta (chains that follow each other on one unit)


@dataclass
class Placed:
    cycle: list = field(default_factory=list)
    queue: list = field(default_factory=list)
    op: list = field(default_factory=list)
    args: list = field(default_factory=list)
    line: list = field(default_factory=list)
    node: list = field(default_factory=list)


class Scheduler:
    def __init__(self, machine):
        self.m = machine
        self.nstreams = machine.streams_per_direction
        self.lat = latency_table(machine)
        self.qbusy: set[int] = set()        # queue * BIG + cycle
        self.bbusy: set[int] = set()        # bank * BIG + cycle
        self.streams: dict[int, int] = {}   # (k * 2 + dir) -> bitmask of streams in use
        self.slot_w: dict[int, int] = {}    # slot -> last write cycle
        self.slot_r: dict[int, int] = {}    # slot -> last read cycle
        self.markers: dict = {}
        self.hints: dict = {}
        self.gcount: dict[int, int] = {}    # id(queue group) * BIG + cycle -> queues of it in use
        self.out = Placed()
        self.last_cycle = -1                # max over placed instructions of issue + latency

    # ---- the earliest anchor allowed by data and unit-state order ------------------------------
    def _earliest(self, chain: Chain, floor: int) -> int:
        T = floor
        sw, sr, mk = self.slot_w, self.slot_r, self.markers
        for ins in chain.ins:
            off = ins.off
            if -off > T:
                T = -off
            for g in ins.reads:
                w = sw.get(g)
                if w is not None and w + 1 - off > T:
                    T = w + 1 - off
            for g in ins.writes:
                w = sw.get(g)
                if w is not None and w + 1 - off > T:
                    T = w + 1 - off
                r = sr.get(g)
                if r is not None and r + 1 - off > T:
                    T = r + 1 - off
            for key, d in ins.after:
                v = mk.get(key)
                if v is not None and v + d - off > T:
                    T = v + d - off
        return T

    def place(self, chain: Chain, floor: int = 0) -> int:
        """Place `chain` at the earliest feasible anchor >= floor; return the anchor."""
        if chain.hint:
            prev = self.hints.get(chain.hint[0])
            if prev is not None and prev + chain.hint[1] > floor:
                floor = prev + chain.hint[1]
        T = self._earliest(chain, floor)
        qbusy, bbusy, gcount = self.qbusy, self.bbusy, self.gcount
        limit = T + 1_000_000
        inss = chain.ins
        pilots = [ins for ins in inss if len(ins.queues) == 1]
        if len(chain.groups) > 1:
            need: dict = {}
            for d, koff, w in chain.groups:
                need[(d, koff)] = need.get((d, koff), 0) + w
            if max(need.values()) > self.nstreams:
                raise AssertionError(f"scheduler: a chain of DSL line {chain.line} needs {max(need.values())} "
                                     f"streams on one diagonal, the machine has {self.nstreams}")
        while T < limit:
            # fast skip: advance until the single-queue instructions (a unit's only queue) are free
            moved = True
            while moved:
                moved = False
                for ins in pilots:
                    q0 = ins.queues[0] * BIG
                    while q0 + T + ins.off in qbusy:
                        T += 1
                        moved = True
                    for eq, eoff in ins.extra:
                        while eq * BIG + T + eoff in qbusy:
                            T += 1
                            moved = True
            chosen = self._fit(inss, T, qbusy, bbusy, gcount)
            if chosen.__class__ is Ins:        # skip to where the failing instruction fits alone
                ins = chosen
                T += 1
                while True:
                    t = T + ins.off
                    if ins.bank >= 0 and ins.bank * BIG + t in bbusy:
                        T += 1
                        continue
                    if len(ins.queues) == 1:
                        if ins.queues[0] * BIG + t in qbusy:
                            T += 1
                            continue
                    elif gcount.get(id(ins.queues) * BIG + t, 0) >= len(ins.queues):
                        T += 1
                        continue
                    break
                continue
            if chosen is not None:
                sids = self._streams_for(chain.groups, T)
                if sids is not None:
                    self._commit(chain, T, chosen, sids)
                    if chain.hint:
                        self.hints[chain.hint[0]] = T
                    return T
            T += 1
        raise AssertionError(f"scheduler: no cycle found for a chain of DSL line {chain.line} "
                             f"({[OPS[i.op].name for i in chain.ins]})")

    @staticmethod
    def _fit(inss, T, qbusy, bbusy, gcount):
        """The queue each instruction takes at anchor T; if a queue or bank is busy, the
        instruction that does not fit (or None when two of the chain's own collide)."""
        chosen = []
        taken = set()
        for ins in inss:
            t = T + ins.off
            if ins.bank >= 0:
                bk = ins.bank * BIG + t
                if bk in bbusy:
                    return ins
                if -bk - 1 in taken:
                    return None
                taken.add(-bk - 1)
            qs = ins.queues
            if len(qs) > 1 and gcount.get(id(qs) * BIG + t, 0) >= len(qs):
                return ins                     # every queue of its group is taken
            for cand in qs:
                key = cand * BIG + t
                if key not in qbusy and key not in taken:
                    taken.add(key)
                    chosen.append(cand)
                    break
            else:
                return ins if len(qs) == 1 or all(q * BIG + t in qbusy for q in qs) else None

            for eq, eoff in ins.extra:
                key = eq * BIG + T + eoff
                if key in qbusy or key in taken:
                    return None
                taken.add(key)
        return chosen

    def _streams_for(self, groups, T):
        """A free stream (w consecutive) per group on its diagonal, or None."""
        sids = []
        seen: dict[int, int] = {}
        streams, ns = self.streams, self.nstreams
        for d, koff, w in groups:
            key = (T + koff) * 2 + d
            used = seen.get(key)
            if used is None:
                used = streams.get(key, 0)
            full = (1 << w) - 1
            for c in range(ns - w + 1):
                if not (used >> c) & full:
                    break
            else:
                return None
            sids.append(c)
            seen[key] = used | (full << c)
        return sids

    def _commit(self, chain: Chain, T: int, chosen, sids):
        streams = self.streams
        for (d, koff, w), s in zip(chain.groups, sids):
            key = (T + koff) * 2 + d
            streams[key] = streams.get(key, 0) | (((1 << w) - 1) << s)
        out, mk, lat = self.out, self.markers, self.lat
        qadd, badd = self.qbusy.add, self.bbusy.add
        slot_r, slot_w = self.slot_r, self.slot_w
        groups = chain.groups
        last = self.last_cycle
        line, node = chain.line, chain.node
        gcount = self.gcount
        for ins, q in zip(chain.ins, chosen):
            t = T + ins.off
            qadd(q * BIG + t)
            if len(ins.queues) > 1:
                gk = id(ins.queues) * BIG + t
                gcount[gk] = gcount.get(gk, 0) + 1
            for eq, eoff in ins.extra:
                qadd(eq * BIG + T + eoff)
            if ins.bank >= 0:
                badd(ins.bank * BIG + t)
            for g in ins.reads:
                if slot_r.get(g, -1) < t:
                    slot_r[g] = t
            for g in ins.writes:
                slot_w[g] = t
            for key, add in ins.mark:
                v = t + add
                if mk.get(key, -(1 << 60)) < v:
                    mk[key] = v
            args = ins.args
            for ai, gi, plane, dt in ins.patch:
                args[ai] = dt * 256 + groups[gi][0] * 64 + sids[gi] + plane
            out.cycle.append(t)
            out.queue.append(q)
            out.op.append(ins.op)
            out.args.append(args)
            out.line.append(line)
            out.node.append(node)
            end = t + lat[ins.op]
            if end > last:
                last = end
        self.last_cycle = last

    def predicted_cycles(self) -> int:
        if self.last_cycle < 0:
            return 0
        return self.last_cycle + 1 + self.m.icu_skew

