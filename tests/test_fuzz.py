"""Fuzzing (Hypothesis): the parser and front end fed random and mutated programs, the decoder
random and mutated binaries, the assembler mutated text, and the machine and GPU config loaders
mutated TOML. The only outcomes allowed are success or an LpuError (the project's own error
type); any other exception is a bug. Short in the default run; longer under
`pytest --hypothesis-profile=dev` (profiles in tests/conftest.py)."""
import glob
import os
import re
import struct
import tomllib
import zlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from lpu.compiler.driver import compile_source
from lpu.compiler.frontend import elaborate_source
from lpu.gpu_baseline.gpus import GPUS_DIR, gpu_from_dict, load_gpu
from lpu.isa.asm import assemble, disassemble
from lpu.isa.encoding import FORMAT_VERSION, MAGIC, decode, encode
from lpu.isa.errors import LpuError
from lpu.isa.machine import MACHINES_DIR, MachineConfig

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROGRAMS = {os.path.basename(p): open(p).read() for p in sorted(glob.glob(os.path.join(ROOT, "programs", "*.lpu")))}
MACHINE_TOMLS = {os.path.basename(p): open(p).read() for p in sorted(glob.glob(os.path.join(MACHINES_DIR, "*.toml")))}
GPU_TOMLS = {os.path.basename(p): open(p).read() for p in sorted(glob.glob(os.path.join(GPUS_DIR, "*.toml")))}
TOKEN = re.compile(r"[A-Za-z_][A-Za-z_0-9]*|\d+\.\d*|\d+|\.\.|<-|\S")
# characters and tokens the language (and its mistakes) is made of
ALPHABET = "abcdefgxyzSDFKw0123456789_ +-*/%@=:.,;()[]{}<#\n\t\"'$"
VOCAB = ["param", "input", "weight", "state", "output", "fn", "for", "in", "return", "f16", "f32", "i8", "i32",
         "x", "w", "S", "D", "layernorm", "softmax", "exp", "concat", "causal", "reshape", "sum", "axis",
         "0", "1", "7", "1.5", "(", ")", "[", "]", "{", "}", ",", ":", "=", "..", "<-", "+", "-", "*", "/",
         "@", "%", ".T", ";", "\n"]


def allowed(fn, *args):
    """Run fn; an LpuError is an allowed outcome, anything else propagates (and fails the test)."""
    try:
        return fn(*args)
    except LpuError as e:
        assert e.message, "an LpuError without a message"
        return None


# ---- mutations ------------------------------------------------------------------------------------
def _char_mutation(draw, text: str) -> str:
    kind = draw(st.sampled_from(["delete", "insert", "replace", "duplicate", "truncate"]))
    i = draw(st.integers(0, max(len(text) - 1, 0)))
    j = draw(st.integers(i, min(len(text), i + 12)))
    if kind == "delete":
        return text[:i] + text[j:]
    if kind == "insert":
        return text[:i] + draw(st.text(ALPHABET, min_size=1, max_size=4)) + text[i:]
    if kind == "replace":
        return text[:i] + draw(st.sampled_from(ALPHABET)) + text[i + 1:]
    if kind == "duplicate":
        return text[:j] + text[i:j] + text[j:]
    return text[:i]


def _token_mutation(draw, text: str) -> str:
    spans = [m.span() for m in TOKEN.finditer(text)]
    if not spans:
        return text + draw(st.sampled_from(VOCAB))
    a, b = spans[draw(st.integers(0, len(spans) - 1))]
    c, d = spans[draw(st.integers(0, len(spans) - 1))]
    kind = draw(st.sampled_from(["delete", "replace", "insert", "copy"]))
    if kind == "delete":
        return text[:a] + text[b:]
    if kind == "replace":
        return text[:a] + draw(st.sampled_from(VOCAB)) + text[b:]
    if kind == "insert":
        return text[:a] + draw(st.sampled_from(VOCAB)) + " " + text[a:]
    return text[:a] + text[c:d] + text[b:]


@st.composite
def mutated(draw, texts: dict, tokens: bool = True) -> tuple[str, str]:
    name = draw(st.sampled_from(sorted(texts)))
    text = texts[name]
    for _ in range(draw(st.integers(1, 4))):
        use_tokens = tokens and draw(st.booleans())
        text = _token_mutation(draw, text) if use_tokens else _char_mutation(draw, text)
    return name, text


# ---- the parser and front end ---------------------------------------------------------------------------------
@given(st.text(ALPHABET, max_size=200))
def test_front_end_on_random_text(text):
    allowed(elaborate_source, text, "fuzz.lpu", {})


@given(st.lists(st.sampled_from(VOCAB), max_size=40).map(" ".join))
def test_front_end_on_random_tokens(text):
    allowed(elaborate_source, text, "fuzz.lpu", {})


@given(mutated(PROGRAMS))
def test_front_end_on_mutated_programs(case):
    name, text = case
    allowed(elaborate_source, text, name, {})


@given(st.text(max_size=60))
def test_front_end_on_any_unicode(text):
    allowed(elaborate_source, text, "fuzz.lpu", {})


# ---- the decoder -------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def binary() -> bytes:
    prog, _ = compile_source(PROGRAMS["mlp.lpu"], "mlp.lpu", {"S": 4, "D": 16, "F": 16}, MachineConfig.load("tiny"))
    return encode(prog)


def _reseal(body: bytes) -> bytes:
    """A preamble with the right length and a correct checksum around `body` (the sections),
    so that the decoder gets past its checks and into the sections."""
    head = MAGIC + struct.pack("<HI", FORMAT_VERSION, len(body) + 4)
    return head + body + struct.pack("<I", zlib.crc32(head + body))


@st.composite
def byte_mutation(draw, data: bytes) -> bytes:
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["flip", "set", "delete", "insert", "truncate"]))
        i = draw(st.integers(0, max(len(data) - 1, 0)))
        if kind == "flip":
            data = data[:i] + bytes([data[i] ^ (1 << draw(st.integers(0, 7)))]) + data[i + 1:] if data else data
        elif kind == "set":
            data = data[:i] + bytes([draw(st.sampled_from([0, 1, 0x7F, 0x80, 0xFF]))]) + data[i + 1:]
        elif kind == "delete":
            data = data[:i] + data[i + draw(st.integers(1, 16)):]
        elif kind == "insert":
            data = data[:i] + draw(st.binary(min_size=1, max_size=8)) + data[i:]
        else:
            data = data[:i]
    return data


@given(st.binary(max_size=300))
def test_decoder_on_random_bytes(data):
    allowed(decode, data)
    allowed(decode, MAGIC + data)


@given(st.data())
def test_decoder_on_mutated_binaries(binary, data):
    allowed(decode, data.draw(byte_mutation(binary)))


@given(st.data())
def test_decoder_on_mutated_sections_with_valid_checksum(binary, data):
    body = binary[len(MAGIC) + 6:-4]
    allowed(decode, _reseal(data.draw(byte_mutation(body))))


def test_decoder_refuses_a_huge_instruction_count_before_allocating(binary):
    """A count of 2**31 instructions in a sealed binary is refused by its first column (it had
    allocated 25 GiB first and died of MemoryError)."""
    body = binary[len(MAGIC) + 6:-4]
    at = body.index(b"INST") + 8                   # tag, section length, then the u32 count
    forged = _reseal(body[:at] + struct.pack("<I", 2**31) + body[at + 4:])
    with pytest.raises(LpuError, match="does not hold"):
        decode(forged)


# ---- the assembler ----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def asm_text(binary) -> dict:
    return {"mlp.s": disassemble(decode(binary))}


@given(st.data())
def test_assembler_on_mutated_text(asm_text, data):
    name, text = data.draw(mutated(asm_text, tokens=False))
    allowed(assemble, text, name)


# ---- the config loaders -----------------------------------------------------------------------------
def _load_machine_text(text: str, tmp_path_factory) -> None:
    path = tmp_path_factory.mktemp("m") / "fuzz.toml"
    path.write_text(text)
    MachineConfig.load(str(path))


@given(mutated(MACHINE_TOMLS, tokens=False))
def test_machine_loader_on_mutated_toml(tmp_path_factory, case):
    allowed(_load_machine_text, case[1], tmp_path_factory)


TOML_VALUES = st.one_of(st.integers(-2**70, 2**70), st.floats(allow_nan=True), st.booleans(), st.text(max_size=5),
                        st.lists(st.integers(), max_size=3), st.dictionaries(st.text(max_size=5), st.integers(), max_size=2))


@st.composite
def mutated_tables(draw, texts: dict) -> dict:
    """A config as parsed TOML, with fields deleted, changed to any TOML value or added."""
    data = tomllib.loads(texts[draw(st.sampled_from(sorted(texts)))])
    for _ in range(draw(st.integers(1, 3))):
        table = data
        sub = [k for k, v in data.items() if isinstance(v, dict)]
        if sub and draw(st.booleans()):
            table = data[draw(st.sampled_from(sub))]
        keys = sorted(table) + ["new_field"]
        key = draw(st.sampled_from(keys))
        if draw(st.integers(0, 3)) == 0:
            table.pop(key, None)
        else:
            table[key] = draw(TOML_VALUES)
    return data


@given(mutated_tables(MACHINE_TOMLS))
def test_machine_loader_on_mutated_fields(data):
    allowed(MachineConfig.from_dict, data, "fuzz.toml")


@given(mutated(GPU_TOMLS, tokens=False))
def test_gpu_loader_on_mutated_toml(tmp_path_factory, case):
    path = tmp_path_factory.mktemp("g") / "fuzz.toml"
    path.write_text(case[1])
    allowed(load_gpu, str(path))


@given(mutated_tables(GPU_TOMLS))
def test_gpu_loader_on_mutated_fields(data):
    allowed(gpu_from_dict, data, "fuzz.toml")


# ---- the `lpu` command on fuzz cases (tests/fuzz/cases.py; the long run: tests/fuzz/long.py) ---------------
# Each case is made from a seed; every command must end in 0 or 2 (a clear error), never 1 (an internal
# error) and never past the harness' time limit (-1).
from tests.fuzz import cases as FC          # noqa: E402
from tests.fuzz.harness import run_cli      # noqa: E402

SEEDS = st.integers(0, 2**32 - 1)
CASE_LIMIT_S = 60          # generous: a hang, not a slow shared machine, is what this catches


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    d = tmp_path_factory.mktemp("fuzzcli")
    (d / "mlp.lpu").write_text(FC.programs()["mlp.lpu"])
    assert run_cli(["compile", "mlp.lpu", "--machine", "tiny", "-o", "mlp.lpubin"], str(d)).rc == 0
    return d


def _no_internal_error(o):
    assert o.rc in (0, 2), f"lpu {' '.join(o.argv)}: exit {o.rc} after {o.seconds:.1f} s\n{o.err}"
    assert o.rc == 0 or o.err.strip(), "a refusal without a message"


@given(SEEDS)
def test_cli_on_fuzzed_programs(workdir, seed):
    import random
    _, text = FC.program_case(random.Random(f"program-{seed}"))
    (workdir / "p.lpu").write_text(text, errors="surrogatepass")
    _no_internal_error(run_cli(["compile", "p.lpu", "--machine", "tiny"], str(workdir), CASE_LIMIT_S))


@given(SEEDS)
def test_cli_on_fuzzed_binaries(workdir, seed):
    import random
    (workdir / "b.lpubin").write_bytes(FC.binary_case(random.Random(f"binary-{seed}")))
    for cmd in ("disasm", "verify", "run"):
        _no_internal_error(run_cli([cmd, "b.lpubin"], str(workdir), CASE_LIMIT_S))


@given(SEEDS)
def test_cli_on_fuzzed_machine_configs(workdir, seed):
    import random
    (workdir / "m.toml").write_bytes(FC.config_case(random.Random(f"config-{seed}")))
    _no_internal_error(run_cli(["run", "mlp.lpu", "--machine", "m.toml"], str(workdir), CASE_LIMIT_S))


@given(SEEDS)
def test_cli_on_fuzzed_npz_inputs(workdir, seed):
    import random
    (workdir / "in.npz").write_bytes(FC.npz_case(random.Random(f"npz-{seed}"), FC.compiled("mlp.lpu")))
    _no_internal_error(run_cli(["run", "mlp.lpubin", "--inputs", "in.npz"], str(workdir), CASE_LIMIT_S))
