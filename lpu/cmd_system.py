"""`--chips N|auto` on `lpu compile` and `lpu run`, and `lpu disasm` of a system bundle: a
program partitioned over the chips of a system (compiler/system.py), emulated chip by chip
(emulator/system.py). lpu/cli.py hands over to these when --chips is given or the file is a
bundle (isa/bundle.py)."""
from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import replace
from types import SimpleNamespace

import numpy as np

from lpu.args import Progress, compile_detail, parse_params, report_check
from lpu.isa.errors import CapacityError, LpuError
from lpu.outputs import write_atomic

LOADED = ("input", "weight", "state")


def parse_chips(text) -> int | str | None:
    if text is None:
        return None
    if text == "auto":
        return "auto"
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise LpuError(f"--chips expects a positive number of chips or 'auto', got '{text}'")
    return n


def wants_system(a, path: str | None) -> bool:
    return getattr(a, "chips", None) is not None or (path is not None and _is_bundle_file(path))


def _is_bundle_file(path: str) -> bool:
    from lpu.isa.bundle import _PRE, is_bundle
    try:
        with open(path, "rb") as f:
            return is_bundle(f.read(_PRE))
    except OSError:
        return False


def fits_hint(e: CapacityError) -> CapacityError:
    """Today's error for a program too large for one chip, with the way out."""
    if "--chips" in e.message:
        return e
    return CapacityError(e.message + "; compile it for several chips with --chips N or --chips auto", **e.info)


def compile_for(a, stats, compiled=None):
    """(SystemProgram, graph or None) of a.program: a .lpu compiled for --chips, or a bundle;
    `compiled(sp)` is called as soon as the SystemProgram exists (a bundle's graph is made
    after it)."""
    from lpu.compiler.system import SystemProgram, compile_auto, compile_system
    from lpu.isa.system import SystemConfig
    from lpu.api import machine_of
    path, params = a.program, parse_params(a.params)
    if _is_bundle_file(path):
        from lpu.isa.bundle import decode_bundle
        from lpu.isa.errors import BinaryError
        with open(path, "rb") as f:
            data = f.read()
        try:
            system, progs, outputs, bparams, rows = decode_bundle(data)
        except BinaryError as e:
            raise BinaryError(f"{path}: {e.message}") from None
        chips = parse_chips(getattr(a, "chips", None))
        if isinstance(chips, int) and chips != system.chips:
            raise LpuError(f"{path}: the bundle is compiled for {system.chips} chips, --chips says {chips}; recompile")
        differ = [k for k, v in params.items() if bparams.get(k) != v]
        if differ:
            raise LpuError(f"{path}: -p {differ[0]}={params[differ[0]]}: the bundle was compiled with "
                           f"{differ[0]}={bparams.get(differ[0])}; recompile the program with the new values")
        tp = any(v and isinstance(v[0], tuple) for r in rows for v in r.values())
        sp = SystemProgram(system, progs, outputs, bparams, rows, "tp" if tp else "pp")
        if compiled:
            compiled(sp)
        return sp, _graph_of_bundle(sp)
    if not os.path.isfile(path):
        raise LpuError(f"{path}: no such file")
    from lpu.compiler.frontend import elaborate_file
    graph = elaborate_file(path, params)
    system = SystemConfig.load(getattr(a, "system", None) or "node", machine_of(a.machine), 1)
    chips = parse_chips(a.chips) or 1
    t0 = time.perf_counter()
    parallel = getattr(a, "parallel", None) or ("auto" if chips == "auto" else "pp")
    if chips == "auto":
        sp = compile_auto(graph, system, stats, parallel=parallel)
    else:
        sp = compile_system(graph, replace(system, chips=chips), stats, parallel)
    stats.pass_seconds.setdefault("system", time.perf_counter() - t0)
    if compiled:
        compiled(sp)
    return sp, graph


def _graph_of_bundle(sp):
    """The graph of the bundle's embedded source with its params, if it declares the tensors
    the chips load (else None: no --check, inputs from the chips' symbols)."""
    p = sp.chips[0]
    if not p.source_lines:
        return None
    from lpu.compiler.frontend import elaborate_source
    try:
        g = elaborate_source("\n".join(p.source_lines) + "\n", p.source_name, dict(sp.params))
    except LpuError:
        return None
    want = {s.name: (s.dtype, tuple(s.shape)) for s in declared(sp).symbols}
    have = {name: (g.node(nid).dtype, tuple(g.node(nid).shape)) for name, nid in g.decls.items()}
    return g if want == have else None


def declared(sp):
    """Every input, weight and state of the system's chips, once (a stand-in Program for
    api.inputs_for)."""
    from lpu.emulator.system import part_index
    seen, length = {}, {}
    for c, p in enumerate(sp.chips):
        rows = sp.rows[c] if sp.rows else {}
        for s in p.symbols:
            if s.kind in LOADED and s.name not in seen:
                seen[s.name] = s
            if s.name in rows:                  # a split tensor: as long as the last part held, per axis
                stops = [ix.stop for ix in part_index(rows[s.name])]
                old = length.get(s.name, [0] * len(stops))
                length[s.name] = [max(a, b) for a, b in zip(old, stops)]
    return SimpleNamespace(symbols=[replace(s, shape=tuple(length[s.name]) + tuple(s.shape[len(length[s.name]):]))
                                    if s.name in length else s for s in seen.values()])


def per_chip_compile(sp) -> list:
    m = sp.system.machine
    return [{"chip": c, "instructions": p.n_instructions, "predicted_cycles": int(p.predicted_cycles),
             "resident_bytes": int(sum(s.slices.size for s in p.symbols) * m.lanes)}
            for c, p in enumerate(sp.chips)]


def compile_info(a, sp) -> dict:
    m = sp.system.machine
    chips = per_chip_compile(sp)
    return {"program": sp.chips[0].source_name or a.program, "machine": m.name, "chips": len(sp.chips),
            "parallel": sp.parallel,
            "instructions": sp.n_instructions, "predicted_cycles": int(sp.predicted_cycles),
            "time_us": sp.predicted_cycles / m.clock_mhz,
            "sram_bytes": max(c["resident_bytes"] for c in chips), "chips_needed": len(sp.chips),
            "link": {"slot_cycles": sp.system.slot_cycles, "hop_cycles": sp.system.hop_cycles},
            "per_chip": chips}


def cmd_compile(a, stats) -> int:
    from lpu.isa.bundle import save_bundle
    if a.emit:
        raise LpuError("--emit with --chips: not supported yet (compile with -o and use lpu disasm)")
    with Progress.for_args(a).stage(f"compiling {a.program} for {a.chips} chips", lambda: compile_detail(stats)):
        sp, _ = compile_for(a, stats)
    if a.output:
        write_atomic(a.output, lambda tmp: save_bundle(sp, tmp))
    info = compile_info(a, sp)
    if a.json:
        print(json.dumps(info))
    else:
        print(f"{a.program}: {len(sp.chips)} chips ({sp.parallel}), {info['instructions']:,} instructions, {info['predicted_cycles']:,} "
              f"cycles ({info['time_us']:.2f} us at {sp.system.machine.clock_mhz} MHz)"
              + (f", written to {a.output}" if a.output else ""))
        for c in info["per_chip"]:
            print(f"  chip {c['chip']}: {c['predicted_cycles']:,} cycles, {c['instructions']:,} instructions, "
                  f"{c['resident_bytes']:,} bytes resident")
    return 0


def cmd_run(a, stats) -> int:
    from lpu import api
    from lpu.emulator import system
    for opt in ("plot", "report"):
        if getattr(a, opt, None):
            raise LpuError(f"--{opt} with several chips: not supported yet")
    if a.cycles and not a.trace:
        raise LpuError("--cycles needs --trace FILE.json (it is the window of cycles the trace keeps)")
    progress = Progress.for_args(a)
    t0 = time.perf_counter()
    workers = []     # --workers N: started as soon as the chips' programs exist, they prepare the chips
                     # while the graph and the values are made (system.start)

    def start(sp):
        w = None if a.ray else system.start(sp, declared(sp).symbols, a.workers or 0, bool(a.trace),
                                            own=not a.check)     # a check needs every value here
        workers.extend([w] if w else [])
    try:
        with progress.stage(f"compiling {a.program}", lambda: compile_detail(stats)):
            sp, graph = compile_for(a, stats, start)
        compile_s = time.perf_counter() - t0
        decl = declared(sp)
        t0 = time.perf_counter()
        started = workers[0] if workers else None
        given = api.load_npz(a.inputs, None) if a.inputs else {}
        values = api.inputs_for(graph, decl, a.seed, given, f"--inputs {a.inputs}",
                                started.arrays if started else None, started)
        inputs_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        with progress.stage(f"emulating {len(sp.chips)} chips, {sp.predicted_cycles:,} cycles"):
            result = system.run_system(sp, values, workers=a.workers or 0, ray_address=a.ray, trace=bool(a.trace),
                                       started=started)
    finally:
        for w in workers:
            w.close()
    wall = time.perf_counter() - t0
    m = sp.system.machine
    chips = []
    for c, (p, r) in enumerate(zip(sp.chips, result.chips)):
        chips.append({"chip": c, "cycles": int(r.cycles), "predicted_cycles": int(p.predicted_cycles),
                      "instructions": int(r.instructions),
                      "link_vectors_sent": r.counters["link_vectors_sent"],
                      "link_vectors_received": r.counters["link_vectors_received"],
                      "utilization": {k: round(float(v), 4) for k, v in r.utilization.items()}})
    util = {k: round(float(np.mean([c["utilization"][k] for c in chips])), 4) for k in chips[0]["utilization"]}
    info = {"program": sp.chips[0].source_name or a.program, "machine": m.name, "chips": len(sp.chips),
            "cycles": int(result.cycles), "predicted_cycles": int(sp.predicted_cycles),
            "time_us": result.cycles / m.clock_mhz, "instructions": sum(c["instructions"] for c in chips),
            "instructions_compiled": sp.n_instructions, "wall_s": round(wall, 4), "compile_s": round(compile_s, 4),
            "inputs_s": round(inputs_s, 4),
            "params": dict(sp.params), "workers": a.workers or 0, "ray": a.ray, "windows": result.windows,
            "utilization": util, "per_chip": chips}
    if a.check:
        if graph is None:
            raise LpuError(f"{a.program}: --check needs the program's source, which this bundle does not carry")
        info["check"] = api.check(graph, sp.chips[0], values, result)
    if a.save:
        arrays = {**{k: np.asarray(v) for k, v in result.outputs.items()},
                  **{k: np.asarray(v) for k, v in result.states.items()}}
        write_atomic(a.save, lambda tmp: _savez(tmp, arrays))
    if a.trace:
        _write_trace(a, sp, result, info)
    if a.json:
        print(json.dumps(info))
    else:
        print(f"{info['program']} on {len(sp.chips)} x {m.name}: {info['cycles']:,} cycles ({info['time_us']:.2f} us), "
              f"predicted {info['predicted_cycles']:,}; {info['instructions']:,} instructions executed in {wall:.2f} s")
        for c in chips:
            print(f"  chip {c['chip']}: {c['cycles']:,} cycles (predicted {c['predicted_cycles']:,}), "
                  f"{c['instructions']:,} instructions, {c['link_vectors_sent']:,} vectors sent, "
                  f"{c['link_vectors_received']:,} received")
        if "check" in info:
            c = info["check"]
            print(f"check: {'ok' if c['ok'] else 'MISMATCH'} (max abs err {c['max_abs_err']:.3g}, "
                  f"max rel err {c['max_rel_err']:.3g})")
    if a.check and not info["check"]["ok"]:
        print(f"error: the emulator's outputs differ from the reference ({info['check']['worst']})", file=sys.stderr)
        return 2
    return 0


def _write_trace(a, sp, result, info) -> None:
    from lpu.emulator import trace as T
    from lpu.emulator.system_trace import system_trace
    doc, notes = system_trace(sp, result, T.parse_window(a.cycles, result.cycles, "--cycles"))
    for n in notes:
        print(n, file=sys.stderr)

    def write(tmp):
        with open(tmp, "w") as f:
            json.dump(doc, f, separators=(",", ":"))
    write_atomic(a.trace, write)
    info["trace"] = a.trace


def _savez(path, arrays):
    with open(path, "wb") as f:
        np.savez(f, **arrays)


def cmd_disasm(a) -> int:
    from lpu.isa.asm import disassemble
    from lpu.isa.bundle import decode_bundle
    from lpu.isa.errors import BinaryError
    with open(a.binary, "rb") as f:
        data = f.read()
    try:
        system, progs, outputs, params, _ = decode_bundle(data)
    except BinaryError as e:
        raise BinaryError(f"{a.binary}: {e.message}") from None
    parts = [f"; system bundle: {system.chips} chips of {system.machine.name}, link slot {system.slot_cycles} cycles, "
             f"hop {system.hop_cycles} cycles\n"]
    for c, p in enumerate(progs):
        parts.append(f"\n; ==== chip {c} ====\n")
        parts.append(disassemble(p))
    text = "".join(parts)
    if a.output:
        write_atomic(a.output, lambda tmp: open(tmp, "w").write(text))
    if a.json:
        info = {"binary": a.binary, "chips": system.chips, "machine": system.machine.name, "params": params,
                "per_chip": [{"chip": c, "instructions": p.n_instructions, "predicted_cycles": int(p.predicted_cycles)}
                             for c, p in enumerate(progs)]}
        if not a.output:
            info["text"] = text
        print(json.dumps(info))
    elif not a.output:
        sys.stdout.write(text)
    return 0


def cmd_verify(a) -> int:
    """`lpu verify` of a bundle or of a program compiled with --chips: every chip and every link."""
    from lpu.compiler.driver import CompileStats
    from lpu.compiler.verify_links import verify_links
    sp, _ = compile_for(a, CompileStats())
    t0 = time.perf_counter()
    found = verify_links(sp.system, sp.chips, a.limit)
    wall = time.perf_counter() - t0
    return report_check(a, found, wall, {"program": sp.chips[0].source_name or a.program, "machine": sp.system.machine.name,
                                   "chips": len(sp.chips), "instructions": sp.n_instructions},
                  f"{len(sp.chips)} chips, {sp.n_instructions:,} instructions on {sp.system.machine.name}, "
                  "every link matched")


def _layout(sp, n: int) -> dict:
    """How the chips share the program, in words, for compare's LPU line."""
    if sp.parallel != "tp":
        return {"bound": f"a pipeline of {n} chips", "bound_reason": "stages run one after the other, joined by links"}
    node = min(n, sp.system.chips_per_node)
    if n <= node:
        return {"bound": f"{n} chips in tensor parallel", "bound_reason": "weights split by columns and rows, "
                "all-reduces on the links"}
    return {"bound": f"{n} chips: a pipeline of {n // node} nodes of {node} in tensor parallel",
            "bound_reason": "each node's chips split their layers' weights; the nodes run one after the other"}


def lpu_side(path: str, params: dict, machine, chips, emulate: bool, progress=None) -> tuple[dict, object]:
    """`lpu compare --chips`: the LPU side of a system (its total; per line is one chip's notion),
    and the graph."""
    from lpu.compiler.driver import CompileStats
    if progress:
        progress(f"compiling {path} for {chips} chips ...")
    a = SimpleNamespace(program=path, params=[f"{k}={v}" for k, v in params.items()], machine=machine, chips=chips)
    sp, graph = compile_for(a, CompileStats())
    if graph is None:
        raise LpuError(f"{path}: compare costs the program's IR, which is rebuilt from the source a bundle carries; "
                       f"this one carries none")
    m = sp.system.machine
    n = len(sp.chips)
    out = {"machine": m.name, "clock_mhz": m.clock_mhz, "chips": n, "chips_needed": n,
           "cycles": int(sp.predicted_cycles), "time_us": sp.predicted_cycles / m.clock_mhz, "source": "schedule",
           **_layout(sp, n),
           "per_chip_cycles": [int(p.predicted_cycles) for p in sp.chips]}
    if emulate:
        from lpu import api
        from lpu.emulator.system import run_system
        if progress:
            progress(f"emulating {n} chips, {sp.predicted_cycles:,} cycles ...")
        values = api.inputs_for(graph, declared(sp), 0)
        result = run_system(sp, values)
        out.update(source="emulation", predicted_cycles=out["cycles"], cycles=int(result.cycles),
                   time_us=result.cycles / m.clock_mhz, check=api.check(graph, sp.chips[0], values, result))
    return out, graph
