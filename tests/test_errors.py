"""Every kind of user error, end to end through the `lpu` command (issue 8): the message, its
position (file:line:col, or cycle/queue/instruction/line), the --json fields and the exit code
(0 success, 2 user error, 1 internal error); a traceback only with --debug; and nothing lost:
a failed or interrupted command leaves its outputs and inputs as they were."""
from __future__ import annotations

import json
import os
import struct
import zlib
from dataclasses import dataclass, field

import numpy as np
import pytest

from lpu.isa.encoding import FORMAT_VERSION, MAGIC
from lpu.cli import main

SMALL = ["-p", "S=4", "-p", "D=16", "-p", "F=16"]
MLP = open(os.path.join(os.path.dirname(__file__), "..", "programs", "mlp.lpu")).read()
HEAD = "param D = 8\ninput x : f16[4, D]\nstate kc : f16[16, D]\n"   # cases below start on line 4
BIG = "input x : f16[4, 2048]\nweight w : f16[2048, 2048]\nweight v : f16[2048, 512]\noutput y = f16(f16(x @ w) @ v)\n"
HAND_ASM = """.machine tiny
.source "hand.lpu"
.srcline 1 input x : f16[1, 16]
.srcline 2 output y = x
.symbol x input f16 [1,16] slices=1x2:0,1 banks=1x2:0*2 addrs=1x2:0*2
.symbol y output f16 [1,16] slices=1x2:0,1 banks=1x2:1*2 addrs=1x2:0*2
queue icu:
    NOTIFY
"""
EMPTY_STREAM = HAND_ASM + "queue mem5.1:\n    SYNC\n    NOP n=3\n    WRITE bank=1 addr=7 inp=E2   ; line 2\n"
BANK_CONFLICT = HAND_ASM + ("queue mem0.0:\n    SYNC\n    READ bank=0 addr=0 out=E0\n"
                            "queue mem0.1:\n    SYNC\n    READ bank=0 addr=1 out=E1\n")
TINY_TOML = open(os.path.join(os.path.dirname(__file__), "..", "isa", "machines", "tiny.toml")).read()
GPU_TOML = open(os.path.join(os.path.dirname(__file__), "..", "gpu_baseline", "gpus", "h100-sxm.toml")).read()


def npz(**arrays) -> bytes:
    import io
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    return buf.getvalue()


def reseal(data: bytes, version: int = FORMAT_VERSION) -> bytes:
    """`data` with its version field set and its checksum recomputed."""
    data = data[:len(MAGIC)] + struct.pack("<H", version) + data[len(MAGIC) + 2:-4]
    return data + struct.pack("<I", zlib.crc32(data))


@pytest.fixture(scope="module")
def binaries(tmp_path_factory) -> dict:
    """The small mlp compiled for tiny and for tsp-v1, as bytes."""
    d = tmp_path_factory.mktemp("bin")
    (d / "mlp.lpu").write_text(MLP)
    out = {}
    for m in ("tiny", "tsp-v1"):
        assert main(["compile", str(d / "mlp.lpu"), "--machine", m, *SMALL, "-o", str(d / f"{m}.lpubin")]) == 0
        out[m] = (d / f"{m}.lpubin").read_bytes()
    return out


@dataclass
class Case:
    name: str
    files: dict                      # name -> text, bytes, or fn(binaries) -> bytes
    argv: list                       # the failing command (earlier commands in `before` must succeed)
    fragments: list                  # each must appear in stderr, in this order
    code: int = 2
    json: dict = field(default_factory=dict)   # fields the --json object must hold (subset)
    before: list = field(default_factory=list)


def src(body: str) -> dict:
    return {"p.lpu": HEAD + body}


CASES = [
    # 1. source errors: file:line:col, the source line and a caret, a hint
    Case("missing bracket", src("y = exp(x\noutput y\n"), ["compile", "p.lpu"],
         ["p.lpu:4:8: error: missing closing bracket: `(` is never closed", "    y = exp(x\n           ^", "add `)`"]),
    Case("missing operator", src("y = x x\noutput y\n"), ["compile", "p.lpu"],
         ["p.lpu:4:7: error: missing operator between `x` and `x`"]),
    Case("missing operand", src("output y = exp(x) +\n"), ["compile", "p.lpu"],
         ["p.lpu:4:20: error: missing operand after `+`, found end of line"]),
    Case("bad declaration", src("weight w f16[3]\n"), ["compile", "p.lpu"],
         ["p.lpu:4:10: error: bad declaration: expected `weight NAME : dtype[dims]`"]),
    Case("unknown name", src("y = exp(kcc)\noutput y\n"), ["compile", "p.lpu"],
         ["p.lpu:4:9: error: unknown name `kcc`", "hint: did you mean `kc`?"],
         json={"file": "p.lpu", "line": 4, "col": 9}),
    Case("unknown function", src("output y = laynorm(x)\n"), ["compile", "p.lpu"],
         ["p.lpu:4:12: error: unknown function `laynorm`", "hint: did you mean `layernorm`?"]),
    Case("argument count", src("y = exp(x, x)\noutput y\n"), ["compile", "p.lpu"],
         ["p.lpu:4:5: error: `exp` takes 1 argument, got 2"]),
    Case("shape mismatch", src("y = x + kc\noutput y\n"), ["compile", "p.lpu"],
         ["p.lpu:4:7: error: shape mismatch in `+`: [4, 8] and [16, 8] do not broadcast"]),
    Case("dtype", src("y = i32(x) @ i32(x.T)\noutput y\n"), ["compile", "p.lpu"],
         ["p.lpu:4:12: error: matmul takes i8 or float operands, got i32 @ i32"]),
    Case("inexact division", src("param P = D / 3\noutput x\n"), ["compile", "p.lpu"],
         ["p.lpu:4:13: error: integer division is not exact: 8 / 3 leaves remainder 2"]),
    Case("slice out of range", src("y = kc[0:17, :]\noutput y\n"), ["compile", "p.lpu"],
         ["p.lpu:4:8: error: slice 0:17 is out of range for axis 0 of `kc` (size 16)"]),
    Case("recursion", src("fn f(a) { return f(a) }\ny = f(x)\noutput y\n"), ["compile", "p.lpu"],
         ["p.lpu:4:18: error: recursive call to `f`"]),
    Case("store into non-state", src("x[0:1, :] <- x[0:1, :]\noutput x\n"), ["compile", "p.lpu"],
         ["p.lpu:4:11: error: cannot store into input `x`"]),
    Case("output never assigned", src("output y\n"), ["compile", "p.lpu"],
         ["p.lpu:4:8: error: unknown output name `y`"]),
    Case("errors together, sorted", src("y = exp(xx)\nz = exp(kcc)\noutput zz\n"), ["compile", "p.lpu"],
         ["p.lpu:4:9: error: unknown name `xx`", "p.lpu:5:9: error: unknown name `kcc`",
          "p.lpu:6:8: error: unknown output name `zz`"]),
    Case("unknown -p", src("output x\n"), ["compile", "p.lpu", "-p", "Q=3"],
         ["p.lpu: error: -p Q=3: the program has no `param Q`"]),
    Case("-p not an integer", src("output x\n"), ["compile", "p.lpu", "-p", "D=x"], ["error: -p D: 'x' is not an integer"]),
    Case("no such program", {}, ["compile", "nope.lpu"], ["error: nope.lpu: no such file"]),
    # 2. capacity
    Case("does not fit", {"big.lpu": BIG}, ["compile", "big.lpu", "--machine", "tiny"],
         ["error: program does not fit one chip: 10,506,240 bytes", "2,097,152 bytes of SRAM on 'tiny'",
          "would need 6 chips", "largest tensors: w f16[2048, 2048] (8,388,608 B), v f16[2048, 512]"],
         json={"bytes_needed": 10506240, "bytes_available": 2097152, "chips_needed": 6}),
    # 3. binaries
    Case("bad magic", {"b.lpubin": lambda b: b"NOTLPU" + b["tiny"][6:]}, ["run", "b.lpubin"],
         ["error: b.lpubin: not an .lpubin file (bad magic bytes)"]),
    Case("format version", {"b.lpubin": lambda b: reseal(b["tiny"], 7)}, ["run", "b.lpubin"],
         [f"error: b.lpubin: .lpubin format version 7, but this lpu reads version {FORMAT_VERSION}"]),
    Case("checksum", {"b.lpubin": lambda b: b["tiny"][:200] + bytes([b["tiny"][200] ^ 4]) + b["tiny"][201:]},
         ["run", "b.lpubin"], ["error: b.lpubin: corrupt .lpubin: checksum mismatch"]),
    Case("truncated", {"b.lpubin": lambda b: b["tiny"][:len(b["tiny"]) // 2]}, ["disasm", "b.lpubin"],
         [f"error: b.lpubin: truncated .lpubin: "]),
    Case("other machine", {"b.lpubin": lambda b: b["tsp-v1"]}, ["run", "b.lpubin", "--machine", "tiny"],
         ["error: b.lpubin: built for machine 'tsp-v1'", "not 'tiny'", "recompile for this machine"]),
    # 3. machine and GPU configs: the field and the file named
    Case("machine field missing", {"m.toml": TINY_TOML.replace("acc_rows = 64", "")},
         ["compile", "p.lpu", "--machine", "m.toml"], ["error: m.toml: field 'acc_rows' is missing"]),
    Case("machine field invalid", {"m.toml": TINY_TOML.replace("superlanes = 2", 'superlanes = "two"')},
         ["run", "p.lpu", "--machine", "m.toml"], ["error: m.toml: field 'superlanes' must be a positive integer, got 'two'"]),
    Case("machine field misspelt", {"m.toml": TINY_TOML.replace("mem_read = 2", "mem_raed = 2")},
         ["compile", "p.lpu", "--machine", "m.toml"],
         ["error: m.toml: unknown field(s) latency.mem_raed (did you mean 'latency.mem_read'?)"]),
    Case("machine not TOML", {"m.toml": "name = \n"}, ["compile", "p.lpu", "--machine", "m.toml"],
         ["error: m.toml: not valid TOML: "]),
    Case("unknown machine", {}, ["compile", "p.lpu", "--machine", "tpu"], ["error: unknown machine 'tpu' (known: tiny, tsp-v1"]),
    Case("GPU field missing", {"g.toml": GPU_TOML.replace("sm_count", "# sm_count")},
         ["compare", "p.lpu", "--gpu", "g.toml"], ["error: g.toml: field 'sm_count' is missing"]),
    Case("GPU field invalid", {"g.toml": GPU_TOML.replace("hbm_gbs = 3350", "hbm_gbs = -1")},
         ["compare", "p.lpu", "--gpu", "g.toml"], ["error: g.toml: field 'hbm_gbs' must be positive, got -1"]),
    # 3. --inputs
    Case("inputs: unknown name", {"m.lpu": MLP, "in.npz": npz(xs=np.zeros((4, 16), np.float16))},
         ["run", "m.lpu", "--machine", "tiny", *SMALL, "--inputs", "in.npz"],
         ["error: --inputs in.npz has 'xs', which the program does not declare", "did you mean `x`?"]),
    Case("inputs: shape", {"m.lpu": MLP, "in.npz": npz(w1=np.zeros((16, 8), np.float16))},
         ["run", "m.lpu", "--machine", "tiny", *SMALL, "--inputs", "in.npz"],
         ["error: --inputs in.npz: 'w1' has shape [16, 8], the program declares f16[16, 16]"]),
    Case("inputs: dtype", {"m.lpu": MLP, "in.npz": npz(x=np.full((4, 16), "a"))},
         ["run", "m.lpu", "--machine", "tiny", *SMALL, "--inputs", "in.npz"],
         ["error: --inputs in.npz: 'x' is <U1, the program declares f16[4, 16]"]),
    Case("inputs: NaN", {"m.lpu": MLP, "in.npz": npz(b1=np.array([0.0] * 5 + [np.nan] + [0.0] * 10, np.float32))},
         ["run", "m.lpu", "--machine", "tiny", *SMALL, "--inputs", "in.npz"],
         ["error: --inputs in.npz: 'b1' holds NaN or infinity (first at index [5])"]),
    Case("inputs: not an npz", {"m.lpu": MLP, "in.npz": "x = 1\n"},
         ["run", "m.lpu", "--machine", "tiny", *SMALL, "--inputs", "in.npz"], ["error: in.npz: not an .npz file"]),
    # 4. run-time hazards from hand-written assembly: cycle, queue, instruction, DSL line, expected
    Case("hazard: empty stream", {"h.s": EMPTY_STREAM}, ["run", "h.lpubin"],
         ["error: hazard at cycle 3 on mem5.1 (instruction 3: WRITE, DSL line 2 'output y = x'): "
          "stream read with no valid value on E2 (expected a value written on diagonal -4)"],
         json={"cycle": 3, "queue": "mem5.1", "index": 3, "opcode": "WRITE", "line": 2, "kind": "stream-read",
               "expected": "a value written on diagonal -4"}, before=[["asm", "h.s", "-o", "h.lpubin"]]),
    Case("hazard: bank conflict", {"h.s": BANK_CONFLICT}, ["run", "h.lpubin"],
         ["error: hazard at cycle 0 on mem0.1 (instruction 4: READ): two accesses to one bank in a cycle on slice 0 bank 0"],
         json={"cycle": 0, "queue": "mem0.1", "kind": "bank-conflict", "expected": "one access per bank per cycle"},
         before=[["asm", "h.s", "-o", "h.lpubin"]]),
    Case("assembly error", {"h.s": HAND_ASM + "queue mem0.0:\n    READ bank=0 adr=0 out=E0\n"}, ["asm", "h.s", "-o", "h.lpubin"],
         ["error: h.s:10: READ has no field 'adr' (did you mean 'addr'?)"]),
    # 6. outputs checked before any work
    Case("output directory missing", src("output x\n"), ["compile", "p.lpu", "-o", "no/dir/p.lpubin"],
         ["error: no/dir/p.lpubin: cannot write: directory no/dir does not exist"]),
    Case("output is an input", src("output x\n"), ["compile", "p.lpu", "-o", "p.lpu"],
         ["error: p.lpu: is also an input of this command"]),
    Case("output path empty", src("output x\n"), ["compile", "p.lpu", "-o", ""], ["error: -o '': an empty path"]),
    Case("two outputs, one file", {"m.lpu": MLP}, ["run", "m.lpu", *SMALL, "--save", "o.npz", "--trace", "./o.npz"],
         ["error: --trace ./o.npz and --save o.npz name the same file"]),
    # 7. limits and adversarial inputs (issue 18): each a clear error, fast, in little memory
    Case("nesting: a long sum", src("y = " + " + ".join(["x"] * 600) + "\noutput y\n"), ["compile", "p.lpu"],
         ["p.lpu:4:", "error: nesting too deep: more than 500", "LPU_LIMIT_NESTING"]),
    Case("nesting: chained functions", src("".join(f"fn g{i}(a) {{ return g{i + 1}(a) }}\n" for i in range(600))
                                           + "fn g600(a) { return a }\noutput y = g0(x)\n"), ["compile", "p.lpu"],
         ["error: nesting too deep: more than 500 expressions and inlined calls"]),
    Case("literal too large", src("param P = " + "9" * 4301 + "\noutput x\n"), ["compile", "p.lpu"],
         ["p.lpu:4:11: error: integer literal too large (4301 digits)", "LPU_LIMIT_INT_BITS"]),
    Case("integer overflow", src("param P = 10000000000 * 10000000000\noutput x\n"), ["compile", "p.lpu"],
         ["p.lpu:4:23: error: integer overflow: a compile-time integer must be below 2**63"]),
    Case("-p out of range", src("output x\n"), ["compile", "p.lpu", "-p", "D=" + "1" * 30],
         ["p.lpu:1:7: error: integer overflow"]),
    Case("loop too long", src("for i in 0..1000000 { y = x }\noutput y\n"), ["compile", "p.lpu"],
         ["p.lpu:4:5: error: the loop runs 1,000,000 times, more than 100,000", "LPU_LIMIT_LOOP_TRIPS"]),
    Case("comprehension too long", src("z = [x for i in 0..10000000]\noutput x\n"), ["compile", "p.lpu"],
         ["p.lpu:4:5: error: the loop runs 10,000,000 times"]),
    Case("too many IR nodes", src("for i in 0..300 { for j in 0..100 { y = x + x } }\noutput y\n"), ["compile", "p.lpu"],
         ["error: the program unrolls to more than 20,000 IR operations"]),
    Case("too many vector operations", {"v.lpu": "input x : f16[1024, 512]\ny = x\nfor i in 0..300 { y = y + x }\noutput y\n"},
         ["compile", "v.lpu", "--machine", "tiny"],
         ["v.lpu:3:25: error: the program needs more than 4,000,000 vector operations on a 16-lane machine",
          "LPU_LIMIT_VECTOR_OPS"]),
    Case("dimension too large", src("input z : f32[4, 2147483648]\noutput z\n"), ["compile", "p.lpu"],
         ["p.lpu:4:1: error: dimension 2,147,483,648 is too large"]),
    Case("errors capped", src("".join(f"a{i} = b{i}\n" for i in range(80)) + "output x\n"), ["compile", "p.lpu"],
         ["p.lpu:4:6: error: unknown name `b0`", "... and 30 more errors", "LPU_LIMIT_ERRORS"]),
    Case("echoed line with a form feed", src("z = x\x0c\x0c + 1\ny = exp(xx)\noutput y\n"), ["compile", "p.lpu"],
         ["p.lpu:5:9: error: unknown name `xx`", "    y = exp(xx)\n            ^"]),
    Case("REPEAT expands too far", {"b.lpubin": lambda b: _binary("repeat")}, ["run", "b.lpubin"],
         ["error: b.lpubin: corrupt .lpubin: instruction", "REPEATs are expanded", "LPU_LIMIT_INSTRUCTIONS"]),
    Case("symbol larger than SRAM", {"b.lpubin": lambda b: _binary("shape")}, ["verify", "b.lpubin"],
         ["error: b.lpubin: corrupt .lpubin: symbol 'x' of shape [65536, 32768] needs more SRAM than machine 'tiny' has"]),
    Case("symbol layout mismatched", {"b.lpubin": lambda b: _binary("layout")}, ["verify", "b.lpubin"],
         ["error: b.lpubin: corrupt .lpubin: symbol 'x': layout 'banks' has shape"]),
    Case("constant not its shape", {"b.lpubin": lambda b: _binary("const")}, ["run", "b.lpubin"],
         ["error: b.lpubin: corrupt .lpubin: symbol", "its data is"]),
    Case("config: too few slices", {"m.toml": TINY_TOML.replace("mem_slices_per_hemisphere = 8", "mem_slices_per_hemisphere = 2")},
         ["compile", "p.lpu", "--machine", "m.toml"],
         ["error: m.toml: field 'mem_slices_per_hemisphere' must be in 4..256, got 2 (the compiler needs free slices"]),
    Case("config: one VXM ALU", {"m.toml": TINY_TOML.replace("vxm_alus = 4", "vxm_alus = 1")},
         ["compile", "p.lpu", "--machine", "m.toml"], ["error: m.toml: field 'vxm_alus' must be in 2..64, got 1"]),
    Case("config: huge latency", {"m.toml": TINY_TOML.replace("mxm_abc = 3", "mxm_abc = 16777216")},
         ["compile", "p.lpu", "--machine", "m.toml"], ["error: m.toml: field 'latency.mxm_abc' must be at most 1024"]),
    Case("config: huge SRAM", {"m.toml": TINY_TOML.replace("addresses_per_bank = 4096", "addresses_per_bank = 16777216")},
         ["compile", "p.lpu", "--machine", "m.toml"], ["error: m.toml: the machine is too large to emulate", "LPU_LIMIT_MACHINE_BYTES"]),
    Case("config: not UTF-8", {"m.toml": TINY_TOML.encode().replace(b"tiny", b"t\xffny", 1)},
         ["compile", "p.lpu", "--machine", "m.toml"], ["error: m.toml: not valid TOML: not UTF-8 text"]),
    Case("inputs: header claims 10^12 elements", {"m.lpu": MLP, "in.npz": lambda b: raw_npz(x=lying_npy((10**12,)))},
         ["run", "m.lpu", *SMALL, "--inputs", "in.npz"], ["error: in.npz: 'x' is damaged: its header says [1000000000000]"]),
    Case("inputs: undeclared big member", {"m.lpu": MLP, "in.npz": lambda b: raw_npz(big=lying_npy((10**6, 1000)))},
         ["run", "m.lpu", *SMALL, "--inputs", "in.npz"], ["error: --inputs in.npz has 'big', which the program does not declare"]),
    Case("inputs: a pickle", {"m.lpu": MLP, "in.npz": lambda b: raw_npz(x=pickled_npy())},
         ["run", "m.lpu", *SMALL, "--inputs", "in.npz"], ["error: in.npz: 'x' holds Python objects"]),
    Case("inputs: a header the tokenizer rejects", {"m.lpu": MLP, "in.npz": lambda b: raw_npz(x=unclosed_header_npy())},
         ["run", "m.lpu", *SMALL, "--inputs", "in.npz"], ["error: in.npz: member 'x.npy' is not a valid .npy array"]),
    Case("inputs: /dev/null", {"m.lpu": MLP}, ["run", "m.lpu", *SMALL, "--inputs", "/dev/null"],
         ["error: /dev/null: not an .npz file (not a regular file"]),
]


def raw_npz(**members: bytes) -> bytes:
    import io
    import zipfile
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        for name, data in members.items():
            z.writestr(name + ".npy", data)
    return buf.getvalue()


def lying_npy(shape) -> bytes:
    from tests.fuzz.cases import _lying_npy
    return _lying_npy(shape)


def unclosed_header_npy() -> bytes:
    """An .npy header whose dict is never closed (numpy's tokenizer raises TokenError)."""
    h = b"{'descr': '<f2', 'fortran_order': False, 'shape': (4,"
    h += b" " * (53 - len(h)) + b"\n"
    return b"\x93NUMPY\x01\x00" + len(h).to_bytes(2, "little") + h


def pickled_npy() -> bytes:
    from tests.fuzz.cases import _npy
    return _npy(np.array([{"a": 1}], dtype=object))


def _binary(kind: str) -> bytes:
    """The small mlp binary for tiny with one part made invalid (all with valid checksums)."""
    import dataclasses
    from lpu.isa import opcodes as O
    from tests.fuzz.cases import _copy, compiled, encode
    p = _copy(compiled("attention_decode.lpu" if kind == "const" else "mlp.lpu"))
    x = next(s for s in p.symbols if s.name == "x")
    if kind == "repeat":        # a NOP after a unit instruction becomes REPEAT n=2**31-1 d=1
        i = next(i for i in np.flatnonzero(p.op == O.NOP) if p.queue[i - 1] == p.queue[i] and p.op[i - 1] > O.NOTIFY)
        p.op[i], p.args[i, :2] = O.REPEAT, (2**31 - 1, 1)
    elif kind == "loop":        # run does not elaborate it (only --check does, within the limits)
        p = dataclasses.replace(p, source_lines=["input x : f16[4, 16]", "for i in 0..100000000 { y = x }", "output y"])
    elif kind == "shape":
        x.shape = (65536, 32768)
    elif kind == "layout":
        x.banks = x.banks[:-1]
    else:
        c = next(s for s in p.symbols if s.kind == "const")
        c.data = np.concatenate([np.asarray(c.data).reshape(-1)] * 2)
    return encode(dataclasses.replace(p))


def _write(tmp_path, files, binaries):
    for name, content in files.items():
        content = content(binaries) if callable(content) else content
        (tmp_path / name).write_bytes(content if isinstance(content, bytes) else content.encode())


def _lpu(capsys, argv) -> tuple[int, str, str]:
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_error(case, tmp_path, monkeypatch, capsys, binaries):
    monkeypatch.chdir(tmp_path)
    _write(tmp_path, {"p.lpu": HEAD + "output x\n", **case.files}, binaries)
    for argv in case.before:
        assert _lpu(capsys, argv)[0] == 0
    code, out, err = _lpu(capsys, case.argv)
    assert code == case.code, err
    at = 0
    for frag in case.fragments:
        found = err.find(frag, at)
        assert found >= 0, f"{frag!r} not in stderr (after position {at}):\n{err}"
        at = found + len(frag)
    assert "Traceback" not in err and out == ""
    if case.json:
        code, out, err = _lpu(capsys, [*case.argv, "--json"])
        assert code == case.code
        info = json.loads(out)
        assert case.fragments[0].removeprefix("error: ") in info["error"]
        assert {k: info.get(k) for k in case.json} == case.json


# ---- 5. exit codes: 0, 2, 1; a traceback only with --debug -----------------------------------------------------
def test_success_exits_0(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "p.lpu").write_text(HEAD + "output x\n")
    assert _lpu(capsys, ["compile", "p.lpu", "--machine", "tiny"])[0] == 0


def test_internal_error_exits_1_and_asks_for_a_report(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "p.lpu").write_text(HEAD + "output x\n")
    import lpu.api

    def broken(*a, **k):
        raise ZeroDivisionError("deliberately broken")
    monkeypatch.setattr(lpu.api, "compile", broken)
    code, out, err = _lpu(capsys, ["compile", "p.lpu"])
    assert code == 1
    assert "internal error: ZeroDivisionError: deliberately broken" in err and "please report it" in err
    assert "Traceback" not in err
    with pytest.raises(ZeroDivisionError):
        main(["compile", "p.lpu", "--debug"])


def test_user_error_with_debug_raises(tmp_path, monkeypatch):
    from lpu.isa.errors import LpuError
    monkeypatch.chdir(tmp_path)
    with pytest.raises(LpuError, match="no such file"):
        main(["compile", "nope.lpu", "--debug"])


# ---- 6. nothing lost -----------------------------------------------------------------------------------------
OLD = b"the previous contents"


def _dir_state(d) -> dict:
    return {p.name: p.read_bytes() for p in d.iterdir() if p.is_file()}


@pytest.mark.parametrize("files,argv", [
    (src("y = exp(xx)\noutput y\n"), ["compile", "p.lpu", "-o", "out.lpubin"]),
    ({"h.lpubin": lambda b: b["tiny"][:-1]}, ["disasm", "h.lpubin", "-o", "out.s"]),
    ({"h.s": HAND_ASM + "queue mem0.0:\n    READ bnk=0\n"}, ["asm", "h.s", "-o", "out.lpubin"]),
    ({"m.lpu": MLP, "in.npz": npz(x=np.full((4, 16), np.nan, np.float16))},
     ["run", "m.lpu", "--machine", "tiny", *SMALL, "--inputs", "in.npz", "--save", "out.npz", "--trace", "out.json"]),
    ({"h.lpubin": lambda b: b["hazard"]}, ["run", "h.lpubin", "--save", "out.npz", "--trace", "out.json"]),
], ids=["source error", "bad binary", "asm error", "bad inputs", "hazard"])
def test_failed_command_leaves_files_unchanged(files, argv, tmp_path, monkeypatch, capsys, binaries):
    monkeypatch.chdir(tmp_path)
    _write(tmp_path, files, binaries)
    for out in ("out.lpubin", "out.s", "out.npz", "out.json"):
        (tmp_path / out).write_bytes(OLD)
    before = _dir_state(tmp_path)
    assert _lpu(capsys, argv)[0] == 2
    assert _dir_state(tmp_path) == before   # outputs as they were, inputs untouched, no temporary left


@pytest.fixture(scope="module", autouse=True)
def _hazard_binary(binaries, tmp_path_factory):
    d = tmp_path_factory.mktemp("hz")
    (d / "h.s").write_text(EMPTY_STREAM)
    assert main(["asm", str(d / "h.s"), "-o", str(d / "h.lpubin")]) == 0
    binaries["hazard"] = (d / "h.lpubin").read_bytes()


def test_interrupted_write_leaves_no_partial_file(tmp_path, monkeypatch, capsys):
    import lpu.isa.encoding
    monkeypatch.chdir(tmp_path)
    (tmp_path / "p.lpu").write_text(HEAD + "output x\n")
    (tmp_path / "out.lpubin").write_bytes(OLD)

    def interrupted_save(prog, path):
        with open(path, "wb") as f:
            f.write(b"half a bin")
        raise KeyboardInterrupt
    monkeypatch.setattr(lpu.isa.encoding, "save", interrupted_save)
    before = _dir_state(tmp_path)
    code, _, err = _lpu(capsys, ["compile", "p.lpu", "--machine", "tiny", "-o", "out.lpubin"])
    assert code == 130 and "interrupted" in err
    assert _dir_state(tmp_path) == before


def test_successful_write_replaces_and_keeps_mode(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "p.lpu").write_text(HEAD + "output x\n")
    (tmp_path / "out.lpubin").write_bytes(OLD)
    os.chmod(tmp_path / "out.lpubin", 0o644)
    assert _lpu(capsys, ["compile", "p.lpu", "--machine", "tiny", "-o", "out.lpubin"])[0] == 0
    assert (tmp_path / "out.lpubin").read_bytes().startswith(MAGIC)
    assert os.stat(tmp_path / "out.lpubin").st_mode & 0o777 == 0o644
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.lpubin", "p.lpu"]


# ---- 8. outputs that are not regular files: followed or written in place, never replaced -----------------------
def test_output_through_a_link_writes_its_target(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "p.lpu").write_text(HEAD + "output x\n")
    (tmp_path / "target.lpubin").write_bytes(OLD)
    os.symlink("target.lpubin", tmp_path / "link.lpubin")
    assert _lpu(capsys, ["compile", "p.lpu", "--machine", "tiny", "-o", "link.lpubin"])[0] == 0
    assert os.path.islink(tmp_path / "link.lpubin")
    assert (tmp_path / "target.lpubin").read_bytes().startswith(MAGIC)


def test_output_to_a_fifo_and_a_device_is_written_in_place(tmp_path, monkeypatch, capsys):
    import stat
    import threading
    monkeypatch.chdir(tmp_path)
    (tmp_path / "p.lpu").write_text(HEAD + "output x\n")
    os.mkfifo(tmp_path / "fifo")
    got = []
    reader = threading.Thread(target=lambda: got.append(open(tmp_path / "fifo", "rb").read()))
    reader.start()
    assert _lpu(capsys, ["compile", "p.lpu", "--machine", "tiny", "-o", "fifo"])[0] == 0
    reader.join(10)
    assert got and got[0].startswith(MAGIC) and stat.S_ISFIFO(os.stat(tmp_path / "fifo").st_mode)
    before = os.stat("/dev/null")
    assert _lpu(capsys, ["compile", "p.lpu", "--machine", "tiny", "-o", "/dev/null"])[0] == 0
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode) and os.stat("/dev/null").st_ino == before.st_ino


def test_run_of_a_binary_does_not_elaborate_its_stored_source(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "b.lpubin").write_bytes(_binary("loop"))
    import lpu.compiler.frontend

    def elaborate(*a, **k):
        raise AssertionError("the stored source was elaborated")
    monkeypatch.setattr(lpu.compiler.frontend, "elaborate_source", elaborate)
    assert _lpu(capsys, ["run", "b.lpubin"])[0] == 0
