"""Traces: the Perfetto/Chrome JSON of `lpu run --trace`, the `lpu trace` pipeline diagram, and the
`--report` of `lpu run` (utilization, SRAM, streams, cycles per DSL line, bottleneck)."""
import contextlib
import io
import json
import os
import sys
from argparse import Namespace

import numpy as np
import pytest

from lpu.emulator import report as R
from lpu.emulator import trace as T
from lpu.emulator.run import schedule
from lpu.isa import opcodes as O
from lpu.isa.errors import LpuError
from lpu import api
from lpu.cli import main
from lpu.cmd_trace import after_run

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MLP = os.path.join(ROOT, "programs", "mlp.lpu")
DECODE = os.path.join(ROOT, "programs", "gpt2_block_decode.lpu")


def cli(*argv):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main([str(a) for a in argv])
    return rc, out.getvalue(), err.getvalue()


@pytest.fixture(scope="module")
def mlp():
    prog, graph = api.compile(MLP, {}, "tsp-v1")
    values = api.inputs_for(graph, prog, 0)
    result = api.run(prog, values, trace=True)
    return prog, values, result, T.records(prog, result.trace, result.cycles)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """`lpu run programs/mlp.lpu --trace t.json`, loaded back with json."""
    path = tmp_path_factory.mktemp("trace") / "t.json"
    rc, out, err = cli("run", MLP, "--trace", path, "--json")
    assert rc == 0, err
    with open(path) as f:
        return json.load(f), json.loads(out)


@pytest.fixture(scope="module")
def decode_report():
    rc, out, err = cli("run", DECODE, "--report", "--json")
    assert rc == 0, err
    return json.loads(out)


# ---- the records come from the emulator's execution and agree with the static schedule -------------
def test_trace_records_agree_with_schedule(mlp):
    prog, values, result, r = mlp
    s = schedule(prog)
    assert len(result.trace.cycle) == result.instructions == len(s.cycle)
    np.testing.assert_array_equal(result.trace.cycle, s.cycle)
    np.testing.assert_array_equal(result.trace.index, s.src)
    np.testing.assert_array_equal(result.trace.repeat, s.repeat)
    np.testing.assert_array_equal(r.args, s.args)          # REPEAT field bumps decoded the same way
    np.testing.assert_array_equal(r.queue, s.queue)
    assert result.cycles == s.cycles + prog.machine.icu_skew
    assert api.run(prog, values).trace is None                # tracing off keeps nothing


def test_tracks_cover_every_queue():
    from lpu.isa.machine import MachineConfig
    for name in ("tsp-v1", "tiny"):
        m = MachineConfig.load(name)
        names, qt = T.tracks(m)
        assert len(qt) == len(m.queues) and qt.min() >= 0 and qt.max() < len(names)
        labels = [n for n, _ in names]
        assert {"MXM 0", "VXM", "SXM 0", "SXM 1", "MEM 0-7", "ICU"} <= set(labels)
        assert len(labels) == len(set(labels))
        for (qname, kind, idx, role, pos), t in zip(m.queues, qt):   # MEM groups stay in one hemisphere
            if labels[t].startswith("MEM "):
                lo, _, hi = labels[t][4:].partition("-")
                assert int(lo) <= idx <= int(hi or lo)
                assert m.slice_hemisphere(int(lo)) == m.slice_hemisphere(int(hi or lo))


# ---- lpu run --trace ------------------------------------------------------------------------------
def test_run_trace_writes_perfetto_json(saved, mlp):
    doc, info = saved
    prog, _, result, r = mlp
    ev = doc["traceEvents"]
    names = {e["tid"]: e["args"]["name"] for e in ev if e["ph"] == "M" and e["name"] == "thread_name"}
    xs = [e for e in ev if e["ph"] == "X"]
    assert len(xs) == info["instructions"] == result.instructions
    kinds_used = {r.track_names[t][1].upper() for t in np.unique(r.track)}
    kinds_with_events = {names[e["tid"]].split()[0] for e in xs}
    assert kinds_used == kinds_with_events and {"MXM", "VXM", "MEM"} <= kinds_with_events
    assert {"MXM 0", "VXM", "SXM 1", "MEM 0-7", "ICU"} <= set(names.values())
    lines = {e["args"]["line"] for e in xs}
    assert lines and lines <= {14, 15} and all(isinstance(x, int) for x in lines)
    clock = doc["otherData"]["clock_mhz"]
    for e in xs[::97]:
        a = e["args"]
        assert a["opcode"] == e["name"] and a["ir_op"] and a["source"]
        assert round(e["ts"] * clock) == a["cycle"] and round(e["dur"] * clock) == a["busy_cycles"]
        assert set(a["operands"]) == {f for f, _ in O.BY_NAME[a["opcode"]].fields}
    ref = next(e for e in xs if e["name"] == "ABC")["args"]["operands"]["inp"]
    assert ref.startswith("f16:") and ref[4] in "EW"
    counters = {e["name"] for e in ev if e["ph"] == "C"}
    assert counters == {"MXM MACs", "SRAM bytes read", "SRAM bytes written", "streams in use"}


def test_trace_events_nest_cleanly(saved):
    """On a track, two events either coincide or do not overlap (Perfetto needs proper nesting)."""
    doc, _ = saved
    by_tid = {}
    for e in doc["traceEvents"]:
        if e["ph"] == "X":
            by_tid.setdefault(e["tid"], set()).add((e["args"]["cycle"], e["args"]["busy_cycles"]))
    for spans in by_tid.values():
        spans = sorted(spans)
        for (a, da), (b, db) in zip(spans, spans[1:]):
            assert a + da <= b, (a, da, b, db)


def test_counters_match_emulator(mlp):
    prog, _, result, r = mlp
    act = T.activity(r)
    assert act["macs"].sum() == result.counters["macs"]
    assert act["sram_read"].sum() == result.counters["sram_read_bytes"]
    assert act["sram_written"].sum() == result.counters["sram_written_bytes"]
    assert 0 < act["streams"].max() <= 2 * prog.machine.streams_per_direction


def test_trace_window_and_event_bound(mlp):
    _, _, _, r = mlp
    doc, notes = T.chrome_trace(r, (100, 200), max_events=50)
    xs = [e for e in doc["traceEvents"] if e["ph"] == "X"]
    assert len(xs) == 50 and all(100 <= e["args"]["cycle"] < 200 for e in xs)
    assert any("cycles 100:200 only" in n for n in notes) and any("kept the first 50" in n for n in notes)
    assert doc["otherData"]["window"] == [100, 200]
    assert T.chrome_trace(r)[1] == []                         # nothing said when nothing is cut


def test_window_errors(mlp):
    prog, _, result, _ = mlp
    for bad in ("5", "5:2", "a:b", "-1:4"):
        with pytest.raises(LpuError, match="A:B"):
            T.parse_window(bad, 100)
    assert T.parse_window(":50", 100) == (0, 50) and T.parse_window("20:", 100) == (20, 100)
    args = Namespace(trace=None, cycles="1:2", report=False, plot=None, json=False)
    with pytest.raises(LpuError, match="needs --trace"):
        after_run(args, prog, result, {})


# ---- lpu trace ------------------------------------------------------------------------------------
def test_lpu_trace_diagram_shape():
    rc, out, err = cli("trace", MLP, "--cycles", "0:60")
    assert rc == 0, err
    lines = out.splitlines()
    assert lines[0].endswith("cycles 0:60 of " + lines[0].rsplit(" of ", 1)[1])
    header = lines[1]
    assert header.startswith("cycle")
    label_w = header.index("0", 5)
    for c in range(0, 60, 10):
        assert header[label_w + 3 * c:].startswith(str(c))
    rows = [x for x in lines[2:] if x and not x.startswith(" ") and "=" not in x]
    assert len(rows) >= 3 and any(x.startswith("MEM") for x in rows) and any(x.startswith("MXM") for x in rows)
    known = set(T.MNEMONIC.values()) | {".", T.HELD}
    for row in rows:
        body = row[label_w:].ljust(180)
        cells = [body[3 * i:3 * i + 3].strip() for i in range(60)]
        assert all(c in known for c in cells), row
        assert len(row) <= label_w + 180
    assert "RD=READ" in lines[-1] and ".=idle" in lines[-1]


def test_trace_from_saved_json_matches_run(saved, mlp, tmp_path):
    doc, _ = saved
    _, _, _, r = mlp
    from_run = T.diagram(T.cells_of_records(r), 40, 120)
    from_json = T.diagram(T.cells_of_trace(doc), 40, 120)
    assert from_run == from_json
    path = tmp_path / "t.json"
    path.write_text(json.dumps(doc))
    rc, out, err = cli("trace", path, "--cycles", "40:120", "--units", "mxm", "--json")
    assert rc == 0, err
    got = json.loads(out)
    assert got["cycles"] == [40, 120]
    assert got["rows"] and all(x["unit"].startswith("MXM") and len(x["cells"]) == 80 for x in got["rows"])
    assert [x["unit"] for x in got["rows"]] == [n for n, _ in from_run[1] if n.startswith("MXM")]
    assert any(T.HELD in x["cells"] for x in got["rows"])      # f16 ABCs hold their plane pair
    rc, _, err = cli("trace", path, "--units", "gpu")
    assert rc == 2 and "unknown unit kind" in err


# ---- lpu run --report -----------------------------------------------------------------------------
def test_report_decode_names_bottleneck_and_lines_add_up(decode_report):
    rep = decode_report["report"]
    b = rep["bottleneck"]
    assert b["kind"] in ("MXM-bound", "stream-bound", "SRAM-bound", "VXM-bound", "latency-bound")
    assert len(b["reason"]) > 20
    assert sum(x["cycles"] for x in rep["lines"]) == decode_report["cycles"] == rep["cycles"]
    assert all(x["idle"] <= x["cycles"] for x in rep["lines"])
    assert {x["line"] for x in rep["lines"] if x["line"]} >= {29, 30}     # the attention lines cost cycles
    text = R.format_report(rep)
    assert text.startswith(f"bottleneck: {b['kind']}")
    assert [x.split() for x in text.splitlines() if x.split()[:1] == ["total"]] == [["total", f"{rep['cycles']:,}"]]
    assert "SRAM: peak live" in text and "streams:" in text


def test_report_numbers_agree_with_emulator(mlp):
    prog, _, result, r = mlp
    rep = R.report(r)
    for k, v in result.utilization.items():
        assert rep["utilization"][k] == pytest.approx(v, abs=1e-4)
    assert sum(rep["instructions_per_unit"].values()) == result.instructions == sum(rep["opcodes"].values())
    s = rep["sram"]
    assert s["tensor_bytes"] == sum(t.slices.size * prog.machine.lanes for t in prog.symbols)
    assert s["tensor_bytes"] <= s["peak_live_bytes"] <= s["footprint_bytes"] <= s["capacity_bytes"]
    assert sum(x["cycles"] for x in rep["lines"]) == result.cycles
    mxm = [u for u in rep["units"] if u["unit"] == "MXM 0"][0]
    assert 0 < mxm["utilization"] <= 1


def test_bottleneck_rule():
    m = api.machine_of("tiny")
    lines = [{"line": 3, "label": "line 3", "cycles": 10, "idle": 0}]
    act = {"macs": np.ones(10)}
    streams = {"occupancy": 0.1, "mean_in_use": 1.6, "streams": 16}
    util = {"mxm": 0.9, "vxm": 0.1, "mem": 0.2, "sxm": 0.0}
    assert R._bottleneck(util, streams, lines, act, m)["kind"] == "MXM-bound"
    assert R._bottleneck(dict(util, mxm=0.1, mem=0.7), streams, lines, act, m)["kind"] == "SRAM-bound"
    assert R._bottleneck(dict(util, mxm=0.1), dict(streams, occupancy=0.8), lines, act, m)["kind"] == "stream-bound"
    slow = R._bottleneck(dict(util, mxm=0.1), streams, lines, act, m)
    assert slow["kind"] == "latency-bound" and "line 3" in slow["reason"]


def test_plot(mlp, tmp_path, monkeypatch):
    _, _, _, r = mlp
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        pass
    else:
        R.plot(r, str(tmp_path / "u.png"))
        assert (tmp_path / "u.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(LpuError, match="matplotlib"):
        R.plot(r, str(tmp_path / "v.png"))


def test_every_unit_opcode_has_a_mnemonic():
    from lpu.isa.machine import UNIT_ICU
    from lpu.isa.opcodes import OPS
    missing = [s.name for s in OPS if s.unit != UNIT_ICU and s.name not in T.MNEMONIC]
    assert not missing, f"no pipeline-diagram mnemonic for {missing} (emulator/trace.py MNEMONIC)"
    assert all(len(v) <= 2 for v in T.MNEMONIC.values())
