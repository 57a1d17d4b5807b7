"""Child process of the system benchmark (benchmarks/systems.py), so that each figure has its
own peak resident memory: `compile PROG.lpu CHIPS OUT.lpubin [NAME=V ...] [--parallel=pp|tp|auto]` (default: the CLI's)
compiles for a system and writes the bundle; `run OUT.lpubin WORKERS [check] [warm]` makes its inputs and emulates it
(timed together, since with workers they overlap; warm: once before the timed run); `one PROG.lpu [NAME=V ...]` runs a program on one chip in the plain emulator.
Prints one JSON line (wall time, CPU time of the run with its workers, peak RSS = ru_maxrss, cycles, ...)."""
from __future__ import annotations

import json
import resource
import sys
import time
from types import SimpleNamespace


def _peak() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024      # KiB on Linux


def _cpu() -> float:
    """User + system CPU seconds of this process and of the workers it has waited for (with the
    workers those start: emulator/system_workers.py `_fork`)."""
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def main(argv: list[str]) -> int:
    from lpu.cmd_system import compile_for, declared
    from lpu.compiler.driver import CompileStats
    mode, path = argv[0], argv[1]
    if mode == "compile":
        from lpu.isa.bundle import save_bundle
        chips, out, params = argv[2], argv[3], [p for p in argv[4:] if not p.startswith("--parallel=")]
        parallel = next((p.split("=", 1)[1] for p in argv[4:] if p.startswith("--parallel=")), None)
        t0 = time.perf_counter()
        sp, _ = compile_for(SimpleNamespace(program=path, params=params, machine=None, chips=chips, parallel=parallel),
                            CompileStats())
        wall = time.perf_counter() - t0
        save_bundle(sp, out)
        print(json.dumps({"wall_s": wall, "cpu_s": time.process_time(), "peak_rss_bytes": _peak(),
                          "chips": len(sp.chips), "parallel": sp.parallel,
                          "predicted_cycles": int(sp.predicted_cycles), "instructions": int(sp.n_instructions),
                          "per_chip_cycles": [int(p.predicted_cycles) for p in sp.chips]}))
        return 0
    from lpu import api
    from lpu.emulator.system import run_system
    if mode == "one":                       # the one-chip rate: PROG.lpu [NAME=V ...] in the plain emulator
        from lpu.args import parse_params
        from lpu.emulator.run import run
        prog, graph = api.compile(path, parse_params(argv[2:]), None)
        values = api.inputs_for(graph, prog, 0)
        run(prog, values)                   # warm
        t0 = time.perf_counter()
        r = run(prog, values)
        print(json.dumps({"wall_s": time.perf_counter() - t0, "cycles": int(r.cycles),
                          "instructions": int(r.instructions), "peak_rss_bytes": _peak()}))
        return 0
    from lpu.emulator.system import start
    workers, check = int(argv[2]), "check" in argv[3:]
    sp, graph = compile_for(SimpleNamespace(program=path, params=[], machine=None, chips=None), CompileStats())
    decl = declared(sp)
    if "warm" in argv[3:]:
        run_system(sp, api.inputs_for(graph if check else None, decl, 0), workers=workers)
    c0 = _cpu()
    t0 = time.perf_counter()                # as lpu run: workers start first, the values are made meanwhile
    started = start(sp, decl.symbols, workers, own=not check)      # a check needs every value here
    values = api.inputs_for(graph if check else None, decl, 0, into=started.arrays if started else None, defer=started)
    inputs = time.perf_counter() - t0
    r = run_system(sp, values, workers=workers, started=started)
    wall = time.perf_counter() - t0
    out = {"wall_s": wall, "cpu_s": _cpu() - c0, "inputs_s": inputs, "peak_rss_bytes": _peak(), "cycles": int(r.cycles),
           "predicted_cycles": int(sp.predicted_cycles), "instructions": int(sum(c.instructions for c in r.chips)),
           "windows": r.windows}
    if check:
        c = api.check(graph, sp.chips[0], values, r)
        out["check"] = {"ok": bool(c["ok"]), "max_abs_err": float(c["max_abs_err"]), "max_rel_err": float(c["max_rel_err"])}
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
