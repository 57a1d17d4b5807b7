"""`lpu verify` on the bundled programs (no violation) and on a hand-broken binary (the
violation, with its DSL line)."""
from __future__ import annotations

import glob
import json
import os

import pytest

from lpu.cli import main

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PROGRAMS = sorted(glob.glob(os.path.join(ROOT, "programs", "*.lpu")))
SMALL = {"matmul.lpu": [], "mlp.lpu": [], "attention_decode.lpu": [], "gpt2_block_decode.lpu": [],
         "attention_prefill.lpu": ["-p", "S=32"], "gpt2_block_prefill.lpu": ["-p", "S=16"],
         "llama_block_decode.lpu": [], "llama_block_prefill.lpu": ["-p", "S=16"]}
BIG = [p for p in PROGRAMS if os.path.basename(p) not in SMALL]


@pytest.mark.parametrize("name", sorted(SMALL))
def test_bundled_program_verifies(name, capsys):
    assert main(["verify", os.path.join(ROOT, "programs", name), "--json", *SMALL[name]]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["ok"] and out["violations"] == []


@pytest.mark.slow
@pytest.mark.parametrize("path", BIG, ids=os.path.basename)
def test_large_program_verifies(path, capsys):
    assert main(["verify", path]) == 0


def test_hand_broken_binary_reports_the_violation_with_its_line(tmp_path, capsys):
    src = os.path.join(ROOT, "programs", "matmul.lpu")
    binary, text, broken, bad = (str(tmp_path / f) for f in ("m.lpubin", "m.s", "b.s", "b.lpubin"))
    small = ["-p", "S=8", "-p", "D=40", "-p", "F=24", "--machine", "tiny"]
    assert main(["compile", src, *small, "-o", binary]) == 0
    assert main(["verify", binary]) == 0
    assert main(["disasm", binary, "-o", text]) == 0
    lines = open(text).read().split("\n")
    # drop one cycle of padding before the first READ that follows a NOP: it fires a cycle early
    k = next(i for i, ln in enumerate(lines) if ln.strip().startswith("NOP n=")
             and lines[i + 1].strip().startswith("READ"))
    n = int(lines[k].split("n=")[1].split()[0])
    lines[k] = lines[k].replace(f"n={n}", f"n={n - 1}")
    open(broken, "w").write("\n".join(lines))
    assert main(["asm", broken, "-o", bad]) == 0
    capsys.readouterr()
    assert main(["verify", bad]) == 2
    err = capsys.readouterr().err
    assert "stream-empty" in err and "(line 11: output y = f16(x @ w))" in err
    assert main(["verify", bad, "--json"]) == 2
    out = json.loads(capsys.readouterr().out)
    assert not out["ok"] and {"line": 11, "kind": "stream-empty"}.items() <= next(
        v for v in out["violations"] if v["kind"] == "stream-empty").items()
