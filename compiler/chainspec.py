"""The contract between lowering and the scheduler: what a chain is, and its array form.

A *chain* is a rigid group of instructions at fixed cycle offsets from one anchor T (a producer
and its consumers connected by streams: there are no interlocks, so they move together).

  Ins      one instruction: alternative queues (the first free one is taken), offset from T,
           opcode, args (plain ints), `patch` (arg index, group, plane offset, dtype code: stream
           refs filled in when the group gets its streams), the MEM bank it uses, SRAM plane
           slots read and written, ordering on markers (`after`: T + off >= marker + delta;
           `mark`: marker = max(marker, T + off + add)) and extra queue cycles it holds.
  Chain    its instructions, its stream groups (direction, koff, width: the group's values
           ride w consecutive streams on diagonal k = T + koff), the DSL line and IR node, and
           a search hint (key, delta: start at the anchor of the previous chain with that key
           plus delta).

Markers, hint keys and queue groups are numbered by a `Registry` that lives as long as one
compilation. Lowering builds chains through `chains.ChainBuilder`, which writes them straight
into the flat form (`Flat`: one list per field, ids instead of keys); `Chain` objects of `Ins`
are the readable form of the same thing (tests, hand-built chains). `encode` turns a batch
of either into integer arrays (CSR for the variable-length parts), the only input of the
jitted placement (`place_core`).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from lpu.isa.opcodes import NARGS

DIAG0 = 1 << 16       # diagonal k is stored at k + DIAG0 (k = T + koff may be negative)


@dataclass(slots=True)
class Ins:
    queues: tuple          # alternative queues (the first free one is taken)
    off: int               # cycle offset from the chain's anchor T
    op: int
    args: list
    patch: tuple = ()      # ((arg index, group, plane offset, dtype code), ...)
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
    hint: tuple = ()       # (key, delta)


class Registry:
    """Integer ids for the hashable keys of one compilation: queue groups (tuples of queue
    ids), markers and hint keys. Ids are given in order of first use, so they are
    deterministic. Lowering and the scheduler share one registry."""

    def __init__(self):
        self.qgroups: dict[tuple, int] = {}
        self.markers: dict = {}
        self.hints: dict = {}

    def qgroup(self, queues: tuple) -> int:
        return _id(self.qgroups, queues)

    def marker(self, key) -> int:
        return _id(self.markers, key)

    def hint(self, key) -> int:
        return _id(self.hints, key)

    def qgroup_arrays(self):
        """(ptr, queues): group i holds queues[ptr[i]:ptr[i+1]]."""
        order = sorted(self.qgroups, key=self.qgroups.get)
        ptr = np.cumsum([0] + [len(qs) for qs in order]).astype(np.int64)
        q = np.fromiter((x for qs in order for x in qs), np.int64, int(ptr[-1]))
        return ptr, q


def _id(table: dict, key) -> int:
    i = table.get(key)
    if i is None:
        i = table[key] = len(table)
    return i


CHAIN_FIELDS = ("c_nins", "c_ngrp", "c_hint", "c_hdelta", "c_line", "c_node")
GROUP_FIELDS = ("g_dir", "g_koff", "g_w")
INS_FIELDS = ("qg", "off", "op", "bank", "args", "n_p", "n_r", "n_w", "n_a", "n_m", "n_e")
ENTRY_FIELDS = ("p_data", "r_data", "w_data", "a_data", "m_data", "e_data")
FIELDS = CHAIN_FIELDS + GROUP_FIELDS + INS_FIELDS + ENTRY_FIELDS
_PAD = [[0] * k for k in range(NARGS + 1)]


class Flat:
    """Chains in flat form: one list per field, counts instead of pointers, so that batches
    concatenate by extending. Per chain: its instruction and group counts, hint id (-1 none)
    and delta, line, node. Per group: dir, koff, width. Per instruction: queue group id,
    offset, opcode, bank, NARGS args, and the counts of its patch, read, write, after, mark
    and extra entries, whose data follow in the entry lists (patch: 4 ints each; after, mark,
    extra: 2 each; marker keys as registry ids). `ChainBuilder` builds one chain as a Flat;
    `add_chain` encodes a `Chain` object."""

    __slots__ = FIELDS

    def __init__(self):
        for f in FIELDS:
            setattr(self, f, [])

    @property
    def n_ins(self) -> int:
        return len(self.off)

    @property
    def n_chains(self) -> int:
        return len(self.c_nins)

    def extend(self, other: "Flat"):
        for f in FIELDS:
            getattr(self, f).extend(getattr(other, f))

    def add_ins(self, qg, off, op, args, patch=(), bank=-1, reads=(), writes=(), after=(), mark=(), extra=()):
        """One instruction; after and mark hold (marker id, delta) pairs."""
        self.qg.append(qg)
        self.off.append(off)
        self.op.append(op)
        self.bank.append(bank)
        self.args.extend(args)
        self.args.extend(_PAD[NARGS - len(args)])
        self.n_p.append(len(patch))
        for p in patch:
            self.p_data.extend(p)
        self.n_r.append(len(reads))
        self.r_data.extend(reads)
        self.n_w.append(len(writes))
        self.w_data.extend(writes)
        self.n_a.append(len(after))
        for a in after:
            self.a_data.extend(a)
        self.n_m.append(len(mark))
        for a in mark:
            self.m_data.extend(a)
        self.n_e.append(len(extra))
        for a in extra:
            self.e_data.extend(a)

    def add_chain(self, ch: Chain, reg: Registry):
        n0 = len(self.off)
        for d, koff, w in ch.groups:
            self.g_dir.append(d)
            self.g_koff.append(koff)
            self.g_w.append(w)
        for ins in ch.ins:
            self.add_ins(reg.qgroup(ins.queues), ins.off, ins.op, ins.args, ins.patch, ins.bank, ins.reads,
                         ins.writes, [(reg.marker(k), d) for k, d in ins.after],
                         [(reg.marker(k), d) for k, d in ins.mark], ins.extra)
        self.end_chain(len(self.off) - n0, len(ch.groups), reg.hint(ch.hint[0]) if ch.hint else -1,
                       ch.hint[1] if ch.hint else 0, ch.line, ch.node)

    def end_chain(self, nins, ngrp, hint, hdelta, line, node):
        self.c_nins.append(nins)
        self.c_ngrp.append(ngrp)
        self.c_hint.append(hint)
        self.c_hdelta.append(hdelta)
        self.c_line.append(line)
        self.c_node.append(node)

    def arrays(self) -> "ChainArrays":
        def arr(name, cols=0):
            a = np.array(getattr(self, name), np.int64)
            return a.reshape(-1, cols) if cols else a

        def ptr(name):
            cnt = getattr(self, name)
            out = np.zeros(len(cnt) + 1, np.int64)
            np.cumsum(cnt, out=out[1:])
            return out

        a = ChainArrays(
            ptr("c_nins"), ptr("c_ngrp"), arr("c_hint"), arr("c_hdelta"), arr("c_line"), arr("c_node"),
            arr("g_dir"), arr("g_koff"), arr("g_w"), arr("qg"), arr("off"), arr("op"), arr("bank"),
            arr("args", NARGS), ptr("n_p"), arr("p_data", 4), ptr("n_r"), arr("r_data"), ptr("n_w"),
            arr("w_data"), ptr("n_a"), arr("a_data", 2), ptr("n_m"), arr("m_data", 2), ptr("n_e"),
            arr("e_data", 2))
        if len(a.g_koff) and np.abs(a.g_koff).max() >= DIAG0:
            raise AssertionError(f"scheduler: stream offset {np.abs(a.g_koff).max()} out of range")
        return a


@dataclass
class ChainArrays:
    """A batch of chains as arrays. Per chain c: its instructions are ins_ptr[c]:ins_ptr[c+1],
    its groups grp_ptr[c]:grp_ptr[c+1] (patch entries refer to groups by index within the
    chain). Per instruction i, each CSR field f holds f_data[f_ptr[i]:f_ptr[i+1]]."""
    ins_ptr: np.ndarray
    grp_ptr: np.ndarray
    hint: np.ndarray        # hint key id or -1
    hint_delta: np.ndarray
    line: np.ndarray
    node: np.ndarray
    g_dir: np.ndarray
    g_koff: np.ndarray
    g_w: np.ndarray
    qg: np.ndarray          # queue group id per instruction
    off: np.ndarray
    op: np.ndarray
    bank: np.ndarray
    args: np.ndarray        # [n, NARGS]
    p_ptr: np.ndarray
    p_data: np.ndarray      # [k, 4] arg index, group, plane, dtype
    r_ptr: np.ndarray
    r_data: np.ndarray
    w_ptr: np.ndarray
    w_data: np.ndarray
    a_ptr: np.ndarray
    a_data: np.ndarray      # [k, 2] marker id, delta
    m_ptr: np.ndarray
    m_data: np.ndarray      # [k, 2] marker id, add
    e_ptr: np.ndarray
    e_data: np.ndarray      # [k, 2] queue, off

    @property
    def n_ins(self) -> int:
        return len(self.off)


def encode(chains, reg: Registry) -> ChainArrays:
    """Chain objects and Flat batches, in order, as one ChainArrays."""
    flat = Flat()
    for ch in chains:
        if isinstance(ch, Flat):
            flat.extend(ch)
        else:
            flat.add_chain(ch, reg)
    return flat.arrays()
