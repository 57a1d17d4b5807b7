"""What a new user tries first: a binary that remembers its params, the language reference
naming every builtin, --version, and labelled, consistent command output."""
import hashlib
import json
import os
import re
import struct
import zlib

import pytest

from lpu.cli import main
from lpu.compiler import builtins as B
from lpu.compiler.elaborate import PRELUDE_PATH
from lpu.isa.encoding import decode
from lpu.isa.errors import BinaryError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MLP = os.path.join(ROOT, "programs", "mlp.lpu")


def _lpu(capsys, *argv):
    rc = main([str(a) for a in argv])
    out = capsys.readouterr()
    return rc, out.out, out.err


@pytest.fixture(scope="module")
def mlp_bin(tmp_path_factory):
    path = tmp_path_factory.mktemp("bin") / "m.lpubin"
    assert main(["compile", MLP, "-p", "S=8", "--machine", "tiny", "-o", str(path)]) == 0
    return path


def test_binary_runs_checks_and_compares_without_p(capsys, mlp_bin):
    rc, out, _ = _lpu(capsys, "run", mlp_bin, "--check", "--json")
    d = json.loads(out)
    assert rc == 0 and d["check"]["ok"] and d["params"]["S"] == 8 and d["cycles"] == d["predicted_cycles"]
    assert d["compile_s"] >= 0 and d["instructions_compiled"] > 0
    rc, out, _ = _lpu(capsys, "compare", mlp_bin, "--json")
    assert rc == 0 and json.loads(out)["params"]["S"] == 8
    rc, out, _ = _lpu(capsys, "verify", mlp_bin, "--json")
    assert rc == 0 and json.loads(out)["ok"]


def test_binary_params_mismatch_is_a_clear_error(capsys, mlp_bin):
    rc, _, err = _lpu(capsys, "run", mlp_bin, "-p", "S=16")
    assert rc == 2 and "S=16 (compiled with S=8)" in err and "Traceback" not in err
    rc, _, err = _lpu(capsys, "verify", mlp_bin, "-p", "Q=1")
    assert rc == 2 and "has no param Q" in err
    rc, out, _ = _lpu(capsys, "run", mlp_bin, "-p", "S=8", "--json")   # the same value is fine
    assert rc == 0 and json.loads(out)["params"]["S"] == 8


def test_disasm_json_and_asm_keep_params(capsys, mlp_bin, tmp_path):
    rc, out, _ = _lpu(capsys, "disasm", mlp_bin, "--json")
    d = json.loads(out)
    assert rc == 0 and d["params"]["S"] == 8 and ".param S 8" in d["text"] and len(d["source_sha256"]) == 64
    s = tmp_path / "m.s"
    assert _lpu(capsys, "disasm", mlp_bin, "-o", s)[0] == 0
    assert _lpu(capsys, "asm", s, "-o", tmp_path / "again.lpubin")[0] == 0
    assert (tmp_path / "again.lpubin").read_bytes() == mlp_bin.read_bytes()
    rc, _, err = _lpu(capsys, "run", s)
    assert rc == 2 and "lpu asm" in err


def test_tampered_source_in_a_binary_is_refused(mlp_bin):
    """The embedded source is checked against its recorded hash, even behind a valid checksum."""
    data = bytearray(mlp_bin.read_bytes())
    k = data.find(b"param S")
    assert k > 0
    data[k] = ord("P")                                            # one byte of the stored source ...
    data[-4:] = struct.pack("<I", zlib.crc32(bytes(data[:-4])))   # ... behind a valid checksum
    with pytest.raises(BinaryError, match="embedded source does not match its recorded hash"):
        decode(bytes(data))
    assert decode(mlp_bin.read_bytes()).source_hash() == hashlib.sha256(
        "\n".join(decode(mlp_bin.read_bytes()).source_lines).encode()).hexdigest()


def test_version(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0 and re.fullmatch(r"lpu \S+\n", capsys.readouterr().out)


def test_every_argument_has_help():
    from lpu.cli import build_parser
    ap = build_parser()
    sub = next(a for a in ap._actions if a.__class__.__name__ == "_SubParsersAction")
    for name, p in sub.choices.items():
        for act in p._actions:
            if act.dest in ("help",) or act.help == "==SUPPRESS==":
                continue
            assert act.help, f"lpu {name}: argument {act.dest} has no help text"


def test_language_reference_names_every_builtin():
    doc = open(os.path.join(ROOT, "docs", "language.md")).read()
    prelude = re.findall(r"^fn (\w+)\(", PRELUDE_PATH.read_text(), re.M)
    assert prelude and set(B.BUILTINS)
    for name in [*B.BUILTINS, *prelude]:
        assert f"`{name}(" in doc, f"docs/language.md does not document the builtin `{name}`"


def test_unknown_function_hint_points_to_the_reference(capsys, tmp_path):
    p = tmp_path / "p.lpu"
    p.write_text("input x : f32[2, 4]\noutput y = frobnicate(x)\n")
    rc, _, err = _lpu(capsys, "compile", p, "--machine", "tiny")
    assert rc == 2 and "docs/language.md" in err


def test_limit_option_raises_a_named_limit(capsys, tmp_path):
    p = tmp_path / "p.lpu"
    p.write_text("input x : f32[2, 4]\ny = x\nfor i in 0..20 { y = y + x }\noutput y\n")
    rc, _, err = _lpu(capsys, "--limit", "loop_trips=10", "compile", p, "--machine", "tiny")
    assert rc == 2 and "loop_trips" in err and "--limit" in err
    assert _lpu(capsys, "--limit", "loop_trips=100", "compile", p, "--machine", "tiny")[0] == 0
    rc, _, err = _lpu(capsys, "--limit", "nonsense=3", "compile", p)
    assert rc == 2 and "no limit named 'nonsense'" in err
    assert "LPU_LIMIT_LOOP_TRIPS" not in os.environ        # the option lasts one command


def test_progress_line_names_the_stage_only_on_a_terminal():
    import io
    import time
    from lpu.args import Progress

    class Tty(io.StringIO):
        def isatty(self):
            return True
    tty = Tty()
    with Progress(delay=0.01, stream=tty).stage("compiling p.lpu", lambda: "lower and schedule"):
        time.sleep(0.1)
    assert "compiling p.lpu (lower and schedule) ..." in tty.getvalue() and "done in" in tty.getvalue()
    quiet = io.StringIO()
    with Progress(delay=0.01, stream=quiet).stage("compiling p.lpu"):
        time.sleep(0.05)
    assert quiet.getvalue() == ""
