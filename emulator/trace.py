"""What a run did, cycle by cycle: the emulator's trace records (`RunResult.trace`, in execution
order) decoded per instruction, written as Chrome trace event JSON (Perfetto, chrome://tracing),
and drawn as a terminal pipeline diagram; `emulator.report` sums them up.

Tracks, one per functional unit in floorplan order west to east, ICU last: per MXM plane p
`MXM p LW` (weight loads), `MXM p` (IW, ABC) and `MXM p ACC`; `SXM h` per hemisphere;
`MEM a-b` per group of MEM_GROUP slices (both ports; groups stay within a hemisphere); `VXM` (all
ALUs); `ICU` (its NOP/REPEAT/SYNC/NOTIFY are not executed instructions, so it stays empty). An
event spans its unit's occupancy: one cycle, or `f16_pair_cycles` for an f16 ABC (half that,
rounded up, for a half ABC), which also holds the odd plane of its pair (drawn `--` in the diagram). Events on one track either
coincide or do not overlap, so timelines nest cleanly in Perfetto.

Per-cycle activity, derived from the executed instructions: MXM MACs (an ABC is lanes^2 MACs, a half ABC half that,
spread over the cycles it holds its planes), SRAM bytes read and written (a MEM access is one
byte plane of `lanes` bytes), and streams in use (distinct (direction, stream) pairs that receive
a new value in the cycle; a w-byte value uses w streams).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from lpu.emulator.run import Trace
from lpu.isa import opcodes as O
from lpu.isa.errors import LpuError
from lpu.isa.machine import MXM_ACC, MXM_CTL, MXM_LW, UNIT_C2C, UNIT_ICU, UNIT_MEM, UNIT_MXM, UNIT_SXM, UNIT_VXM
from lpu.isa.program import Program

MEM_GROUP = 8            # MEM slices per track
MAX_EVENTS = 200_000     # instruction events kept in a Chrome trace
COUNTER_SAMPLES = 5_000  # counter samples per counter track (longer windows are bucketed)

MNEMONIC = {
    "READ": "RD", "WRITE": "WR", "GATHER": "GA", "SCATTER": "SC", "LW": "LW", "IW": "IW", "ABC": "AB",
    "ACC": "AC", "ADD": "+", "SUB": "-", "MUL": "*", "DIV": "/", "MAX": "mx", "MIN": "mn", "NEG": "ng",
    "ABS": "ab", "RELU": "re", "CONV": "cv", "EXP": "ex", "LOG": "lg", "SQRT": "sq", "RSQRT": "rs",
    "TANH": "th", "SIGMOID": "sg", "SILU": "si", "GELU": "ge", "MASK": "mk", "SHIFT": "SH", "ROTATE": "RO",
    "PERMUTE": "PE", "DISTRIBUTE": "DI", "TPIN": "TI", "TPOUT": "TO", "SEND": "SN", "RECV": "RV",
    "LT": "<", "LE": "<=", "GT": ">", "GE": ">=", "EQ": "==", "NE": "!=", "KEEP": "kp", "DROP": "dp",
}
HELD = "--"              # diagram cell: the unit is still held by an earlier instruction


# ---- tracks ---------------------------------------------------------------------------------------
def tracks(m) -> tuple[list, np.ndarray]:
    """([(track name, unit kind name)], track of every queue). An MXM plane has three tracks, one
    per queue role, so that no two events on a track overlap unless they coincide: `MXM p LW`,
    `MXM p` (IW, ABC) and `MXM p ACC`."""
    names, of_queue = [], {}

    def add(name, kind, *keys):
        for k in keys:
            of_queue[k] = len(names)
        names.append((name, kind))

    def mxm(planes):
        for p in planes:
            add(f"MXM {p} LW", "mxm", (UNIT_MXM, p, MXM_LW))
            add(f"MXM {p}", "mxm", (UNIT_MXM, p, MXM_CTL))
            add(f"MXM {p} ACC", "mxm", (UNIT_MXM, p, MXM_ACC))

    def mem(first):   # groups of MEM_GROUP slices, never across hemispheres
        for g0 in range(first, first + n, MEM_GROUP):
            g1 = min(g0 + MEM_GROUP, first + n) - 1
            add(f"MEM {g0}-{g1}" if g1 > g0 else f"MEM {g0}", "mem", *((UNIT_MEM, s) for s in range(g0, g1 + 1)))

    n, half = m.mem_slices_per_hemisphere, m.mxm_planes_per_hemisphere
    mxm(range(half))
    add("SXM 0", "sxm", (UNIT_SXM, 0))
    mem(0)
    add("VXM", "vxm", UNIT_VXM)
    mem(n)
    add("SXM 1", "sxm", (UNIT_SXM, 1))
    mxm(range(half, m.mxm_planes))
    add("ICU", "icu", UNIT_ICU)
    if m.c2c_links:
        add("C2C", "c2c", UNIT_C2C)

    def key(kind, idx, role):
        return {UNIT_MXM: (kind, idx, role), UNIT_MEM: (kind, idx), UNIT_SXM: (kind, idx)}.get(kind, kind)
    return names, np.array([of_queue[key(k, i, r)] for (_, k, i, r, _) in m.queues], np.int32)


# ---- records --------------------------------------------------------------------------------------
@dataclass
class Records:
    """The executed instructions, in the emulator's execution order, decoded."""
    program: Program
    cycles: int          # the run's cycle count
    cycle: np.ndarray    # issue cycle
    src: np.ndarray      # instruction index in the program
    repeat: np.ndarray
    queue: np.ndarray
    op: np.ndarray
    args: np.ndarray     # with REPEAT's field bump applied
    latency: np.ndarray
    busy: np.ndarray     # cycles the instruction holds its unit
    track: np.ndarray
    line: np.ndarray
    track_names: list    # [(name, kind)]

    def __len__(self):
        return len(self.cycle)


def records(program: Program, trace: Trace, cycles: int) -> Records:
    if trace is None:
        raise LpuError("the run kept no trace (run it with trace=True)")
    m = program.machine
    src = np.asarray(trace.index, np.int64)
    rep = np.asarray(trace.repeat, np.int64)
    op = program.op[src].astype(np.int64)
    args = program.args[src].astype(np.int64)
    field = np.array(O.REPEAT_FIELD, np.int64)[op]
    bump = np.flatnonzero((field >= 0) & (rep > 0))
    args[bump, field[bump]] += rep[bump]
    lat = np.array(O.latency_table(m), np.int64)[op]
    busy = np.ones(len(op), np.int64)
    f16_abc = (op == O.ABC) & (args[:, 0] // 256 != O.DT_I8)
    busy[f16_abc] = m.f16_pair_cycles
    half = (op == O.ABC) & (args[:, 3] != 0)
    busy[half] = (busy[half] + 1) // 2
    names, qt = tracks(m)
    queue = program.queue[src].astype(np.int64)
    return Records(program, int(cycles), np.asarray(trace.cycle, np.int64), src, rep, queue, op, args, lat, busy,
                   qt[queue], program.line[src].astype(np.int64), names)


_FIELDS = [tuple(s.fields) for s in O.OPS]


def operands(op: int, args) -> dict:
    """Decoded fields of one instruction: {name: int or 'f16:E3'-style stream operand}."""
    out = {}
    for (name, kind), v in zip(_FIELDS[op], args):
        v = int(v)
        if kind == "ref":
            dt, d, st = O.split_ref(v)
            out[name] = (f"{O.DTYPES[dt]}:" if 0 < dt < len(O.DTYPES) else "") + f"{'EW'[d % 2]}{st}"
        elif kind == "dtype":
            out[name] = O.DTYPES[v] if 0 <= v < len(O.DTYPES) else v
        else:
            out[name] = v
    return out


def _out_refs(r: Records):
    """(execution index, ref) of every stream operand an instruction writes."""
    rows, refs = [], []
    for spec in O.OPS:
        for j, (name, kind) in enumerate(spec.fields):
            if kind == "ref" and name == "out":
                sel = np.flatnonzero(r.op == spec.code)
                rows.append(sel)
                refs.append(r.args[sel, j])
    return np.concatenate(rows), np.concatenate(refs)


def abc_f16(r: Records, sel) -> np.ndarray:
    """Whether the ABCs at `sel` are f16 (they hold a plane pair)."""
    return r.args[sel, 0] // 256 != O.DT_I8


def abc_macs(r: Records, sel) -> np.ndarray:
    """MACs of the ABCs at `sel`: lanes^2, half that for a half ABC."""
    lanes = r.program.machine.lanes
    return np.where(r.args[sel, 3] != 0, lanes * (lanes // 2), lanes * lanes)


def activity(r: Records) -> dict:
    """Per-cycle arrays (length r.cycles): macs, sram_read, sram_written, streams, and busy unit
    capacity per kind (mxm plane-cycles, vxm ALUs, mem bank accesses, sxm queues)."""
    m, n = r.program.machine, r.cycles + 1
    out = {k: np.zeros(n) for k in ("macs", "sram_read", "sram_written", "streams", "mxm", "vxm", "mem", "sxm")}
    abc = np.flatnonzero(r.op == O.ABC)
    for k in range(int(r.busy[abc].max()) if len(abc) else 0):
        sel = abc[r.busy[abc] > k]
        share = abc_macs(r, sel) / r.busy[sel]
        np.add.at(out["macs"], r.cycle[sel] + k, share)
        np.add.at(out["mxm"], r.cycle[sel] + k, np.where(abc_f16(r, sel), 2, 1))
    rd = np.isin(r.op, (O.READ, O.GATHER))
    wr = np.isin(r.op, (O.WRITE, O.SCATTER))
    out["sram_read"] += np.bincount(r.cycle[rd], minlength=n)[:n] * m.lanes
    out["sram_written"] += np.bincount(r.cycle[wr], minlength=n)[:n] * m.lanes
    kind = np.array([k for _, k in r.track_names])[r.track]
    for k in ("vxm", "mem", "sxm"):
        out[k] += np.bincount(r.cycle[kind == k], minlength=n)[:n]
    rows, refs = _out_refs(r)
    if len(rows):
        width = np.array(O.DTYPE_WIDTH + (1,) * 8)[np.minimum(refs // 256, len(O.DTYPE_WIDTH))]
        keys = []
        for b in range(int(width.max())):
            sel = width > b
            t = r.cycle[rows[sel]] + r.latency[rows[sel]]
            keys.append(t * 128 + (refs[sel] // 64 % 2) * 64 + refs[sel] % 64 + b)
        t = np.unique(np.concatenate(keys)) // 128
        out["streams"] += np.bincount(t[t < n], minlength=n)[:n]
    return {k: v[:r.cycles] for k, v in out.items()}


def capacity(m) -> dict:
    return {"mxm": m.mxm_planes, "vxm": m.vxm_alus, "mem": m.mem_slices * m.banks_per_slice,
            "sxm": 2 * m.sxm_queues_per_hemisphere, "streams": 2 * m.streams_per_direction}


# ---- Chrome trace event JSON ----------------------------------------------------------------------
def parse_window(text: str | None, cycles: int | None = None, what: str = "--cycles") -> tuple | None:
    """'A:B' (either side may be empty) -> (A, B), or None for no text."""
    if text is None:
        return None
    a, sep, b = text.partition(":")
    try:
        lo = int(a) if a.strip() else 0
        hi = int(b) if b.strip() else (cycles if cycles is not None else 1 << 62)
    except ValueError:
        lo = hi = None
    if not sep or lo is None or lo < 0 or hi <= lo:
        raise LpuError(f"{what} expects A:B with 0 <= A < B (cycles), got '{text}'")
    return lo, hi


def chrome_trace(r: Records, window=None, max_events: int = MAX_EVENTS) -> tuple[dict, list]:
    """(trace document, notes for stderr): one complete event per executed instruction in the
    window (at most max_events), counter tracks, and thread-name metadata per unit."""
    m, prog = r.program.machine, r.program
    lo, hi = window or (0, r.cycles)
    hi = min(hi, r.cycles)
    notes = []
    sel = np.flatnonzero((r.cycle >= lo) & (r.cycle < hi))
    if window:
        notes.append(f"trace: cycles {lo}:{hi} only ({len(sel):,} of {len(r):,} instructions)")
    if len(sel) > max_events:
        notes.append(f"trace: {len(sel):,} instructions in cycles {lo}:{hi}; kept the first {max_events:,} "
                     f"(through cycle {int(r.cycle[sel[max_events - 1]])}); choose a window with --cycles A:B")
        sel = sel[:max_events]
    us = 1.0 / m.clock_mhz
    pid = 1
    ev = [{"ph": "M", "pid": pid, "name": "process_name",
           "args": {"name": f"LPU {m.name}: {prog.source_name or 'program'}"}}]
    for tid, (name, kind) in enumerate(r.track_names):
        ev.append({"ph": "M", "pid": pid, "tid": tid, "name": "thread_name", "args": {"name": name}})
        ev.append({"ph": "M", "pid": pid, "tid": tid, "name": "thread_sort_index", "args": {"sort_index": tid}})
    qnames = [q[0] for q in m.queues]
    static = {}      # per program instruction: the args that do not change with REPEAT
    cols = zip(*(a[sel].tolist() for a in (r.src, r.op, r.cycle, r.busy, r.latency, r.repeat, r.track, r.queue)),
               r.args[sel].tolist())
    for src, op, cyc, busy, lat, rep, tid, q, a in cols:
        base = static.get(src)
        if base is None:
            line, node = int(prog.line[src]), int(prog.node[src])
            base = static[src] = {"opcode": O.OPS[op].name, "queue": qnames[q], "instruction": src, "line": line}
            if 0 <= node < len(prog.nodes):
                base["ir_op"] = prog.nodes[node][0]
            if prog.source_line(line):
                base["source"] = prog.source_line(line)
        args = dict(base, operands=operands(op, a), cycle=cyc, latency=lat, busy_cycles=busy)
        if rep:
            args["repeat"] = rep
        ev.append({"ph": "X", "pid": pid, "tid": tid, "name": base["opcode"], "cat": r.track_names[tid][1],
                   "ts": cyc * us, "dur": busy * us, "args": args})
    act = activity(r)
    step = max(1, -(-(hi - lo) // COUNTER_SAMPLES))
    if step > 1:
        notes.append(f"trace: counters averaged over buckets of {step} cycles")
    for name, key, unit in (("MXM MACs", "macs", "MACs"), ("SRAM bytes read", "sram_read", "bytes"),
                            ("SRAM bytes written", "sram_written", "bytes"), ("streams in use", "streams", "streams")):
        seg = act[key][lo:hi]
        pad = (-len(seg)) % step
        vals = np.concatenate([seg, np.zeros(pad)]).reshape(-1, step).mean(axis=1)
        prev = None
        for j, v in enumerate(vals):
            v = float(v) if v != int(v) else int(v)
            if v != prev:
                ev.append({"ph": "C", "pid": pid, "name": name, "ts": (lo + j * step) * us, "args": {unit: v}})
                prev = v
        ev.append({"ph": "C", "pid": pid, "name": name, "ts": hi * us, "args": {unit: 0}})
    doc = {"traceEvents": ev, "displayTimeUnit": "ns",
           "otherData": {"program": prog.source_name, "machine": m.name, "clock_mhz": m.clock_mhz,
                         "cycles": r.cycles, "window": [lo, hi], "instructions": len(r)}}
    return doc, notes


# ---- the terminal pipeline diagram ----------------------------------------------------------------
@dataclass
class Cells:
    """Instructions by track, the input of the diagram (from records or from a saved trace)."""
    track_names: list    # [(name, kind)]
    track: np.ndarray
    cycle: np.ndarray
    opname: list
    busy: np.ndarray
    cycles: int
    pair: np.ndarray     # an f16 ABC: it also holds the odd plane of its pair


def cells_of_records(r: Records) -> Cells:
    busy = r.busy.copy()
    pair = (r.op == O.ABC) & (r.args[:, 0] // 256 != O.DT_I8)
    return Cells(r.track_names, r.track, r.cycle, [O.OPS[o].name for o in r.op], busy, r.cycles, pair)


def cells_of_trace(doc: dict, where: str = "trace") -> Cells:
    """Rebuild the diagram's input from a Chrome trace written by `chrome_trace`."""
    evs = doc.get("traceEvents") if isinstance(doc, dict) else None
    if not isinstance(evs, list):
        raise LpuError(f"{where}: not a Chrome trace (no traceEvents list)")
    names = {e["tid"]: e["args"]["name"] for e in evs if e.get("ph") == "M" and e.get("name") == "thread_name"}
    xs = [e for e in evs if e.get("ph") == "X" and "cycle" in e.get("args", {})]
    if not names:
        raise LpuError(f"{where}: no LPU unit tracks (was it written by `lpu run --trace`?)")
    tids = sorted(names)
    pos = {t: i for i, t in enumerate(tids)}
    order = [(names[t], names[t].split(" ")[0].lower()) for t in tids]
    cycles = int(doc.get("otherData", {}).get("cycles", 0)) or (max((e["args"]["cycle"] for e in xs), default=0) + 1)
    return Cells(order, np.array([pos[e["tid"]] for e in xs], np.int64),
                 np.array([e["args"]["cycle"] for e in xs], np.int64),
                 [e["args"].get("opcode", e.get("name", "?")) for e in xs],
                 np.array([e["args"].get("busy_cycles", 1) for e in xs], np.int64), cycles,
                 np.array([e["args"].get("opcode") == "ABC" and
                           not str(e["args"].get("operands", {}).get("inp", "")).startswith("i8:") for e in xs], bool))


def diagram(c: Cells, lo: int, hi: int, kinds=None, pair: bool = True) -> tuple[str, list]:
    """(text, rows): rows are tracks with activity in cycles lo..hi-1 (of the chosen unit kinds),
    a 3-character column per cycle holding the mnemonic of the track's most frequent opcode in
    that cycle ('--': held by an earlier instruction, '.': idle); a cycle ruler every 10."""
    width = hi - lo
    grid = {}
    index = {n: i for i, (n, _) in enumerate(c.track_names)}
    for t, cyc, name, b, f16 in zip(c.track.tolist(), c.cycle.tolist(), c.opname, c.busy.tolist(), c.pair.tolist()):
        if cyc + b <= lo or cyc >= hi:
            continue
        targets = [t]
        if pair and f16:   # an f16 ABC also holds the odd plane of its pair
            words = c.track_names[t][0].split()
            odd = index.get(f"MXM {int(words[1]) + 1}") if len(words) == 2 and words[1].isdigit() else None
            if odd is not None:
                targets.append(odd)
        for k, tt in enumerate(targets):
            row = grid.setdefault(tt, [dict() for _ in range(width)])
            for d in range(b):
                j = cyc + d - lo
                if 0 <= j < width:
                    label = MNEMONIC.get(name, name[:2]) if (d == 0 and k == 0) else HELD
                    row[j][label] = row[j].get(label, 0) + 1
    rows = []
    for t in sorted(grid):
        name, kind = c.track_names[t]
        if kinds and kind not in kinds:
            continue
        cells = []
        for counts in grid[t]:
            real = {k: v for k, v in counts.items() if k != HELD}
            pick = counts if not real else real
            cells.append(max(sorted(pick), key=lambda k: pick[k]) if pick else ".")
        rows.append((name, cells))
    label_w = max([len(n) for n, _ in rows] + [5]) + 2
    ruler = [" "] * (3 * width + 6)
    for cyc in range(lo, hi):
        if cyc % 10 == 0 or cyc == lo:
            s = str(cyc)
            j = 3 * (cyc - lo)
            if all(ch == " " for ch in ruler[max(0, j - 1):j + len(s)]):
                ruler[j:j + len(s)] = s
    lines = ["cycle".ljust(label_w) + "".join(ruler).rstrip()]
    for name, cells in rows:
        lines.append(name.ljust(label_w) + "".join(x.ljust(3) for x in cells).rstrip())
    used = sorted({x for _, cells in rows for x in cells if x not in (".", HELD)})
    back = {v: k for k, v in MNEMONIC.items()}
    if rows:
        lines.append("")
        lines.append("  ".join(f"{x}={back.get(x, x)}" for x in used) + f"  {HELD}=unit held  .=idle")
    else:
        lines.append(f"(no unit is active in cycles {lo}:{hi})")
    return "\n".join(lines) + "\n", rows
