"""Fuzz cases for the `lpu` command: programs, binaries, machine configs and .npz inputs, each made
from a seed (a `random.Random`) by mutating a corpus (the bundled programs at small sizes, their
binaries, the machine files) or by building an adversarial input (deep nesting, huge literals,
loops, sizes, special characters and paths). Shared by the quick Hypothesis tests
(tests/test_fuzz_cli.py) and the long run (tests/fuzz/long.py, docs/fuzzing.md)."""
from __future__ import annotations

import dataclasses
import glob
import io
import os
import re
import struct
import zipfile
import zlib
from functools import lru_cache

import numpy as np

from lpu.isa import opcodes as O
from lpu.isa.encoding import FORMAT_VERSION, MAGIC, encode
from lpu.isa.machine import MACHINES_DIR, MachineConfig
from lpu.isa.program import Symbol

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SMALL = {"L": 1, "D": 32, "H": 2, "T": 3, "C": 8, "S": 8, "F": 64}
INTERESTING = [0, 1, 2, 3, -1, -2, 7, 8, 15, 16, 255, 256, 4095, 4096, 65535, 65536, 2**24, 2**31 - 1, -2**31]
TOKENS = ["param", "input", "weight", "state", "output", "fn", "for", "in", "return", "f16", "f32", "i8", "i32",
          "x", "w", "S", "D", "layernorm", "softmax", "exp", "concat", "reshape", "sum", "axis", "0", "1", "7",
          "1.5", "(", ")", "[", "]", "{", "}", ",", ":", "=", "..", "<-", "+", "-", "*", "/", "@", "%", ".T",
          ";", "\n", "99999999999999999999", "1e999", "\x0c", "\x0b", "\x1c", "\x85", "\u2028", "\t", "\r"]
TOKEN = re.compile(r"[A-Za-z_][A-Za-z_0-9]*|\d+\.\d*|\d+|\.\.|<-|\S")


def small(text: str) -> str:
    """A bundled program with its integer params set to small sizes (so it fits `tiny`)."""
    return re.sub(r"(?m)^param (\w+) = (\d+)\s*$",
                  lambda m: f"param {m.group(1)} = {SMALL.get(m.group(1), m.group(2))}", text)


@lru_cache(maxsize=1)
def programs() -> dict[str, str]:
    return {os.path.basename(p): small(open(p).read()) for p in sorted(glob.glob(os.path.join(ROOT, "programs", "*.lpu")))}


@lru_cache(maxsize=1)
def machine_tomls() -> dict[str, str]:
    return {os.path.basename(p): open(p).read() for p in sorted(glob.glob(os.path.join(MACHINES_DIR, "*.toml")))}


# ---- programs --------------------------------------------------------------------------------
def _mutate_text(rng, text: str) -> str:
    for _ in range(rng.randint(1, 4)):
        spans = [m.span() for m in TOKEN.finditer(text)] or [(0, 0)]
        a, b = rng.choice(spans)
        c, d = rng.choice(spans)
        kind = rng.randrange(7)
        if kind == 0:
            text = text[:a] + text[b:]
        elif kind == 1:
            text = text[:a] + rng.choice(TOKENS) + text[b:]
        elif kind == 2:
            text = text[:a] + rng.choice(TOKENS) + " " + text[a:]
        elif kind == 3:
            text = text[:a] + text[c:d] + text[b:]
        elif kind == 4:
            i = rng.randrange(len(text) + 1)
            text = text[:i] + chr(rng.choice([rng.randrange(32, 127), rng.randrange(0, 32), rng.randrange(0x80, 0x3000)])) + text[i:]
        elif kind == 5:
            text = text[:rng.randrange(len(text) + 1)]
        else:   # a number made extreme
            nums = [m.span() for m in re.finditer(r"\d+", text)]
            if nums:
                a, b = rng.choice(nums)
                text = text[:a] + str(rng.choice([0, 10**6, 10**12, 10**100, 2**63, 2**31])) + text[b:]
    return text


HEAD = "input x : f32[4, 16]\n"


def adversarial_program(rng) -> str:
    n = rng.choice([10, 100, 300, 501, 1000, 3000])
    kind = rng.randrange(14)
    if kind == 0:
        return HEAD + "output y = " + " + ".join(["x"] * n) + "\n"
    if kind == 1:
        return HEAD + "output y = " + "exp(" * n + "x" + ")" * n + "\n"
    if kind == 2:
        return HEAD + "output y = " + "-" * n + "x\n"
    if kind == 3:
        fns = "".join(f"fn g{i}(a) {{ return g{i + 1}(a) }}\n" for i in range(n))
        return HEAD + fns + f"fn g{n}(a) {{ return a }}\noutput y = g0(x)\n"
    if kind == 4:
        return HEAD + f"param P = {'9' * rng.choice([19, 20, 400, 4301, 10000])}\noutput x\n"
    if kind == 5:
        return HEAD + f"param P = {rng.choice(['10', '2', '1000'])}" + " * 10" * rng.choice([10, 30, 100]) + \
            "\ninput z : f32[4, P]\noutput y = z + z\n"
    if kind == 6:
        return HEAD + f"for i in 0..{rng.choice([10**5 + 1, 10**6, 10**8, 2**62])} {{ y = x }}\noutput y\n"
    if kind == 7:
        return HEAD + f"for i in 0..{rng.choice([300, 3000])} {{ for j in 0..{rng.choice([300, 3000])} {{ y = x + x }} }}\noutput y\n"
    if kind == 8:
        return HEAD + f"z = [x for i in 0..{rng.choice([10**4, 10**5 + 1, 10**7])}]\noutput x\n"
    if kind == 9:
        return HEAD + "".join(f"a{i} = b{i}\n" for i in range(rng.choice([100, 3000, 10000]))) + "output x\n"
    if kind == 10:
        sep = rng.choice(["\x0c", "\x0b", "\x1c", "\x85", "\u2028", "\r", "\t"])
        return HEAD.replace("\n", sep + "\n") + "y = x + zz" + sep + "\noutput y\n"
    if kind == 11:
        return f"input x : f32[{rng.choice([2**31, 2**40, 65536 * 32768, 10**100])}, 4]\noutput y = x + x\n"
    if kind == 12:
        return HEAD + f"output y = reshape(x, [{2**62}, {2**62}, 0])\n"
    z = 10
    return HEAD + f"z = {z}\nfor i in 0..{rng.choice([10, 64, 100])} {{ z = z * z }}\noutput x\n"


def program_case(rng) -> tuple[str, str]:
    """(corpus name, text) of a fuzzed program."""
    if rng.random() < 0.25:
        return "adversarial.lpu", adversarial_program(rng)
    name = rng.choice(sorted(programs()))
    return name, _mutate_text(rng, programs()[name])


# ---- binaries --------------------------------------------------------------------------------
@lru_cache(maxsize=4)
def compiled(name: str):
    from lpu.compiler.driver import compile_source
    prog, _ = compile_source(programs()[name], name, {}, MachineConfig.load("tiny"))
    return prog


BINARY_CORPUS = ("mlp.lpu", "attention_decode.lpu", "matmul.lpu", "llama_block_decode.lpu")


def reseal(body: bytes) -> bytes:
    """A preamble with the right length and a correct checksum around `body` (the sections)."""
    head = MAGIC + struct.pack("<HI", FORMAT_VERSION, len(body) + 4)
    return head + body + struct.pack("<I", zlib.crc32(head + body))


def _byte_mutation(rng, data: bytes) -> bytes:
    body = bytearray(data[len(MAGIC) + 6:-4])
    for _ in range(rng.randint(1, 4)):
        i = rng.randrange(len(body))
        kind = rng.randrange(5)
        if kind == 0:
            body[i] ^= 1 << rng.randrange(8)
        elif kind == 1:
            body[i] = rng.choice([0, 1, 0x7F, 0x80, 0xFF])
        elif kind == 2:
            del body[i:i + rng.randint(1, 16)]
        elif kind == 3:
            body[i:i] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 8)))
        else:
            body[i:i + 4] = struct.pack("<i", rng.choice(INTERESTING))
    return reseal(bytes(body))


def _copy(p, **kw):
    cols = {k: getattr(p, k).copy() for k in ("queue", "op", "args", "line", "node")}
    cols.update(kw)
    return dataclasses.replace(p, symbols=[dataclasses.replace(s) for s in p.symbols], tables=p.tables.copy(), **cols)


def _program_mutation(rng, p):
    """A Program with one field, instruction timing, symbol or table changed."""
    from tests.property import mutate as M
    q = _copy(p)
    kind = rng.randrange(8)
    n = len(q.op)
    if kind == 0:      # one instruction a cycle early or late
        movable = [(i, d) for i in rng.sample(range(n), min(n, 50)) for d in (-1, 1)
                   if O.OPS[int(q.op[i])].unit != 0 and M.can_move(q, i, d)]
        if movable:
            return M.move(q, *rng.choice(movable))
    if kind <= 1:      # one field of one instruction
        i = rng.randrange(n)
        nf = len(O.OPS[int(q.op[i])].fields)
        if nf:
            j = rng.randrange(nf)
            q.args[i, j] = rng.choice([q.args[i, j] + rng.choice([-1, 1]), rng.choice(INTERESTING)])
        return q
    if kind == 2:      # a NOP's count, or a NOP made a REPEAT (the compiler emits none)
        nops = np.flatnonzero(q.op == O.NOP)
        if len(nops):
            i = int(rng.choice(nops))
            if rng.random() < 0.5:
                q.op[i] = O.REPEAT
                q.args[i, 1] = rng.choice([1, 1, 2, 0, 2**20])
            q.args[i, 0] = rng.choice([0, 1, 2, 2**20, 2**31 - 1, -1])
        return q
    if kind == 3:      # a symbol's shape
        s = rng.choice(q.symbols)
        shape = list(s.shape) or [1]
        shape[rng.randrange(len(shape))] = rng.choice([1, 2, 3, 17, 65536, 32768, 2**31 - 1])
        s.shape = tuple(shape) if rng.random() < 0.8 else tuple(shape) + (2,)
        return q
    if kind == 4:      # a symbol's layout
        s = rng.choice(q.symbols)
        a = rng.choice(["slices", "banks", "addrs"])
        v = np.asarray(getattr(s, a)).copy()
        if rng.random() < 0.5 and v.size:
            v.reshape(-1)[rng.randrange(v.size)] = rng.choice([-1, 2, 16, 4095, 4096, 2**20])
        else:
            v = v[:max(0, len(v) - 1)] if rng.random() < 0.5 else np.concatenate([v, v[:1]])
        setattr(s, a, v.astype(np.int32))
        return q
    if kind == 5:      # a constant's data
        consts = [s for s in q.symbols if s.kind == "const"]
        if consts:
            s = rng.choice(consts)
            d = np.asarray(s.data)
            s.data = rng.choice([d.reshape(-1)[:max(d.size - 1, 0)], np.concatenate([d.reshape(-1), d.reshape(-1)]),
                                 d.astype(np.float64), None])
        return q
    if kind == 6:      # the permutation tables
        t = q.tables.copy()
        if t.size and rng.random() < 0.6:
            t.reshape(-1)[rng.randrange(t.size)] = rng.choice([-1, 16, 2**20, -2**31])
        else:
            t = t[:max(0, len(t) - 1)]
        return dataclasses.replace(q, tables=t.astype(np.int32))
    return dataclasses.replace(q, predicted_cycles=q.predicted_cycles + rng.choice([-1, 1, 10**9]))


def binary_case(rng) -> bytes:
    """The bytes of a mutated binary of a small bundled program compiled for `tiny`."""
    p = compiled(rng.choice(BINARY_CORPUS))
    if rng.random() < 0.4:
        return _byte_mutation(rng, encode(p))
    q = _program_mutation(rng, p)
    try:
        return encode(q)
    except Exception:       # noqa: BLE001 - the encoder refuses some mutations; mutate bytes instead
        return _byte_mutation(rng, encode(p))


def hand_binary(symbols: list[Symbol] | None = None, **kw) -> bytes:
    """Helper for regression cases: the mlp binary with some parts replaced."""
    p = _copy(compiled("mlp.lpu"))
    if symbols is not None:
        p = dataclasses.replace(p, symbols=symbols)
    return encode(dataclasses.replace(p, **kw))


# ---- machine configs ------------------------------------------------------------------------
CONFIG_VALUES = [0, 1, 2, 3, 4, 5, 7, 8, 9, 63, 64, 65, 2**24, 2**24 + 1, 2**31, 2**63, -1, 1.5, "x", True, "[]"]


def config_case(rng) -> bytes:
    """The bytes of a mutated machine file."""
    name = rng.choice(sorted(machine_tomls()))
    text = machine_tomls()[name].replace(f'name = "{name[:-5]}"', 'name = "fuzz"')
    kind = rng.random()
    if kind < 0.6:
        for _ in range(rng.randint(1, 3)):
            keys = re.findall(r"(?m)^(\w+) = ", text)
            k = rng.choice(keys)
            v = rng.choice(CONFIG_VALUES)
            v = str(v).lower() if isinstance(v, bool) else f'"{v}"' if v == "x" else str(v)
            if rng.random() < 0.15:
                text = re.sub(rf"(?m)^{k} = .*$", "", text, count=1)
            else:
                text = re.sub(rf"(?m)^{k} = [^#\n]*", f"{k} = {v} ", text, count=1)
    elif kind < 0.9:
        text = _mutate_text(rng, text)
    data = text.encode()
    if kind >= 0.9:
        i = rng.randrange(len(data))
        data = data[:i] + bytes([rng.choice([0x80, 0xC3, 0xFF, 0x00])]) + data[i + 1:]
    return data


# ---- .npz inputs ----------------------------------------------------------------------------
def _npy(arr) -> bytes:
    buf = io.BytesIO()
    np.lib.format.write_array(buf, np.asanyarray(arr), allow_pickle=True)
    return buf.getvalue()


def _lying_npy(shape, dtype="<f2") -> bytes:
    """An .npy header that claims `shape`, followed by a few bytes."""
    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(buf, {"descr": dtype, "fortran_order": False, "shape": tuple(shape)})
    return buf.getvalue() + b"\0" * 64


def npz_case(rng, prog) -> bytes:
    """The bytes of a crafted .npz for `prog`'s declared tensors."""
    decl = [s for s in prog.symbols if s.kind in ("input", "weight", "state")]
    members = {}
    for s in decl:
        if rng.random() < 0.5:
            shape, dt = tuple(s.shape), {"i8": np.int8, "i32": np.int32, "f16": np.float16, "f32": np.float32}[s.dtype]
            kind = rng.randrange(10)
            if kind == 0:
                shape = shape + (1,)
            elif kind == 1:
                dt = rng.choice([np.float64, np.int64, np.bool_, np.complex64, np.uint8, "U2"])
            arr = np.zeros(shape, dt) if kind != 2 else np.full(shape, rng.choice([np.inf, np.nan, 1e30, 300]))
            members[s.name + ".npy"] = _npy(arr)
    kind = rng.randrange(9)
    if kind == 0 and decl:
        members[rng.choice(decl).name + ".npy"] = _lying_npy(rng.choice([(10**12,), (2**31, 2**31), (4, 16), (-1,)]))
    elif kind == 1:
        members["undeclared.npy"] = _lying_npy((10**6, 1000))
    elif kind == 2:
        members["obj.npy"] = _npy(np.array([{"a": 1}], dtype=object))
    elif kind == 3:
        members["notnpy.txt"] = b"hello"
    elif kind == 4 and decl:
        members[decl[0].name + ".npy"] = b"\x93NUMPY\x01\x00" + b"\xff" * 20
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", rng.choice([zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED])) as z:
        for name, data in members.items():
            z.writestr(name, data)
    data = buf.getvalue()
    if kind == 5 and data:
        i = rng.randrange(len(data))
        data = data[:i] + bytes([data[i] ^ 0xFF]) + data[i + 1:]
    elif kind == 6:
        data = data[:rng.randrange(len(data) + 1)]
    elif kind == 7:
        data = rng.choice([b"", b"PK\x05\x06" + b"\0" * 18, b"x = 1\n"])
    return data
