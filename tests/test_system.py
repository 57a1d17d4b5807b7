"""Many chips: the system config, the C2C opcodes, pipeline partitioning, link transfers and
the windowed system emulator (isa/system.py, compiler/partition.py, compiler/system.py,
emulator/c2c.py, emulator/system.py)."""
from __future__ import annotations

import dataclasses
import os

import numpy as np
import pytest

from lpu import api
from lpu.compiler.frontend import elaborate_source
from lpu.compiler.partition import choose_cuts, cut_costs
from lpu.compiler.reference import random_values
from lpu.compiler.system import compile_auto, compile_system
from lpu.compiler.verify import verify
from lpu.emulator.run import HazardError
from lpu.emulator.system import run_system
from lpu.isa import opcodes as O
from lpu.isa.errors import ConfigError, LpuError
from lpu.isa.machine import UNIT_C2C, MachineConfig
from lpu.isa.system import SystemConfig

HERE = os.path.dirname(__file__)
ROOT = os.path.dirname(HERE)
SMALL = os.path.join(HERE, "machines", "tiny-small.toml")


def graph_of(name, params):
    path = os.path.join(ROOT, "programs", f"{name}.lpu")
    with open(path) as f:
        return elaborate_source(f.read(), path, params)


@pytest.fixture(scope="module")
def small():
    return MachineConfig.load(SMALL)


@pytest.fixture(scope="module")
def mlp2(small):
    g = graph_of("mlp", {"S": 8, "D": 32, "F": 64})
    return g, compile_system(g, SystemConfig.load("node", MachineConfig.load("tiny"), 2))


def test_link_figures_from_the_node_config():
    s = SystemConfig.load("node", chips=8)
    assert (s.slot_cycles, s.hop_cycles, s.link_gbytes_per_s) == (24, 216, 12.5)   # P22; 328 B at 12.5 GB/s
    for a in range(8):
        for b in range(8):
            if a != b:
                la, lb = s.link_between(a, b)
                assert s.peer(a, la) == b and s.peer(b, lb) == a and 0 <= la < 7
    s16 = SystemConfig.load("node", chips=16)
    assert s16.link_between(7, 8) == (7, 8) and s16.hop_between(7, 8) == 650    # the chain's global link
    with pytest.raises(ConfigError, match="no direct link"):
        s16.link_between(6, 8)
    assert s16.route(6, 9) == [6, 7, 8, 9]


def test_system_config_errors(small):
    with pytest.raises(ConfigError, match="chip count"):
        SystemConfig.load("node", small, 0)
    with pytest.raises(ConfigError, match="unknown system"):
        SystemConfig.load("nosuch")


def test_c2c_opcodes_are_in_the_one_table():
    m = MachineConfig.load("tiny")
    assert O.OPS[O.SEND].unit == O.OPS[O.RECV].unit == UNIT_C2C
    assert m.queues[m.c2c_queue(0)][:3] == ("c2c0", UNIT_C2C, 0)
    assert len([q for q in m.queues if q[1] == UNIT_C2C]) == m.c2c_links == 16


def test_two_chips_match_the_reference_and_their_predictions(mlp2):
    g, sp = mlp2
    assert [p.n_instructions > 0 for p in sp.chips] == [True, True]
    assert all(verify(p) == [] for p in sp.chips)      # the independent checker, chip by chip
    ops0, ops1 = set(sp.chips[0].op.tolist()), set(sp.chips[1].op.tolist())
    assert O.SEND in ops0 and O.RECV not in ops0 and O.RECV in ops1 and O.SEND not in ops1
    vals = random_values(g, 0)
    r = run_system(sp, vals)
    assert [c.cycles for c in r.chips] == [p.predicted_cycles for p in sp.chips]   # finish() checks each too
    assert r.cycles == sp.predicted_cycles
    # the receiver cannot start before the first vector's hop
    assert sp.chips[1].predicted_cycles > sp.system.hop_cycles
    assert api.check(g, sp.chips[1], vals, r)["ok"]
    assert r.chips[0].counters["link_vectors_sent"] == r.chips[1].counters["link_vectors_received"] > 0


@pytest.mark.parametrize("name,params,chips", [
    ("mlp", {"S": 16}, 2),
    ("gpt2_block_decode", {"C": 64, "D": 128, "T": 10}, 3),
])
def test_auto_takes_the_fewest_chips_that_fit(small, name, params, chips):
    g = graph_of(name, params)
    with pytest.raises(LpuError, match="does not fit"):
        compile_system(g, SystemConfig.load("node", small, 1))
    sp = compile_auto(g, SystemConfig.load("node", small))
    assert len(sp.chips) == chips
    vals = random_values(g, 1)
    r = run_system(sp, vals)
    assert api.check(g, sp.chips[0], vals, r)["ok"]
    assert r.cycles == sp.predicted_cycles


def test_states_stay_on_one_chip():
    g = graph_of("gpt2_block_decode", {"C": 64, "D": 128, "T": 10})
    comp, resident, crossing, allowed = cut_costs(g)
    stores = [i for i, n in enumerate(comp) if n.op == "store"]
    assert stores and not allowed[stores[-1]]          # no cut just before a store of the cache
    for chips in (2, 3):
        assert all(allowed[c] for c in choose_cuts(g, chips))


def _mutated(prog, i, j, value):
    """A copy of prog with instruction i's arg j set to value."""
    args = prog.args.copy()
    args[i, j] = value
    return dataclasses.replace(prog, args=args)


def _c2c_rows(prog, op):
    return [i for i in range(prog.n_instructions) if prog.op[i] == op]


def test_receive_before_arrival_is_a_hazard(mlp2):
    g, sp = mlp2
    recv = sp.chips[1]
    q = recv.queue[_c2c_rows(recv, O.RECV)[0]]
    nop = next(i for i in range(recv.n_instructions) if recv.queue[i] == q and recv.op[i] == O.NOP)
    bad = _mutated(recv, nop, 0, int(recv.args[nop, 0]) - 5)       # every RECV 5 cycles early
    sp2 = dataclasses.replace(sp, chips=[sp.chips[0], bad])
    with pytest.raises(HazardError, match=r"chip 1 c2c\d+ .*RECV.*receive before arrival") as e:
        run_system(sp2, random_values(g, 0))
    assert e.value.kind == "link-early" and e.value.line > 0


def test_a_chips_own_hazard_names_the_chip(mlp2):
    """A one-chip hazard in a system (an instruction 3 cycles early) is the run's HazardError,
    with the chip in its message (emulator/c2c.py `advance`)."""
    g, sp = mlp2
    p = sp.chips[0]
    nop = next(i for i in range(p.n_instructions) if p.op[i] == O.NOP and p.args[i, 0] > 3)
    bad = _mutated(p, nop, 0, int(p.args[nop, 0]) - 3)
    with pytest.raises(HazardError, match=r"hazard at cycle \d+ on chip 0 ") as e:
        run_system(dataclasses.replace(sp, chips=[bad, sp.chips[1]]), random_values(g, 0))
    assert not e.value.kind.startswith("link") and e.value.line > 0


def test_two_sends_in_one_slot_is_a_hazard(mlp2):
    g, sp = mlp2
    send = sp.chips[0]
    sends = _c2c_rows(send, O.SEND)
    nop = sends[0] + 1                           # SEND, NOP slot-1, SEND, ...
    assert send.op[nop] == O.NOP and send.args[nop, 0] == sp.system.slot_cycles - 1 and send.op[nop + 1] == O.SEND
    bad = _mutated(send, nop, 0, 0)              # the next vector one cycle after the first
    sp2 = dataclasses.replace(sp, chips=[bad, sp.chips[1]])
    with pytest.raises(HazardError, match=r"chip 0 c2c\d+ .*SEND.*two sends on link") as e:
        run_system(sp2, random_values(g, 0))
    assert e.value.kind == "link-busy"


def test_a_chip_program_alone_is_refused(mlp2):
    g, sp = mlp2
    with pytest.raises(LpuError, match="chip-to-chip"):
        api.run(sp.chips[0], {k: v for k, v in random_values(g, 0).items() if k in ("x", "w1", "b1")})


def test_result_does_not_depend_on_the_grouping(mlp2):
    g, sp = mlp2
    vals = random_values(g, 0)
    one = run_system(sp, vals)
    two = run_system(sp, vals, workers=2)
    assert [c.cycles for c in one.chips] == [c.cycles for c in two.chips]
    assert all(np.array_equal(one.outputs[k], two.outputs[k]) for k in one.outputs)
    assert one.windows == two.windows


def test_a_chip_runs_a_window_per_core_call(mlp2, monkeypatch):
    """SEND and RECV run inside the jitted core (emulator/core_links.py): the core returns to
    the host once per window a chip waits in (or to multiply out a batch), not per C2C instruction."""
    from lpu.emulator import c2c, core
    g, sp = mlp2
    calls, real = [], core.execute
    monkeypatch.setattr(c2c.core, "execute", lambda *a: calls.append(1) or real(*a))
    r = run_system(sp, random_values(g, 0), workers=0)
    vectors = r.chips[0].counters["link_vectors_sent"]       # 64 vectors, 3 windows, 14 calls
    assert vectors > 4 * len(sp.chips) * r.windows
    assert len(calls) < vectors


def test_bundle_round_trip_and_old_readers(mlp2, tmp_path):
    from lpu.isa.bundle import decode_bundle, encode_bundle
    from lpu.isa.encoding import decode
    from lpu.isa.errors import BinaryError
    g, sp = mlp2
    data = encode_bundle(sp)
    system, progs, outputs, params, rows = decode_bundle(data)
    assert system == sp.system and progs == sp.chips and outputs == sp.outputs and params == sp.params
    assert rows == sp.rows
    with pytest.raises(BinaryError, match="version 1001"):
        decode(data)                                  # a one-chip reader says why
    with pytest.raises(BinaryError, match="checksum"):
        decode_bundle(data[:-1] + bytes([data[-1] ^ 1]))
    from lpu.isa.asm import assemble, disassemble
    for p in sp.chips:                                 # SEND, RECV and `link` symbols in assembly text too
        assert assemble(disassemble(p), "chip.s") == p


def test_cli_compile_run_disasm(small, tmp_path, capsys):
    import json
    from lpu.cli import main
    prog = os.path.join(ROOT, "programs", "mlp.lpu")
    args = [prog, "-p", "S=16", "--machine", SMALL]
    assert main(["compile", *args]) == 2
    assert "--chips" in capsys.readouterr().err           # today's error names the way out
    out = str(tmp_path / "mlp.lpubin")
    assert main(["compile", *args, "--chips", "auto", "-o", out, "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["chips"] == 2 and len(info["per_chip"]) == 2
    assert info["predicted_cycles"] == max(c["predicted_cycles"] for c in info["per_chip"])
    assert main(["run", out, "--check", "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["check"]["ok"] and r["chips"] == 2 and r["cycles"] == r["predicted_cycles"] == info["predicted_cycles"]
    assert all(c["cycles"] == c["predicted_cycles"] for c in r["per_chip"])
    assert main(["disasm", out]) == 0
    text = capsys.readouterr().out
    assert "; ==== chip 0 ====" in text and "; ==== chip 1 ====" in text and "SEND" in text and "RECV" in text
    assert main(["run", out, "--chips", "3"]) == 2
    assert "compiled for 2 chips" in capsys.readouterr().err


def test_stacked_weights_and_cache_are_split_by_layer(small):
    """gpt2_small_decode's [L, ...] weights and KV cache: each chip holds its layers' rows; the
    caches' rows come back in place."""
    g = graph_of("gpt2_small_decode", {"L": 4, "D": 128, "H": 4, "C": 32, "T": 5})
    sp = compile_auto(g, SystemConfig.load("node", small))
    assert len(sp.chips) == 4
    assert [r["kc"] for r in sp.rows] == [(0, 1), (1, 2), (2, 3), (3, 4)]
    for p in sp.chips:
        assert p.symbol("wqkv").shape[0] == 1 and p.symbol("kc").shape[0] == 1
        assert all(tuple(s.shape) == (1, 128) for s in p.symbols if s.kind == "link")   # only the residual crosses
    vals = random_values(g, 2)
    r = run_system(sp, vals)
    assert r.states["kc"].shape == (4, 32, 128)
    assert api.check(g, sp.chips[0], vals, r)["ok"]
    assert [c.counters["link_vectors_received"] for c in r.chips] == [0, 16, 16, 16]   # x: f16[1, 128]


SKIP = """
input  x  : f16[8, 32]
weight w1 : f16[32, 32]
weight w2 : f16[32, 32]
weight w3 : f16[32, 32]
a = f16(x @ w1)
b = f16(a @ w2)
c = f16(b @ w3 + a)
output y = c
"""


def test_across_nodes_through_a_relay():
    """Nodes of two chips (tests/systems/pairs.toml): chip 1 -> 2 is the global link between
    nodes (650 cycles), and `a`, from chip 0 to chip 2, is relayed by chip 1."""
    g = elaborate_source(SKIP, "skip.lpu", {})
    system = SystemConfig.load(os.path.join(HERE, "systems", "pairs.toml"), MachineConfig.load("tiny"), 3)
    assert system.route(0, 2) == [0, 1, 2] and system.route(0, 1) == [0, 1]
    assert system.hop_between(1, 2) == system.global_hop_cycles == 650
    assert system.peer(1, system.global_out) == 2 and system.peer(2, system.global_in) == 1
    sp = compile_system(g, system)
    kinds = [{s.name: s.kind for s in p.symbols} for p in sp.chips]
    assert kinds[1]["@5"] == "link" and kinds[1]["@5>"] == "output" and kinds[2]["@5"] == "link"
    vals = random_values(g, 0)
    r = run_system(sp, vals)
    assert api.check(g, sp.chips[0], vals, r)["ok"]
    assert [c.counters["link_vectors_sent"] for c in r.chips] == [32, 64, 0]     # [8, 32] f16: 16 vectors x 2 planes
    assert sp.chips[2].predicted_cycles > sp.chips[1].predicted_cycles + 650


LAYERS = """
param L = 4
input  x : f16[192, 64]
weight w : f16[L, 64, 64]
h = x
for l in 0..L {
    h = f16(relu(h @ w[l]))
}
output y = h
"""


def test_a_long_cut_goes_over_every_path_of_the_node(small, monkeypatch):
    """A cut of 1,536 vectors (192 rows x 4 chunks x 2 planes) goes a third on the direct link and
    a third through each idle chip of the node (compiler/system_pp.py): a relay before its own
    stage (chip 3 for the cut 1 -> 2) and after it (chip 0 for 1 -> 2 and 2 -> 3). Emulated ==
    predicted, the links check, and the system is faster than with the one link."""
    from lpu.compiler import system_pp
    from lpu.compiler.verify_links import verify_links
    g = elaborate_source(LAYERS, "layers.lpu", {})
    system = SystemConfig.load("node", small, 4)
    sp = compile_system(g, system)
    relays = [sorted(y.name for y in p.symbols if y.name.endswith("^")) for p in sp.chips]
    assert relays == [["@13^", "@9^"], ["@13^"], [], ["@9^"]]
    assert all(y.kind == "link" for p in sp.chips for y in p.symbols if y.name.startswith("@") and y.kind != "output")
    assert verify_links(system, sp.chips) == []
    vals = random_values(g, 0)
    r = run_system(sp, vals)
    assert [c.cycles for c in r.chips] == [p.predicted_cycles for p in sp.chips]
    assert api.check(g, sp.chips[0], vals, r)["ok"]
    assert [c.counters["link_vectors_received"] for c in r.chips] == [1024, 1024, 1536, 2048]
    assert r.windows <= 8               # a window ends at another chip's next SEND, not a hop after its pause
    monkeypatch.setattr(system_pp, "RELAY_HOPS", 1 << 30)
    one = compile_system(g, system)
    assert all(not y.name.endswith("^") for p in one.chips for y in p.symbols)
    assert sp.predicted_cycles < one.predicted_cycles - 1500     # two cuts of 3,072 cycles on one link


def test_a_cut_goes_group_of_rows_by_group():
    """A cut's planes (compiler/links.planes_of): column chunk by column chunk, or with the row
    groups of the sender's last layernorm, group by group (each column chunk by column chunk),
    so that a group leaves as soon as it is made and the receiver multiplies it as a block."""
    from lpu.compiler.links import planes_of
    from lpu.compiler.rewrite_rows import GROUP, row_bounds
    lanes = 16
    assert planes_of((5, 2 * lanes), 1, lanes) == [(v, 0) for v in (0, 2, 4, 6, 8, 1, 3, 5, 7, 9)]
    assert planes_of((5, 2 * lanes), 2, lanes, [0, 2, 5]) == [
        (v, b) for v in (0, 2, 1, 3, 4, 6, 8, 5, 7, 9) for b in (0, 1)]
    assert row_bounds(2 * GROUP - 1) == [0, 2 * GROUP - 1]
    assert row_bounds(6 * GROUP) == [0, GROUP - 1, 2 * GROUP - 1, 3 * GROUP - 1, 4 * GROUP - 1, 5 * GROUP - 1,
                                     6 * GROUP]


def test_verify_checks_every_chip_and_link(mlp2):
    from lpu.compiler.verify_links import verify_links
    g, sp = mlp2
    assert verify_links(sp.system, sp.chips) == []
    recv = sp.chips[1]
    q = recv.queue[_c2c_rows(recv, O.RECV)[0]]
    nop = next(i for i in range(recv.n_instructions) if recv.queue[i] == q and recv.op[i] == O.NOP)
    early = verify_links(sp.system, [sp.chips[0], _mutated(recv, nop, 0, int(recv.args[nop, 0]) - 5)])
    assert {v.kind for v in early} >= {"link-early"} and all(v.queue.startswith("chip ") for v in early)
    send = sp.chips[0]
    nop = _c2c_rows(send, O.SEND)[0] + 1
    busy = verify_links(sp.system, [_mutated(send, nop, 0, 0), sp.chips[1]])
    assert "link-busy" in {v.kind for v in busy}
    alone = verify_links(sp.system, [send, dataclasses.replace(recv, op=np.where(recv.op == O.RECV, O.NOP,
                                                                                   recv.op).astype(np.int32))])
    assert "link-unmatched" in {v.kind for v in alone}


def test_ray_address_without_a_cluster_is_one_clear_error(monkeypatch):
    """--ray auto with no cluster running: an LpuError that says what to do, not Ray's traceback."""
    ray = pytest.importorskip("ray")
    from lpu.emulator import cluster
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    if ray.is_initialized():
        ray.shutdown()
    with pytest.raises(LpuError, match="ray start --head"):
        cluster.connect("auto")


def test_ray_actors_give_the_same_result(mlp2):
    """The `cluster` extra: chips as Ray actors on a Ray instance started on this machine."""
    ray = pytest.importorskip("ray")
    g, sp = mlp2
    vals = random_values(g, 0)
    one = run_system(sp, vals)
    try:
        two = run_system(sp, vals, ray_address="local")
    finally:
        ray.shutdown()
    assert [c.cycles for c in one.chips] == [c.cycles for c in two.chips]
    assert all(np.array_equal(one.outputs[k], two.outputs[k]) for k in one.outputs)


def test_system_trace_has_a_process_per_chip_and_a_flow_per_vector(mlp2):
    from lpu.emulator.system_trace import system_trace
    g, sp = mlp2
    r = run_system(sp, random_values(g, 0), trace=True)
    doc, _ = system_trace(sp, r)
    ev = doc["traceEvents"]
    assert {e["pid"] for e in ev} == {1, 2}
    starts = [e for e in ev if e["ph"] == "s"]
    ends = {e["id"]: e for e in ev if e["ph"] == "f"}
    assert len(starts) == len(ends) == r.chips[0].counters["link_vectors_sent"] == doc["otherData"]["flows"]
    hop_us = sp.system.hop_cycles / sp.system.machine.clock_mhz
    assert all(ends[e["id"]]["ts"] >= e["ts"] + hop_us - 1e-9 and ends[e["id"]]["pid"] == 2 for e in starts)


@pytest.mark.parametrize("name,params", [
    ("llama2_7b_decode", {"L": 4, "D": 128, "H": 4, "F": 256, "C": 32, "T": 5}),
    ("bert_large", {"L": 2, "D": 64, "H": 2, "S": 16}),
])
def test_programs_for_many_chips_at_small_params(small, name, params):
    """programs/systems/: the programs that need several chips at their own params."""
    path = os.path.join(ROOT, "programs", "systems", f"{name}.lpu")
    with open(path) as f:
        g = elaborate_source(f.read(), path, params)
    sp = compile_auto(g, SystemConfig.load("node", small))
    vals = random_values(g, 3)
    r = run_system(sp, vals)
    assert api.check(g, sp.chips[0], vals, r)["ok"] and r.cycles == sp.predicted_cycles


def test_llama2_7b_cuts_fall_between_layers():
    """At its real size (not compiled here): cuts where only the residual vector crosses."""
    from lpu.compiler.frontend import elaborate_file
    g = elaborate_file(os.path.join(ROOT, "programs", "systems", "llama2_7b_decode.lpu"))
    comp, resident, crossing, allowed = cut_costs(g)
    m = MachineConfig.load("tsp-v1")
    chips = -(-int(resident.sum()) // m.sram_bytes)
    assert 29 <= chips <= 33                           # 6.5 GB of i8 weights + the caches
    cuts = choose_cuts(g, chips)
    assert max(int(crossing[c]) for c in cuts) <= 64 * 1024


def test_compare_puts_a_system_beside_gpus(capsys):
    import json
    from lpu.cli import main
    prog = os.path.join(ROOT, "programs", "systems", "llama2_7b_decode.lpu")
    args = ["compare", prog, "-p", "L=4", "-p", "D=128", "-p", "H=4", "-p", "F=256", "-p", "C=32", "-p", "T=5",
            "--machine", SMALL, "--chips", "auto", "--gpus", "8", "--json"]
    assert main(args) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["phase"] == "decode" and d["lpu"]["chips"] == 4 and d["lpu"]["time_us"] > 0
    assert d["lpu"]["cycles"] == max(d["lpu"]["per_chip_cycles"])
    assert d["lpu"]["tokens_per_s"] > 0 and d["gpu"]["group"]["gpus"] == 8 and d["speedup"] > 0


def test_cuts_keep_each_stage_within_a_chip_when_they_can(small):
    """bert_base's 128 KiB matrices on 256 KiB chips: a stage holds one of them (with the small
    ones beside it), never two; 4 layers take 12 chips, the fewest at whole-matrix grain."""
    g = graph_of("bert_base", {"L": 4, "D": 128, "H": 2, "S": 16})
    comp, resident, crossing, allowed = cut_costs(g)
    cap = int(small.sram_bytes * 0.85)
    cuts = choose_cuts(g, 12, cap)
    b = [0] + cuts + [len(comp)]
    sizes = [int(resident[b[i]:b[i + 1]].sum()) + int(crossing[b[i]]) + int(crossing[b[i + 1]]) for i in range(12)]
    assert max(sizes) <= cap
    with pytest.raises(LpuError, match="does not fit"):
        compile_system(g, SystemConfig.load("node", small, 11))


BUNDLED_SMALL = {"attention_decode": {}, "attention_prefill": {"S": 32}, "gpt2_block_prefill": {"D": 64, "S": 16, "C": 32},
                 "llama_block_decode": {"D": 64, "H": 2, "F": 128, "C": 32, "T": 9},
                 "gpt2_small_prefill": {"L": 2, "D": 64, "H": 2, "S": 8, "C": 16},
                 "bert_base": {"L": 2, "D": 64, "H": 2, "S": 8}}


@pytest.mark.parametrize("name", sorted(BUNDLED_SMALL))
def test_bundled_programs_on_two_chips(name):
    """Every kind of op across a cut (attention, transposes, caches, rope, layernorm) on tiny: the
    independent checker passes every chip and link, the run matches the reference."""
    from lpu.compiler.verify_links import verify_links
    g = graph_of(name, BUNDLED_SMALL[name])
    sp = compile_system(g, SystemConfig.load("node", MachineConfig.load("tiny"), 2))
    assert verify_links(sp.system, sp.chips) == []
    vals = random_values(g, 0)
    r = run_system(sp, vals)
    assert api.check(g, sp.chips[0], vals, r)["ok"] and r.cycles == sp.predicted_cycles


def test_multi_chip_bounds(mlp2):
    """benchmarks/bounds.py for systems: no schedule over N chips beats `any`; a Megatron-style
    split needs one all-reduce per attention and one per MLP (two a transformer layer)."""
    from benchmarks import bounds as B
    g, sp = mlp2
    b = B.system_bounds(g, sp.system.machine, sp.system, 2)
    assert sp.predicted_cycles >= b["any"] > 0 and b["pp"] >= b["one_chip"] >= b["any"]
    for name, params, layers in (("bert_large", {"L": 2, "D": 64, "H": 2, "S": 16}, 2),
                                 ("llama2_7b_decode", {"L": 3, "D": 128, "H": 4, "F": 256, "C": 32, "T": 5}, 3)):
        path = os.path.join(ROOT, "programs", "systems", f"{name}.lpu")
        with open(path) as f:
            g = elaborate_source(f.read(), path, params)
        coll = B.tp_collectives(g)
        assert [k for k, _ in coll] == ["all-reduce"] * (2 * layers), coll
        s = SystemConfig.load("node", MachineConfig.load("tsp-v1"), 4)
        b4 = B.system_bounds(g, s.machine, s, 4)
        assert b4["tp_links"] == sum(B.collective_cycles(k, n, 4, s) for k, n in coll) > 4 * s.hop_cycles


def test_chips_let_go_when_done_give_the_same_result(mlp2, monkeypatch):
    """A large group drops each chip's prepared program when it ends (emulator/system_group.py
    KEEP_BELOW): the same outputs and cycles, and the next run prepares it again."""
    import lpu.emulator.system_group as S
    g, sp = mlp2
    vals = random_values(g, 1)
    want = run_system(sp, vals)
    monkeypatch.setattr(S, "KEEP_BELOW", 0)
    got = run_system(sp, vals)
    assert all("_emulator_prepared" not in p.__dict__ for p in sp.chips)
    again = run_system(sp, vals)
    for r in (got, again):
        assert r.cycles == want.cycles and [c.cycles for c in r.chips] == [c.cycles for c in want.chips]
        for k in want.outputs:
            np.testing.assert_array_equal(r.outputs[k], want.outputs[k])
