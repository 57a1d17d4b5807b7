"""What the emulator derives from a program once, before its first run, and keeps with it:
the expanded and sorted schedule (emulator/run.py `schedule`), the dispatch columns of the
jitted core (unit and core operation of every executed instruction, read from the opcode
table's unit and name, never from numeric opcode ranges), the unit index and position of every
instruction, and the compact SRAM layout.

Compact SRAM: only the addresses a program can touch are emulated. Per (slice, bank) the range
of addresses its symbols and MEM instructions use (GATHER/SCATTER: addr .. addr + 255, the reach
of a one-byte index) becomes one block of rows of a uint8[rows, lanes] array; address a of the
pair is row `bank_base[s, b] + a - bank_lo[s, b]`. An address outside the machine's range is
still reported as a hazard by the core when its instruction executes.

A program that runs many times (decode steps, sweeps) pays this once: the result is cached on
the `Program` object, keyed by the identity of its instruction columns, tables, symbols and
machine (a mutated copy made with dataclasses.replace and new arrays is prepared afresh).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from lpu.emulator import core, prepare_core
from lpu.isa import opcodes as O
from lpu.isa.errors import LpuError
from lpu.isa.machine import UNIT_ICU, UNIT_MEM, UNIT_NAMES
from lpu.isa.program import Program, Symbol, vector_grid

MISSING = -2          # an opcode of the table the core does not implement
LOADED_KINDS = ("input", "weight", "state", "const")
INDEX_REACH = 256     # GATHER/SCATTER index: one unsigned byte


def dispatch_table(ops=O.OPS, core_ops=core.CORE_OPS, core_units=core.CORE_UNIT_OF):
    """(core operation, core unit) of every opcode of `ops`, matched by name, the unit taken from
    the table: -1 for ICU markers, MISSING where the core has no operation of that name or
    implements it on another unit."""
    cop = np.full(len(ops), -1, np.int64)
    cunit = np.full(len(ops), -1, np.int64)
    for code, s in enumerate(ops):
        if s.unit == UNIT_ICU:
            continue
        unit = core.UNIT_CODE[UNIT_NAMES[s.unit]]
        cunit[code] = unit
        ok = s.name in core_ops and core_units.get(s.name) == unit
        cop[code] = core_ops.index(s.name) if ok else MISSING
    return cop, cunit


def refuse_missing(program: Program, ops, cop, used_ops) -> None:
    bad = [int(o) for o in np.unique(used_ops) if cop[o] == MISSING]
    if bad:
        s = ops[bad[0]]
        raise LpuError(f"bad program: opcode {s.name} ({UNIT_NAMES[s.unit].upper()} unit) has no implementation in "
                       f"the emulator (the opcode table and emulator/core.py disagree)")


@dataclass
class Prepared:
    sched: object          # run.Schedule
    meta: np.ndarray       # int64 [n]: cop, cunit, uidx, upos and latency packed (core.pack_meta), what the core reads
    bank_base: np.ndarray  # int64 [slices, banks]: first row of the pair's block (-1 unused)
    bank_lo: np.ndarray    # int64 [slices, banks]: address of that row
    nrows: int
    sym_rows: dict         # symbol name -> int64 [nvec, width] rows
    valid0: np.ndarray     # uint8 [max(nrows, 1)]: the core's row flags (`valid`) at cycle 0, copied by each run
    unloaded_rows: np.ndarray  # the other rows a GATHER/SCATTER reaches (cleared before a run: `indexed_reach`)
    tables: np.ndarray
    ring_size: int
    workspace: tuple | None = None   # the core's unit state, kept between runs (emulator/core.py)
    mem: np.ndarray | None = None    # the compact SRAM image, kept between runs (run.load)
    last_valid: np.ndarray | None = None  # the row flags the last run ended with (None: it failed; run.run's resident)
    runs: int = 0                    # runs made on `mem` (a resident run's states are read from it lazily)

    # The fields packed in `meta`, unpacked when asked (kept only packed: 4 x 8 bytes an executed
    # instruction, 157 MB on bert_base's 12 layers).
    @property
    def cop(self) -> np.ndarray:         # core operation
        return self.meta & core.M_MASK

    @property
    def cunit(self) -> np.ndarray:       # core unit
        return (self.meta >> core.M_UNIT) & core.M_MASK

    @property
    def uidx(self) -> np.ndarray:        # index of the unit (slice, plane, hemisphere)
        return (self.meta >> core.M_UIDX) & core.M_MASK

    @property
    def upos(self) -> np.ndarray:        # floorplan position of the unit
        return (self.meta >> core.M_UPOS) & core.M_MASK


def symbol_planes(sym: Symbol, m) -> tuple:
    """(rows, chunks, cols) and the (slice, bank, addr) arrays [nvec, width] of every byte plane."""
    rows, chunks, cols = vector_grid(tuple(sym.shape), m.lanes)
    nvec = rows * chunks
    idx = []
    for a, hi in (("slices", m.mem_slices), ("banks", m.banks_per_slice), ("addrs", m.addresses_per_bank)):
        v = np.asarray(getattr(sym, a))
        if v.shape != (nvec, sym.width):
            raise LpuError(f"tensor '{sym.name}': layout '{a}' has shape {v.shape}, expected {(nvec, sym.width)}")
        if v.size and (v.min() < 0 or v.max() >= hi):
            raise LpuError(f"tensor '{sym.name}': layout '{a}' out of range 0..{hi - 1}")
        idx.append(v.astype(np.int64))
    return (rows, chunks, cols), tuple(idx)


def _layout(program: Program, s, uidx):
    """Compact SRAM blocks: bank_base, bank_lo, number of rows, rows of every symbol."""
    m = program.machine
    nb, na = m.banks_per_slice, m.addresses_per_bank
    lo = np.full(m.mem_slices * nb, na, np.int64)
    hi = np.full(m.mem_slices * nb, -1, np.int64)
    planes = {}
    for sym in program.symbols:
        _, (sl, bk, ad) = symbol_planes(sym, m)
        planes[sym.name] = (sl, bk, ad)
        np.minimum.at(lo, (sl * nb + bk).ravel(), ad.ravel())
        np.maximum.at(hi, (sl * nb + bk).ravel(), ad.ravel())
    mem = np.flatnonzero(O_UNIT[s.op] == UNIT_MEM)
    bank, addr = s.args[mem, 0], s.args[mem, 1]
    ok = (bank >= 0) & (bank < nb) & (addr >= 0) & (addr < na)
    mem, bank, addr = mem[ok], bank[ok], addr[ok]
    pair = uidx[mem] * nb + bank
    indexed = np.isin(s.op[mem], (O.GATHER, O.SCATTER))
    np.minimum.at(lo, pair, addr)
    np.maximum.at(hi, pair, np.where(indexed, np.minimum(addr + INDEX_REACH - 1, na - 1), addr))
    size = np.where(hi >= lo, hi - lo + 1, 0)
    base = np.where(size > 0, np.cumsum(size) - size, -1)
    sym_rows = {name: base[sl * nb + bk] + ad - lo[sl * nb + bk] for name, (sl, bk, ad) in planes.items()}
    return base.reshape(m.mem_slices, nb), lo.reshape(m.mem_slices, nb), int(size.sum()), sym_rows


O_UNIT = np.array([s.unit for s in O.OPS], np.int64)


def by_reference(s, uidx, base, lo, m, ring_size, nrows) -> np.ndarray:
    """The READs whose value the core may put on its stream as a reference to the SRAM row
    (core.C_READ_REF) instead of a copy: those whose row no WRITE (same row) or SCATTER (same
    slice and bank, an address it can reach) can change from the READ's cycle until its value
    has left the stream (the READ's cycle + latency + ring size, more than any diagonal stays
    readable). Every reader then copies the bytes the READ would have copied."""
    safe = prepare_core.safe_reads(s.cycle, s.op, s.args, s.latency, uidx, O_UNIT == UNIT_MEM, O.READ, O.WRITE,
                                   O.SCATTER, base.ravel(), lo.ravel(), m.banks_per_slice, m.addresses_per_bank,
                                   INDEX_REACH, ring_size, nrows)
    return np.flatnonzero(safe)


def indexed_reach(s, uidx, base, lo, m, nrows) -> np.ndarray:
    """bool[nrows]: the rows a GATHER or SCATTER can reach (its address + 0 .. INDEX_REACH - 1).
    These are the only rows whose old bytes a run can see: a GATHER reads lanes without a
    value check, a SCATTER writes some lanes of a row and marks it written; a READ of a row
    without a value is a hazard (`valid`) and a WRITE writes the whole row. So these, and the
    loaded tensors' rows, which run.load writes, are all a run has to clear."""
    nb, na = m.banks_per_slice, m.addresses_per_bank
    g = np.flatnonzero(np.isin(s.op, (O.GATHER, O.SCATTER)))
    bank, addr = s.args[g, 0], s.args[g, 1]
    ok = (bank >= 0) & (bank < nb) & (addr >= 0) & (addr < na)
    g, bank, addr = g[ok], bank[ok], addr[ok]
    pair = uidx[g] * nb + bank
    start = base.ravel()[pair] + addr - lo.ravel()[pair]
    edge = np.zeros(nrows + 1, np.int64)
    np.add.at(edge, start, 1)
    np.add.at(edge, start + np.minimum(addr + INDEX_REACH, na) - addr, -1)
    return np.cumsum(edge[:nrows]) > 0


def prepare(program: Program, schedule) -> Prepared:
    """The cached preparation of `program` (made on first use; `schedule` is run.schedule)."""
    key = (program.queue, program.op, program.args, program.tables, program.symbols, program.machine)
    hit = program.__dict__.get("_emulator_prepared")
    if hit is not None and len(hit[0]) == len(key) and all(a is b for a, b in zip(hit[0], key)):
        return hit[1]
    m = program.machine
    s = schedule(program)
    cop, cunit = dispatch_table()
    refuse_missing(program, O.OPS, cop, s.op)
    tables = np.ascontiguousarray(program.tables, np.int64)
    if tables.ndim != 2 or tables.shape[1] != m.lanes:
        raise LpuError(f"bad program: SXM tables have shape {tables.shape}, expected [n, {m.lanes}]")
    qidx = np.array([q[2] for q in m.queues], np.int64)
    qpos = np.array([q[4] for q in m.queues], np.int64)
    uidx, upos = qidx[s.queue], qpos[s.queue]
    base, lo, nrows, sym_rows = _layout(program, s, uidx)
    loaded = [sym_rows[y.name].ravel() for y in program.symbols if y.kind in LOADED_KINDS]
    # A stream ring's slot holds diagonal k until diagonal k + ring_size takes it, written by an
    # instruction issued at cycle >= k + ring_size - (positions - 1) - max latency: after the last
    # cycle k can be read (k + positions - 1 eastward, k westward) when ring_size >= positions +
    # max latency. (Twice that, as before, doubled the rings' memory and their cache misses.)
    ring_size = 64
    while ring_size < m.n_positions + max(m.latency.values()):
        ring_size *= 2
    loaded = np.concatenate(loaded) if loaded else np.zeros(0, np.int64)
    valid0 = np.zeros(max(nrows, 1), np.uint8)
    valid0[loaded] = 1
    for y in program.symbols:
        if y.kind in ("input", "weight", "const"):
            valid0[sym_rows[y.name]] = core.RO_LOADED
    free = indexed_reach(s, uidx, base, lo, m, max(nrows, 1))  # (a mask: setdiff1d hashes every row, seconds on a
    free[loaded] = False                                        # large chip)
    unloaded = np.flatnonzero(free).astype(np.int64)
    cop_i = cop[s.op]
    cop_i[by_reference(s, uidx, base, lo, m, ring_size, nrows)] = core.C_READ_REF
    meta = core.pack_meta(cop_i, cunit[s.op], uidx, upos, s.latency)
    prep = Prepared(s, meta, base, lo, nrows, sym_rows, valid0, unloaded, tables, ring_size)
    program.__dict__["_emulator_prepared"] = (key, prep)
    return prep
