"""Assembly text: `disassemble(program) -> str` and its inverse `assemble(text) -> Program`.

    ; comment
    .machine tiny
    .config {"name": "tiny", ...}              the machine config, one JSON line (optional: without
                                                it, `.machine NAME` loads isa/machines/NAME.toml)
    .cycles 1234                                predicted cycles
    .source "programs/mlp.lpu"
    .param S 32                                 a param as compiled (one line each, sorted by name)
    .srcline 1 x = input f16[4, 64]             source lines, numbered from 1 (JSON-quoted when the
                                                text would not survive verbatim)
    .symbol x input f16 [4,64] slices=8x2:0,1,0,1,... banks=8x2:0*16 addrs=8x2:0..15
    .const w <f2 4x64 BASE64                    data of the symbol just declared (numpy dtype, dims)
    .table 0 15..0                              SXM permutation tables, numbered from 0
    .node 0 matmul 5                            IR nodes: index, op name, source line
    queue mem3.0:
        READ bank=0 addr=17 out=f16:E3  ; line 5 node=0 | y = x @ w

Integer lists are comma-separated items: `v`, `v*n` (v repeated n times), `a..b` (step +-1,
inclusive), `a..b:s` (step s); arrays are written `DIMS:LIST`, DIMS like `4x2` (`-` for 0-d).
Field values by kind (isa/opcodes.py): int as decimal; ref as `dtype:E3` / `W0` (`E3` alone is
raw bytes, dtype i8); dtype by name; f32 as a float (`1.5`, `-inf`) when any ref of the
instruction has a float dtype, else as an integer; `0x3f800000` gives the 32 bits in both.
The instruction comment carries the DSL line (`line N`) and the IR node (`node=K`).
"""
from __future__ import annotations

import base64
import difflib
import json
import re

import numpy as np

from lpu.isa.checks import check_instructions
from lpu.isa.errors import AsmError, ConfigError
from lpu.isa.machine import EAST, MachineConfig
from lpu.isa.opcodes import BY_NAME, DTYPES, FLOAT_DTYPES, NARGS, OPS, make_ref, split_ref
from lpu.isa.program import Program, Symbol

_TOKEN = re.compile(r'"(?:[^"\\]|\\.)*"|[^\s"]+')
_WORD = re.compile(r"[A-Za-z_][\w.\-/]*")
_REF = re.compile(r"(?:(\w+):)?([EW])(\d+)")
_ITEM = re.compile(r"(-?\d+)(?:\*(\d+)|\.\.(-?\d+)(?::(-?\d+))?)?")
_COMMENT = re.compile(r"\s*(?:line\s+(\d+))?\s*(?:node=(-?\d+))?")


# ---- writing -----------------------------------------------------------------------------------
def _word(s: str) -> str:
    return s if _WORD.fullmatch(s) else json.dumps(s)


def _dims(shape) -> str:
    return "x".join(str(int(d)) for d in shape) or "-"


def _seq(values) -> str:
    x = [int(v) for v in np.asarray(values).reshape(-1)]
    out, i, n = [], 0, len(x)
    while i < n:
        j = i + 1
        d = x[j] - x[i] if j < n else 0
        while j < n and x[j] - x[j - 1] == d:
            j += 1
        run = j - i
        if run >= 3 or (run == 2 and d == 0):
            out.append(f"{x[i]}*{run}" if d == 0 else f"{x[i]}..{x[j - 1]}" + ("" if abs(d) == 1 else f":{d}"))
            i = j
        else:
            out.append(str(x[i]))
            i += 1
    return ",".join(out)


def _array(a) -> str:
    return f"{_dims(np.shape(a))}:{_seq(a)}"


def _float_context(op: int, args) -> bool:
    """Whether an instruction computes in f32: one of its refs has a float dtype."""
    return any(kind == "ref" and split_ref(int(args[j]))[0] in FLOAT_DTYPES
               for j, (_, kind) in enumerate(OPS[op].fields))


def _format_value(kind: str, v: int, floats: bool) -> str:
    if kind == "ref":
        dt, d, st = split_ref(v)
        return ("" if dt == 0 else f"{DTYPES[dt]}:") + ("E" if d == EAST else "W") + str(st)
    if kind == "dtype":
        return DTYPES[v]
    if kind == "f32" and floats:
        s = str(np.array(v, np.int32).view(np.float32)[()])
        if _parse_f32(s, True) == v:
            return s
        return f"0x{v & 0xFFFFFFFF:08x}"
    return str(v)


def _source_text(s: str) -> str:
    if s and (s.startswith('"') or not s.isprintable() or s != s.rstrip()):
        return " " + json.dumps(s)
    return " " + s if s else ""


def disassemble(program: Program) -> str:
    """The program as assembly text, exact: `assemble(disassemble(p)) == p`."""
    p, m = program, program.machine
    out = ["; lpu assembly: `lpu asm FILE` turns it back into the same .lpubin",
           f".machine {_word(m.name)}",
           ".config " + json.dumps(m.to_dict(), sort_keys=True),
           f".cycles {int(p.predicted_cycles)}",
           f".source {json.dumps(p.source_name)}"]
    out += [f".param {_word(k)} {int(p.params[k])}" for k in sorted(p.params)]
    out += [f".srcline {i}{_source_text(s)}" for i, s in enumerate(p.source_lines, 1)]
    for s in p.symbols:
        shape = "[" + ",".join(str(int(d)) for d in s.shape) + "]"
        out.append(f".symbol {_word(s.name)} {_word(s.kind)} {_word(s.dtype)} {shape} "
                   + " ".join(f"{a}={_array(getattr(s, a))}" for a in ("slices", "banks", "addrs")))
        if s.data is not None:
            data = np.asarray(s.data, np.asarray(s.data).dtype.newbyteorder("<"), order="C")
            b64 = base64.b64encode(data.tobytes()).decode() or "-"
            out.append(f".const {_word(s.name)} {data.dtype.str} {_dims(data.shape)} {b64}")
    out += [f".table {k} {_seq(row)}" for k, row in enumerate(np.asarray(p.tables))]
    out += [f".node {k} {_word(name)} {int(line)}" for k, (name, line) in enumerate(p.nodes)]
    current = None
    for i in range(p.n_instructions):
        q, op, args = int(p.queue[i]), int(p.op[i]), [int(a) for a in p.args[i]]
        if q != current:
            out.append(f"queue {m.queues[q][0]}:")
            current = q
        floats = _float_context(op, args)
        text = " ".join([OPS[op].name] + [f"{f}={_format_value(kind, args[j], floats)}"
                                          for j, (f, kind) in enumerate(OPS[op].fields)])
        line, node = int(p.line[i]), int(p.node[i])
        notes = ([f"line {line}"] if line else []) + ([f"node={node}"] if node >= 0 else [])
        src = p.source_line(line)
        src = src if src.isprintable() else json.dumps(src)
        if notes:
            text = f"{text:<44} ; " + " ".join(notes) + (f" | {src}" if src else "")
        out.append("    " + text)
    return "\n".join(out) + "\n"


# ---- reading -----------------------------------------------------------------------------------
class _LineError(Exception):
    pass


def _hint(word: str, choices) -> str:
    close = difflib.get_close_matches(word, list(choices), n=1)
    return f" (did you mean '{close[0]}'?)" if close else ""


def _unquote(tok: str) -> str:
    if tok.startswith('"'):
        try:
            return json.loads(tok)
        except json.JSONDecodeError:
            raise _LineError(f"bad quoted string {tok}") from None
    return tok


def _int(tok: str, what: str) -> int:
    try:
        return int(tok, 0)
    except ValueError:
        raise _LineError(f"{what}: expected an integer, got '{tok}'") from None


def _parse_seq(text: str) -> list:
    out = []
    for item in filter(None, text.split(",")):
        m = _ITEM.fullmatch(item)
        if not m:
            raise _LineError(f"bad list item '{item}' (expected v, v*n, a..b or a..b:s)")
        a = int(m[1])
        if m[2] is not None:
            out += [a] * int(m[2])
        elif m[3] is not None:
            b = int(m[3])
            s = int(m[4]) if m[4] is not None else (1 if b >= a else -1)
            if s == 0 or (b - a) % s or (b - a) // s < 0:
                raise _LineError(f"bad range '{item}': {b} is not reached from {a} in steps of {s}")
            out += list(range(a, b + s, s))
        else:
            out.append(a)
    return out


def _parse_dims(text: str) -> tuple:
    if text == "-":
        return ()
    if not re.fullmatch(r"\d+(x\d+)*", text):
        raise _LineError(f"bad dimensions '{text}' (expected e.g. 4x2, or - for 0-d)")
    return tuple(int(d) for d in text.split("x"))


def _parse_array(text: str, what: str) -> np.ndarray:
    dims, _, seq = text.partition(":")
    shape, values = _parse_dims(dims), _parse_seq(seq)
    if len(values) != int(np.prod(shape, dtype=np.int64)):
        raise _LineError(f"{what}: {len(values)} values for dimensions {dims}")
    arr = np.array(values, np.int64).reshape(shape)
    if arr.size and (arr.min() < -2**31 or arr.max() >= 2**31):
        raise _LineError(f"{what}: values must fit in 32 bits")
    return arr.astype(np.int32)


def _parse_f32(tok: str, floats: bool) -> int:
    if re.fullmatch(r"0x[0-9a-fA-F]{1,8}", tok):
        return int(np.array(int(tok, 16), np.uint32).view(np.int32))
    if not floats:
        if not re.fullmatch(r"-?\d+", tok):
            raise _LineError(f"'{tok}' is not an integer (this instruction computes in i32; "
                             "write an integer, or 0x and 8 hex digits)")
        return int(tok)
    try:
        x = float(tok)
    except ValueError:
        raise _LineError(f"'{tok}' is not a number") from None
    with np.errstate(over="ignore"):
        f = np.float32(x)
    if np.isinf(f) and not np.isinf(x):
        raise _LineError(f"{tok} is too large for f32")
    return int(np.array(f).view(np.int32))


def _parse_ref(tok: str) -> int:
    m = _REF.fullmatch(tok)
    if not m:
        raise _LineError(f"bad ref '{tok}' (expected e.g. f16:E3, or W0 for raw bytes)")
    dt = m[1] or DTYPES[0]
    if dt not in DTYPES:
        raise _LineError(f"bad ref '{tok}': unknown dtype '{dt}'{_hint(dt, DTYPES)}")
    return make_ref(DTYPES.index(dt), 0 if m[2] == "E" else 1, int(m[3]))


def _parse_instruction(tokens: list, comment: str):
    spec = BY_NAME.get(tokens[0].upper())
    if spec is None:
        raise _LineError(f"unknown opcode '{tokens[0]}'{_hint(tokens[0].upper(), BY_NAME)}")
    given = {}
    for tok in tokens[1:]:
        key, eq, val = tok.partition("=")
        names = [f for f, _ in spec.fields]
        if not eq:
            raise _LineError(f"expected field=value, got '{tok}'")
        if key not in names:
            fields = ", ".join(names) or "none"
            raise _LineError(f"{spec.name} has no field '{key}'{_hint(key, names)} (fields: {fields})")
        if key in given:
            raise _LineError(f"field '{key}' given twice")
        given[key] = val
    missing = [f for f, _ in spec.fields if f not in given]
    if missing:
        raise _LineError(f"{spec.name} is missing field(s) {', '.join(missing)}")
    args = [0] * NARGS
    for j, (f, kind) in enumerate(spec.fields):
        if kind == "ref":
            args[j] = _parse_ref(given[f])
        elif kind == "dtype":
            if given[f] not in DTYPES:
                raise _LineError(f"unknown dtype '{given[f]}'{_hint(given[f], DTYPES)}")
            args[j] = DTYPES.index(given[f])
        elif kind == "int":
            args[j] = _int(given[f], f"field '{f}'")
    floats = _float_context(spec.code, args)
    for j, (f, kind) in enumerate(spec.fields):
        if kind == "f32":
            try:
                args[j] = _parse_f32(given[f], floats)
            except _LineError as e:
                raise _LineError(f"field '{f}': {e}") from None
    m = _COMMENT.match(comment)
    return spec.code, args, int(m[1]) if m[1] else 0, int(m[2]) if m[2] else -1


class _Assembler:
    def __init__(self):
        self.name = self.config = self.machine = None
        self.n = 0         # the text line being read
        self.machine_line = 1   # where .machine / .config is
        self.queue = None
        self.cycles, self.source, self.srclines, self.params = 0, "", [], {}
        self.symbols, self.tables, self.nodes = [], [], []
        self.rows = []     # (text line, queue, op, args, line, node)

    def need_machine(self):
        """The machine: from .config if given, else isa/machines/NAME.toml (resolved on first use)."""
        if self.machine is None:
            if self.name is None:
                raise _LineError("no .machine directive before this line")
            try:
                self.machine = (MachineConfig.from_dict(self.config, source=".config") if self.config is not None
                                else MachineConfig.load(self.name))
            except ConfigError as e:
                raise _LineError(str(e)) from None
            if self.machine.name != self.name:
                raise _LineError(f".machine {self.name}, but .config describes machine '{self.machine.name}'")
        return self.machine

    def directive(self, line: str):
        word, _, rest = line.partition(" ")
        if word == ".srcline":
            m = re.fullmatch(r"\s*(\d+)(?: (.*))?", rest)
            if not m or int(m[1]) != len(self.srclines) + 1:
                raise _LineError(f".srcline {rest.split(' ')[0]} out of order (expected {len(self.srclines) + 1})")
            text = m[2] or ""
            self.srclines.append(_unquote(text) if text.startswith('"') else text)
            return
        if word == ".config":
            if self.config is not None or self.machine is not None:
                raise _LineError(".config must come once, before the machine is used")
            try:
                self.config, self.machine_line = json.loads(rest), self.n
            except json.JSONDecodeError as e:
                raise _LineError(f".config is not valid JSON: {e}") from None
            return
        toks = []
        for t in _TOKEN.findall(rest):
            if t.startswith(";"):
                break
            toks.append(_unquote(t))
        arity = {".machine": 1, ".cycles": 1, ".source": 1, ".param": 2, ".symbol": 7, ".const": 4, ".table": 2, ".node": 3}
        if word not in arity:
            raise _LineError(f"unknown directive '{word}'{_hint(word, list(arity) + ['.srcline', '.config'])}")
        if len(toks) != arity[word]:
            raise _LineError(f"{word} takes {arity[word]} operand(s), got {len(toks)}")
        if word == ".machine":
            if self.name is not None:
                raise _LineError(f"a second .machine directive (the first named '{self.name}')")
            self.name, self.machine_line = toks[0], self.n
        elif word == ".cycles":
            self.cycles = _int(toks[0], ".cycles")
        elif word == ".source":
            self.source = toks[0]
        elif word == ".param":
            if not toks[0].isidentifier() or toks[0] in self.params:
                raise _LineError(f".param {toks[0]}: not a name, or given twice")
            self.params[toks[0]] = _int(toks[1], ".param")
        elif word == ".symbol":
            self.symbol(toks)
        elif word == ".const":
            self.const(toks)
        elif word == ".table":
            if _int(toks[0], ".table") != len(self.tables):
                raise _LineError(f".table {toks[0]} out of order (expected {len(self.tables)})")
            row = _parse_seq(toks[1])
            lanes = self.need_machine().lanes
            if len(row) != lanes:
                raise _LineError(f".table {toks[0]} has {len(row)} entries, the machine has {lanes} lanes")
            self.tables.append(row)
        else:
            if _int(toks[0], ".node") != len(self.nodes):
                raise _LineError(f".node {toks[0]} out of order (expected {len(self.nodes)})")
            self.nodes.append((toks[1], _int(toks[2], ".node line")))

    def symbol(self, toks):
        name, kind, dtype, shape = toks[:4]
        if dtype not in DTYPES:
            raise _LineError(f"unknown dtype '{dtype}'{_hint(dtype, DTYPES)}")
        if not re.fullmatch(r"\[(\d+(,\d+)*)?\]", shape):
            raise _LineError(f"bad shape '{shape}' (expected e.g. [4,64] or [])")
        lay = {}
        for tok in toks[4:]:
            key, _, val = tok.partition("=")
            if key not in ("slices", "banks", "addrs") or key in lay:
                raise _LineError(f"expected slices=, banks=, addrs=, got '{tok}'")
            lay[key] = _parse_array(val, key)
        self.symbols.append(Symbol(name, kind, dtype, tuple(json.loads(shape)),
                                   lay["slices"], lay["banks"], lay["addrs"]))

    def const(self, toks):
        name, dts, dims, b64 = toks
        if not self.symbols or self.symbols[-1].name != name:
            raise _LineError(f".const {name} must follow .symbol {name}")
        try:
            dt = np.dtype(dts)
            raw = base64.b64decode("" if b64 == "-" else b64, validate=True)
        except (TypeError, ValueError) as e:
            raise _LineError(f".const {name}: {e}") from None
        if dt.kind not in "biufc":
            raise _LineError(f".const {name}: dtype {dts} is not numeric")
        shape = _parse_dims(dims)
        if len(raw) != int(np.prod(shape, dtype=np.int64)) * dt.itemsize:
            raise _LineError(f".const {name}: {len(raw)} bytes of data for {dims} x {dts}")
        self.symbols[-1].data = np.frombuffer(raw, dt).reshape(shape).copy()

    def line(self, line: str):
        code, _, comment = line.partition(";")
        code = code.strip()
        if not code:
            return
        if code.startswith("."):
            return self.directive(line.strip())
        if code.startswith("queue"):
            m = re.fullmatch(r"queue\s+(\S+?)\s*:", code)
            if not m:
                raise _LineError("expected 'queue NAME:'")
            qs = self.need_machine().queue_index
            if m[1] not in qs:
                raise _LineError(f"unknown queue '{m[1]}'{_hint(m[1], qs)} on machine '{self.name}'")
            self.queue = qs[m[1]]
            return
        if self.queue is None:
            raise _LineError("instruction outside a queue section (write 'queue NAME:' first)")
        self.rows.append((self.n, self.queue) + _parse_instruction(code.split(), comment))


def assemble(text: str, name: str = "<asm>") -> Program:
    """The Program in assembly text. Errors are AsmError('name:line: message'), all of them."""
    a, errors = _Assembler(), []
    for n, line in enumerate(text.split("\n"), 1):
        line = line.rstrip("\r")
        a.n = n
        try:
            if line.lstrip().startswith(".srcline"):
                a.directive(line.strip())
            elif not line.lstrip().startswith("#"):
                a.line(line)
        except _LineError as e:
            errors.append(f"{name}:{n}: {e}")
    if not errors:
        try:
            a.need_machine()
        except _LineError as e:
            errors.append(f"{name}:{a.machine_line}: {e}")
    if not errors:
        rows = a.rows
        cols = [np.array([r[k] for r in rows], np.int64).reshape((len(rows), NARGS) if k == 3 else (len(rows),))
                for k in range(1, 6)]
        bad = check_instructions(a.machine, cols[0], cols[1], cols[2], cols[3], cols[4], len(a.nodes))
        if bad:
            errors.append(f"{name}:{rows[bad[0]][0]}: {bad[1]}")
    if errors:
        raise AsmError("\n".join(errors[:20]) + (f"\n... and {len(errors) - 20} more" if len(errors) > 20 else ""),
                       errors=errors)
    queue, op, args, line, node = (c.astype(np.int32) for c in cols)
    tables = np.array(a.tables, np.int32).reshape(len(a.tables), a.machine.lanes)
    return Program(a.machine, queue, op, args, line, node, symbols=a.symbols, tables=tables, nodes=a.nodes,
                   predicted_cycles=a.cycles, source_name=a.source, source_lines=a.srclines, params=a.params)
