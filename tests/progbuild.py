"""Hand-building `Program`s for tests: instructions placed at target issue cycles per queue (the
NOP padding is computed), tensors laid out at consecutive addresses, stream timing helpers."""
from __future__ import annotations

import numpy as np

from lpu.emulator.run import schedule
from lpu.isa import opcodes as O
from lpu.isa.errors import LpuError
from lpu.isa.machine import EAST
from lpu.isa.program import Program, Symbol, empty_columns, vector_grid


def ref(dtype: str, direction: int, stream: int) -> int:
    return O.make_ref(O.DTYPE_CODE[dtype], direction, stream)


class ProgBuilder:
    def __init__(self, machine, source_lines=()):
        self.m = machine
        self.code = {}      # queue id -> [(op, args, line)]
        self.time = {}      # queue id -> next issue cycle
        self.symbols = []
        self.tables = []
        self.source_lines = list(source_lines)

    # ---- instructions ----------------------------------------------------------------------
    def at(self, cycle: int, queue: str, opname: str, *args, line: int = 0):
        """Issue `opname` on `queue` at `cycle` (NOP-padded from the queue's last instruction)."""
        q = self.m.queue_index[queue]
        now = self.time.get(q, 0)
        if cycle < now:
            raise ValueError(f"{queue}: cycle {cycle} is before the queue's next free cycle {now}")
        if cycle > now:
            self.raw(queue, "NOP", cycle - now)
        self.raw(queue, opname, *args, line=line)

    def raw(self, queue: str, opname: str, *args, line: int = 0):
        """Append an instruction as is; the queue's time advances by its issue duration."""
        q = self.m.queue_index[queue]
        op = O.BY_NAME[opname].code
        self.code.setdefault(q, []).append((op, args, line))
        if op == O.NOP:
            dur = args[0]
        elif op == O.REPEAT:
            dur = args[0] * args[1]
        else:
            dur = 0 if op in (O.SYNC, O.NOTIFY) else 1
        self.time[q] = self.time.get(q, 0) + dur

    # ---- stream timing -----------------------------------------------------------------------
    def issue_for(self, diag: int, direction: int, pos: int, latency: int = 0) -> int:
        """Issue cycle at which a unit at `pos` reads (latency 0) or writes `diag`."""
        return (diag + pos if direction == EAST else diag - pos) - latency

    def diag(self, cycle: int, direction: int, pos: int) -> int:
        return cycle - pos if direction == EAST else cycle + pos

    def read_vec(self, sym: Symbol, v: int, direction: int, stream: int, diag: int, port: int = 0, line: int = 0,
                 n: int = 1, d: int = 1):
        """READ every byte plane of vector v of sym onto stream+b, all on `diag`; with n > 1, also
        vectors v+1 .. v+n-1 (consecutive addresses) on diagonals diag+d, diag+2d, ... (REPEAT)."""
        lat = self.m.latency["mem_read"]
        for b in range(sym.width):
            s = int(sym.slices[v, b])
            t = self.issue_for(diag, direction, self.m.slice_pos(s), lat)
            self.at(t, f"mem{s}.{port}", "READ", int(sym.banks[v, b]), int(sym.addrs[v, b]),
                    ref("i8", direction, stream + b), line=line)
            if n > 1:
                self.raw(f"mem{s}.{port}", "REPEAT", n - 1, d)

    def write_vec(self, sym: Symbol, v: int, direction: int, stream: int, diag: int, port: int = 0, line: int = 0,
                  n: int = 1, d: int = 1):
        """WRITE vector v of sym from stream+b (byte plane b), all on `diag` (n, d: as read_vec)."""
        for b in range(sym.width):
            s = int(sym.slices[v, b])
            t = self.issue_for(diag, direction, self.m.slice_pos(s))
            self.at(t, f"mem{s}.{port}", "WRITE", int(sym.banks[v, b]), int(sym.addrs[v, b]),
                    ref("i8", direction, stream + b), line=line)
            if n > 1:
                self.raw(f"mem{s}.{port}", "REPEAT", n - 1, d)

    # ---- tensors and tables --------------------------------------------------------------------
    def tensor(self, name, kind, dtype, shape, slices, bank=0, addr=0, data=None) -> Symbol:
        """Vector v's byte plane b at (slices[b], bank, addr + v)."""
        rows, chunks, _ = vector_grid(tuple(shape), self.m.lanes)
        nvec, w = rows * chunks, O.dtype_width(dtype)
        sym = Symbol(name, kind, dtype, tuple(shape),
                     np.tile(np.asarray(slices[:w], np.int32), (nvec, 1)),
                     np.full((nvec, w), bank, np.int32),
                     np.repeat(np.arange(addr, addr + nvec, dtype=np.int32)[:, None], w, axis=1), data)
        self.symbols.append(sym)
        return sym

    def table(self, entries) -> int:
        self.tables.append(np.asarray(entries, np.int32))
        return len(self.tables) - 1

    def build(self) -> Program:
        rows = [(q, op, args, line) for q in sorted(self.code) for op, args, line in self.code[q]]
        queue, op, args, line, node = empty_columns(len(rows))
        for i, (q, o, a, ln) in enumerate(rows):
            queue[i], op[i], line[i] = q, o, ln
            args[i, :len(a)] = a
        tables = np.stack(self.tables) if self.tables else None
        p = Program(self.m, queue, op, args, line, node, symbols=list(self.symbols), tables=tables,
                    source_lines=self.source_lines)
        try:   # the cycle count a compiler would record (emulator/run.py checks it)
            s = schedule(p)
            p.predicted_cycles = s.cycles + self.m.icu_skew if len(s.cycle) else 0
        except LpuError:
            pass   # a malformed program, built to be refused
        return p
