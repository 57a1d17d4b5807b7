"""One truth about a binary (issue 18, item 3): for random mutations of compiled binaries (byte
flips with valid checksums, instructions moved a cycle, fields, REPEAT/NOP counts, symbols,
constants, tables, predicted cycles: tests/fuzz/cases.py), `lpu run` exits 0 if and only if
`lpu verify` exits 0.

The checker's side holds: `verify` refuses everything `run` refuses. The emulator's side is
pending: it does not yet treat as hazards a read of an SRAM address that holds no value
(verify: sram-live), a value put on a stream that nothing reads (stream-unread), a wrong
predicted cycle count (cycles), an MXM install of the wrong type (mxm-order), or an output read
back from SRAM slots nothing wrote (output); those checks
belong to emulator/core.py and emulator/run.py (issue 14). Until they are in, the full
property is marked xfail, and the test that runs by default allows exactly those kinds."""
from __future__ import annotations

import json
import random

import pytest
from hypothesis import given, note
from hypothesis import strategies as st

from tests.fuzz import cases as FC
from tests.fuzz.harness import run_cli

# verify's violation kinds that `run` does not refuse yet (the emulator checks of issue 14)
EMULATOR_PENDING = {
    "sram-live": "the emulator does not refuse a read of an SRAM address that holds no value",
    "stream-unread": "the emulator does not refuse a value on a stream that nothing consumes",
    "cycles": "the emulator does not refuse a binary whose predicted cycle count is wrong",
    "mxm-order": "the emulator does not refuse an MXM install of the wrong type or order",
    "output": "the emulator reads back an output whose SRAM slots no instruction wrote",
}
PENDING_REASON = ("emulator-side hazards not in yet (issue 14): " + "; ".join(EMULATOR_PENDING.values()))


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
def test_verify_refuses_whatever_run_refuses(workdir, seed):
    """Checker side: `verify` exits 0 only if `run` does; where `run` exits 0 and `verify`
    does not, only the emulator-side kinds still pending are found."""
    data = FC.binary_case(random.Random(f"binary-{seed}"))
    run_rc, verify_rc, counts, run_err = run_and_verify(workdir, data)
    note(f"run {run_rc} ({run_err.strip()[:300]}), verify {verify_rc} {counts}")
    if verify_rc == 0:
        assert run_rc == 0, f"verify accepts a binary run refuses: {run_err}"
    if run_rc == 0 and verify_rc != 0:
        assert counts and set(counts) <= set(EMULATOR_PENDING), counts


@pytest.mark.xfail(reason=PENDING_REASON, strict=False)
@pytest.mark.parametrize("seed", range(0, 60, 3))
def test_run_exits_0_iff_verify_exits_0(workdir, seed):
    data = FC.binary_case(random.Random(f"binary-{seed}"))
    run_rc, verify_rc, counts, run_err = run_and_verify(workdir, data)
    assert (run_rc == 0) == (verify_rc == 0), (run_rc, verify_rc, counts, run_err[:300])


@pytest.mark.xfail(reason=PENDING_REASON.split(": ")[0] + ": " + EMULATOR_PENDING["cycles"], strict=True)
def test_run_refuses_a_wrong_predicted_cycle_count(workdir):
    import dataclasses
    p = FC.compiled("mlp.lpu")
    run_rc, verify_rc, counts, _ = run_and_verify(workdir, FC.encode(dataclasses.replace(p, predicted_cycles=p.predicted_cycles + 1)))
    assert counts == {"cycles": 1} and verify_rc == 2
    assert run_rc == 2
