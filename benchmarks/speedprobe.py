"""Child process of the emulator speed benchmark: load a compiled binary, then time its emulation
and a float32 numpy evaluation of the same IR (benchmarks/npref.py) alternately, `repeats` times
each after one untimed run of both (and a resident run, `run(..., resident=True)`: the weights and
states left in SRAM by the run before, only the inputs loaded, as numpy's weights are prepared
once outside its timing), and print one JSON line: every time, the medians, numpy's
BLAS and its thread setting. The parent runs it once with the default threads and once with
every BLAS/OpenMP thread variable set to 1, so both figures come from the same code.
Usage: python -m benchmarks.speedprobe PROG.lpubin PARAMS_JSON REPEATS"""
from __future__ import annotations

import json
import os
import statistics
import sys
import time

THREAD_VARS = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "BLIS_NUM_THREADS")


def blas_name() -> str:
    import numpy
    try:
        blas = numpy.show_config(mode="dicts")["Build Dependencies"]["blas"]
        return f"{blas.get('name', '?')} {blas.get('version', '')}".strip()
    except Exception:   # noqa: BLE001 - older numpy: no dict mode
        return "unknown"


def threads() -> str:
    set_ = {v: os.environ[v] for v in THREAD_VARS if v in os.environ}
    return ", ".join(f"{k}={v}" for k, v in set_.items()) or f"default ({os.cpu_count()} CPUs)"


def main(argv: list[str]) -> int:
    from benchmarks import npref
    from lpu.api import graph_of_binary, inputs_for
    from lpu.emulator.run import run
    from lpu.isa.encoding import load_binary
    prog = load_binary(argv[0], None)
    graph = graph_of_binary(prog)          # with the params the binary records
    if graph is None:
        raise SystemExit("the binary's source does not rebuild its IR graph")
    repeats = int(argv[2]) if len(argv) > 2 else 5
    values = inputs_for(graph, prog, 0)
    leaves = npref.prepare(graph, values)
    nodes = graph.nodes()
    inputs = {y.name: values[y.name] for y in prog.symbols if y.kind == "input"}
    res = run(prog, values)                      # untimed: JIT cache load, preparation, page-in
    npref.evaluate(graph, leaves, nodes)
    emu, nump, kept = [], [], []
    for _ in range(repeats):                     # alternately, so a noisy neighbour hits both alike
        t0 = time.perf_counter()
        run(prog, values)
        emu.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        npref.evaluate(graph, leaves, nodes)
        nump.append(time.perf_counter() - t0)
        t0 = time.perf_counter()                 # weights and states kept in SRAM: only the inputs loaded
        run(prog, inputs, resident=True)
        kept.append(time.perf_counter() - t0)
    print(json.dumps({"emulation_s": emu, "numpy_s": nump, "resident_s": kept,
                      "emulation_median_s": statistics.median(emu), "resident_median_s": statistics.median(kept),
                      "numpy_median_s": statistics.median(nump), "cycles": int(res.cycles),
                      "instructions": int(res.instructions), "blas": blas_name(), "threads": threads()}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
