"""One truth about a binary (issue 18, item 3): for random mutations of compiled binaries (byte
flips with valid checksums, instructions moved a cycle, fields, REPEAT/NOP counts, symbols,
constants, tables, predicted cycles: tests/fuzz/cases.py), `lpu run` exits 0 if and only if
`lpu verify` exits 0.

Both sides hold: `verify` refuses everything `run` refuses (symbol layouts, shapes, constants,
tables), and the emulator refuses as hazards what the checker finds that hardware would silently
get wrong: a read of an SRAM address that holds no value (sram-live), a value on a stream that
nothing reads (stream-unread), a wrong predicted cycle count (cycles), an MXM install of the wrong
type (mxm-order)."""
from __future__ import annotations

import json
import os
import random

import pytest
from hypothesis import given, note
from hypothesis import strategies as st

from tests.fuzz import cases as FC
from tests.fuzz.harness import run_cli


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    return tmp_path_factory.mktemp("agree")


def run_and_verify(workdir, data: bytes) -> tuple[int, int, dict, str]:
    """(run's exit code, verify's, verify's violation counts, run's message)."""
    (workdir / "b.lpubin").write_bytes(data)
    r = run_cli(["run", "b.lpubin"], str(workdir), 120)
    v = run_cli(["verify", "b.lpubin", "--json"], str(workdir), 120)
    assert r.rc in (0, 2) and v.rc in (0, 2), (r.err, v.err)
    counts = json.loads(v.out).get("counts", {}) if v.out.strip() else {}
    return r.rc, v.rc, counts, r.err


@given(st.integers(0, 2**32 - 1))
def test_run_exits_0_iff_verify_exits_0(workdir, seed):
    data = FC.binary_case(random.Random(f"binary-{seed}"))
    run_rc, verify_rc, counts, run_err = run_and_verify(workdir, data)
    note(f"run {run_rc} ({run_err.strip()[:300]}), verify {verify_rc} {counts}")
    assert (run_rc == 0) == (verify_rc == 0), (run_rc, verify_rc, counts, run_err[:300])


@pytest.mark.parametrize("seed", range(0, 60, 3))
def test_run_exits_0_iff_verify_exits_0_fixed_cases(workdir, seed):
    data = FC.binary_case(random.Random(f"binary-{seed}"))
    run_rc, verify_rc, counts, run_err = run_and_verify(workdir, data)
    assert (run_rc == 0) == (verify_rc == 0), (run_rc, verify_rc, counts, run_err[:300])


def test_run_refuses_a_wrong_predicted_cycle_count(workdir):
    import dataclasses
    p = FC.compiled("mlp.lpu")
    run_rc, verify_rc, counts, _ = run_and_verify(workdir, FC.encode(dataclasses.replace(p, predicted_cycles=p.predicted_cycles + 1)))
    assert counts == {"cycles": 1} and verify_rc == 2
    assert run_rc == 2


@pytest.mark.parametrize("seed,kind", [(7186, "mxm-order"), (114929, "output"), (700416, "sram-live")])
def test_run_refuses_with_the_checkers_kind(workdir, seed, kind):
    """Cases the property found: an ABC accumulating onto a row already read out (seed 7186) and
    an output slot never written (seed 114929), a loaded tensor overwritten while still read (seed
    700416) ran to exit 0 while verify refused them. All three are kept as the bytes their seeds
    gave (tests/fuzz/*.bin): a seed mutates another instruction once the compiler schedules the
    program differently (114929's matmul on tiny, once its output lay near the VXM)."""
    kept = {7186: "mxm_order_7186.bin", 114929: "output_114929.bin", 700416: "sram_live_700416.bin"}
    if seed in kept:
        with open(os.path.join(os.path.dirname(__file__), "fuzz", kept[seed]), "rb") as f:
            data = f.read()
    else:
        data = FC.binary_case(random.Random(f"binary-{seed}"))
    run_rc, verify_rc, counts, run_err = run_and_verify(workdir, data)
    assert verify_rc == 2 and kind in counts
    assert run_rc == 2 and "hazard" in run_err
