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

from lpu.compiler.place_core import DIAG0
from lpu.isa.opcodes import NARGS


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
        self._qg_arrays = None          # qgroup_arrays() for the groups there were then

    def qgroup(self, queues: tuple) -> int:
        return _id(self.qgroups, queues)

    def marker(self, key) -> int:
        return _id(self.markers, key)

    def hint(self, key) -> int:
        return _id(self.hints, key)

    def qgroup_arrays(self):
        """(ptr, queues): group i holds queues[ptr[i]:ptr[i+1]]."""
        if self._qg_arrays is not None and len(self._qg_arrays[0]) == len(self.qgroups) + 1:
            return self._qg_arrays
        order = sorted(self.qgroups, key=self.qgroups.get)
        ptr = np.cumsum([0] + [len(qs) for qs in order]).astype(np.int64)
        q = np.fromiter((x for qs in order for x in qs), np.int64, int(ptr[-1]))
        self._qg_arrays = (ptr, q)
        return ptr, q


def _id(table: dict, key) -> int:
    i = table.get(key)
    if i is None:
        i = table[key] = len(table)
    return i


CHAIN_COLS = 6         # per chain: instructions, groups, hint id (-1 none), hint delta, line, node
GROUP_COLS = 3         # per group: dir, koff, width
INS_COLS = 4 + NARGS + 6   # per instruction: queue group, off, op, bank, args, then the counts of
#                            its patch, read, write, after, mark and extra entries
ENTRY_COLS = {"p": 4, "r": 1, "w": 1, "a": 2, "m": 2, "e": 2}
FIELDS = ("chains", "groups", "ins") + tuple(f"{k}_data" for k in ENTRY_COLS)
_PAD = [(0,) * k for k in range(NARGS + 1)]


class Flat:
    """Chains in flat form, so that batches concatenate by extending lists: `chains`,
    `groups` and `ins` hold CHAIN_COLS, GROUP_COLS and INS_COLS ints per row; the entries of
    each instruction follow in p_data (arg index, group, plane, dtype), r_data and w_data (SRAM
    plane slots), a_data and m_data (marker id, delta) and e_data (queue, off). Marker keys,
    hint keys and queue groups are registry ids. `ChainBuilder` builds one chain as a Flat;
    `add_chain` encodes a `Chain` object."""

    __slots__ = FIELDS

    def __init__(self):
        self.chains, self.groups, self.ins = [], [], []
        self.p_data, self.r_data, self.w_data, self.a_data, self.m_data, self.e_data = [], [], [], [], [], []

    @property
    def n_ins(self) -> int:
        return len(self.ins) // INS_COLS

    @property
    def n_chains(self) -> int:
        return len(self.chains) // CHAIN_COLS

    def extend(self, o: "Flat"):
        self.chains.extend(o.chains)
        self.groups.extend(o.groups)
        self.ins.extend(o.ins)
        self.p_data.extend(o.p_data)
        self.r_data.extend(o.r_data)
        self.w_data.extend(o.w_data)
        self.a_data.extend(o.a_data)
        self.m_data.extend(o.m_data)
        self.e_data.extend(o.e_data)

    def add_ins(self, qg, off, op, args, patch=(), bank=-1, reads=(), writes=(), after=(), mark=(), extra=()):
        """One instruction; after and mark hold (marker id, delta) pairs."""
        ins = self.ins
        ins.extend((qg, off, op, bank))
        ins.extend(args)
        ins.extend(_PAD[NARGS - len(args)])
        ins.extend((len(patch), len(reads), len(writes), len(after), len(mark), len(extra)))
        for p in patch:
            self.p_data.extend(p)
        if reads:
            self.r_data.extend(reads)
        if writes:
            self.w_data.extend(writes)
        for a in after:
            self.a_data.extend(a)
        for a in mark:
            self.m_data.extend(a)
        for a in extra:
            self.e_data.extend(a)

    def add_group(self, d, koff, w) -> int:
        """A stream group of the chain being built; returns its index in the chain."""
        self.groups.extend((d, koff, w))
        return len(self.groups) // GROUP_COLS - 1

    def add_chain(self, ch: Chain, reg: Registry):
        n0 = self.n_ins
        for d, koff, w in ch.groups:
            self.groups.extend((d, koff, w))
        for ins in ch.ins:
            self.add_ins(reg.qgroup(ins.queues), ins.off, ins.op, ins.args, ins.patch, ins.bank, ins.reads,
                         ins.writes, [(reg.marker(k), d) for k, d in ins.after],
                         [(reg.marker(k), d) for k, d in ins.mark], ins.extra)
        self.chains.extend((self.n_ins - n0, len(ch.groups), reg.hint(ch.hint[0]) if ch.hint else -1,
                            ch.hint[1] if ch.hint else 0, ch.line, ch.node))

    def end_chain(self, hint, hdelta, line, node):
        """Close a Flat that holds exactly one chain (the one ChainBuilder built)."""
        self.chains.extend((self.n_ins, len(self.groups) // GROUP_COLS, hint, hdelta, line, node))

    def rows(self) -> dict:
        """Each field as a 2-D int64 array (one row per chain, group, instruction or entry)."""
        out = {}
        for name, cols in FIELD_COLS.items():
            x = getattr(self, name)
            out[name] = np.fromiter(x, np.int64, len(x)).reshape(-1, cols)
        return out

    def arrays(self) -> "ChainArrays":
        return _arrays([self.rows()])


FIELD_COLS = dict(zip(FIELDS, (CHAIN_COLS, GROUP_COLS, INS_COLS) + tuple(ENTRY_COLS.values())))
_EMPTY = {name: np.zeros((0, cols), np.int64) for name, cols in FIELD_COLS.items()}    # never written


class Rows:
    """A batch of chains built with numpy (chains.lw_rows, sxm_rows): the fields of `Flat`
    as 2-D int64 arrays, handed to the scheduler without going through Python lists."""

    __slots__ = FIELDS

    def __init__(self, **fields):
        for name, cols in FIELD_COLS.items():
            x = fields.get(name)
            setattr(self, name, _EMPTY[name] if x is None else np.asarray(x, np.int64).reshape(-1, cols))

    @property
    def n_ins(self) -> int:
        return len(self.ins)

    @property
    def n_chains(self) -> int:
        return len(self.chains)

    def rows(self) -> dict:
        return {name: getattr(self, name) for name in FIELDS}


def _arrays(parts: list) -> "ChainArrays":
    """ChainArrays of batches given as `rows()` dicts, in order."""
    def cat(name):
        xs = [p[name] for p in parts]
        return xs[0] if len(xs) == 1 else np.concatenate(xs)

    def ptr(cnt):
        out = np.zeros(len(cnt) + 1, np.int64)
        np.cumsum(cnt, out=out[1:])
        return out

    ch, gr, ins = cat("chains"), cat("groups"), cat("ins")
    cnt = ins[:, 4 + NARGS:]
    data = {k: cat(f"{k}_data") for k in ENTRY_COLS}
    a = ChainArrays(
        ptr(ch[:, 0]), ptr(ch[:, 1]), ch[:, 2].copy(), ch[:, 3].copy(), ch[:, 4].copy(), ch[:, 5].copy(),
        gr[:, 0].copy(), gr[:, 1].copy(), gr[:, 2].copy(), ins[:, 0].copy(), ins[:, 1].copy(),
        ins[:, 2].copy(), ins[:, 3].copy(), ins[:, 4:4 + NARGS].astype(np.int32),
        ptr(cnt[:, 0]), data["p"], ptr(cnt[:, 1]), data["r"].reshape(-1), ptr(cnt[:, 2]),
        data["w"].reshape(-1), ptr(cnt[:, 3]), data["a"], ptr(cnt[:, 4]), data["m"], ptr(cnt[:, 5]),
        data["e"])
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
    args: np.ndarray        # [n, NARGS] int32 (as in the binary)
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

    @property
    def n_chains(self) -> int:
        return len(self.hint)


def encode(chains, reg: Registry) -> ChainArrays:
    """Chain objects, Flat and Rows batches, in order, as one ChainArrays."""
    return _arrays(batch_rows(chains, reg) or [Flat().rows()])


def batch_rows(chains, reg: Registry) -> list:
    """Chain objects, Flat and Rows batches, in order, as a list of `rows()` dicts (consecutive
    Flats and Chains joined into one)."""
    parts, flat = [], Flat()
    for ch in chains:
        if isinstance(ch, Rows):
            if flat.chains:
                parts.append(flat.rows())
                flat = Flat()
            parts.append(ch.rows())
        elif isinstance(ch, Flat):
            flat.extend(ch)
        else:
            flat.add_chain(ch, reg)
    if flat.chains:
        parts.append(flat.rows())
    return parts
