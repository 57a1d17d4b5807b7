"""Every bundled program's cycle count against tests/golden_cycles.json: a slower schedule
fails; a faster one fails too until the file is updated (in the same commit), so the file
always holds today's figures."""
from __future__ import annotations

import json
import os

import pytest

from lpu.compiler.driver import compile_file
from lpu.isa.machine import MachineConfig

HERE = os.path.dirname(os.path.abspath(__file__))
PROGRAMS = os.path.join(os.path.dirname(HERE), "programs")
with open(os.path.join(HERE, "golden_cycles.json")) as f:
    GOLDEN = json.load(f)["programs"]


def _case(e):
    params = ",".join(f"{k}={v}" for k, v in e["params"].items())
    marks = [pytest.mark.slow] if e.get("slow") else []
    return pytest.param(e, id=f"{e['program']}[{params}]@{e['machine']}", marks=marks)


def test_every_bundled_program_has_a_golden_figure():
    names = {f[:-4] for f in os.listdir(PROGRAMS) if f.endswith(".lpu")}
    covered = {e["program"] for e in GOLDEN if e["machine"] == "tsp-v1" and not e["params"]}
    assert names <= covered, f"no golden cycle count for {sorted(names - covered)}"


@pytest.mark.parametrize("entry", [_case(e) for e in GOLDEN])
def test_cycles_match_golden(entry):
    prog, _ = compile_file(os.path.join(PROGRAMS, entry["program"] + ".lpu"), entry["params"],
                           MachineConfig.load(entry["machine"]))
    got, want = prog.predicted_cycles, entry["cycles"]
    assert got <= want, f"{entry['program']} got slower: {got:,} cycles, golden {want:,}"
    assert got == want, (f"{entry['program']} got faster: {got:,} cycles, golden {want:,}: "
                         f"update tests/golden_cycles.json in this commit")
