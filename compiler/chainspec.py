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

Lowering builds chains (through `chains.ChainBuilder`) as these objects; `encode` turns a
batch of them into flat integer arrays (CSR for the variable-length parts), with markers, hint
keys and queue groups numbered by a `Registry` that lives as long as one compilation. The
jitted placement (`place_core`) reads only the arrays.
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
    deterministic."""

    def __init__(self):
        self.qgroups: dict[tuple, int] = {}
        self.markers: dict = {}
        self.hints: dict = {}

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


_PAD = [[0] * k for k in range(NARGS + 1)]


def encode(chains, reg: Registry) -> ChainArrays:
    ins_ptr, grp_ptr, hint, hdelta, line, node = [0], [0], [], [], [], []
    g_dir, g_koff, g_w = [], [], []
    qg, off, op, bank, args = [], [], [], [], []
    p_cnt, p_data, r_cnt, r_data, w_cnt, w_data = [], [], [], [], [], []
    a_cnt, a_data, m_cnt, m_data, e_cnt, e_data = [], [], [], [], [], []
    qgroups, markers = reg.qgroups, reg.markers
    for ch in chains:
        for d, koff, w in ch.groups:
            if not -DIAG0 < koff < DIAG0:
                raise AssertionError(f"scheduler: stream offset {koff} out of range (DSL line {ch.line})")
            g_dir.append(d)
            g_koff.append(koff)
            g_w.append(w)
        grp_ptr.append(len(g_dir))
        if ch.hint:
            hint.append(_id(reg.hints, ch.hint[0]))
            hdelta.append(ch.hint[1])
        else:
            hint.append(-1)
            hdelta.append(0)
        line.append(ch.line)
        node.append(ch.node)
        for ins in ch.ins:
            qs = ins.queues
            q = qgroups.get(qs)
            if q is None:
                q = qgroups[qs] = len(qgroups)
            qg.append(q)
            off.append(ins.off)
            op.append(ins.op)
            bank.append(ins.bank)
            a = ins.args
            args.extend(a)
            args.extend(_PAD[NARGS - len(a)])
            p_cnt.append(len(ins.patch))
            for p in ins.patch:
                p_data.extend(p)
            r_cnt.append(len(ins.reads))
            r_data.extend(ins.reads)
            w_cnt.append(len(ins.writes))
            w_data.extend(ins.writes)
            a_cnt.append(len(ins.after))
            for key, dv in ins.after:
                k = markers.get(key)
                if k is None:
                    k = markers[key] = len(markers)
                a_data.append(k)
                a_data.append(dv)
            m_cnt.append(len(ins.mark))
            for key, dv in ins.mark:
                k = markers.get(key)
                if k is None:
                    k = markers[key] = len(markers)
                m_data.append(k)
                m_data.append(dv)
            e_cnt.append(len(ins.extra))
            for eq, eo in ins.extra:
                e_data.append(eq)
                e_data.append(eo)
        ins_ptr.append(len(off))

    def arr(x, cols=0):
        a = np.array(x, np.int64)
        return a.reshape(-1, cols) if cols else a

    def ptr(cnt):
        out = np.zeros(len(cnt) + 1, np.int64)
        np.cumsum(cnt, out=out[1:])
        return out

    return ChainArrays(
        arr(ins_ptr), arr(grp_ptr), arr(hint), arr(hdelta), arr(line), arr(node),
        arr(g_dir), arr(g_koff), arr(g_w), arr(qg), arr(off), arr(op), arr(bank), arr(args, NARGS),
        ptr(p_cnt), arr(p_data, 4), ptr(r_cnt), arr(r_data), ptr(w_cnt), arr(w_data),
        ptr(a_cnt), arr(a_data, 2), ptr(m_cnt), arr(m_data, 2), ptr(e_cnt), arr(e_data, 2))
