"""`lpu trace` (a pipeline diagram in the terminal) and what `lpu run` does with --trace,
--cycles, --report and --plot once the emulator has finished."""
from __future__ import annotations

import json
import sys

from lpu.args import add_window, parse_params
from lpu.isa.errors import LpuError

DEFAULT_WINDOW = 60


def add_parser(sub, common):
    p = sub.add_parser("trace", help="print a pipeline diagram: units by cycles, one mnemonic per cell",
                       description="Rows are functional units, columns cycles. Reads a program (compiles or "
                                   "loads and runs it) or a trace written by `lpu run --trace`.")
    p.add_argument("source", help="PROG.lpu, PROG.lpubin or TRACE.json")
    add_window(p, f"to draw (default 0:{DEFAULT_WINDOW})")
    p.add_argument("--units", help="comma-separated unit kinds to show: mxm,vxm,sxm,mem (default: all active)")
    p.add_argument("--seed", type=int, default=0, help="seed for the input values (default 0)")
    common(p)


def _kinds(text):
    if not text:
        return None
    kinds = {k.strip().lower() for k in text.split(",") if k.strip()}
    bad = sorted(kinds - {"mxm", "vxm", "sxm", "mem", "icu"})
    if bad:
        raise LpuError(f"--units: unknown unit kind(s) {', '.join(bad)} (choose from mxm, vxm, sxm, mem)")
    return kinds


def _run_traced(path, params, machine, seed):
    from lpu import api
    prog, graph = api.compile(path, params, machine)
    result = api.run(prog, api.inputs_for(graph, prog, seed), trace=True)
    return prog, result


def cmd_trace(a):
    from lpu.emulator import trace as T
    kinds = _kinds(a.units)
    if a.source.endswith(".json"):
        try:
            with open(a.source) as f:
                doc = json.load(f)
        except OSError as e:
            raise LpuError(f"{a.source}: {e.strerror}") from None
        except ValueError as e:
            raise LpuError(f"{a.source}: not JSON ({e})") from None
        cells = T.cells_of_trace(doc, a.source)
        title = f"{doc.get('otherData', {}).get('program', a.source)} (from {a.source})"
    else:
        prog, result = _run_traced(a.source, parse_params(a.params), a.machine, a.seed)
        cells = T.cells_of_records(T.records(prog, result.trace, result.cycles))
        title = f"{prog.source_name or a.source} on {prog.machine.name}"
    lo, hi = T.parse_window(a.cycles, cells.cycles, "--cycles") or (0, DEFAULT_WINDOW)
    hi = min(hi, max(cells.cycles, lo + 1))
    text, rows = T.diagram(cells, lo, hi, kinds)
    if a.json:
        print(json.dumps({"source": a.source, "cycles": [lo, hi], "total_cycles": cells.cycles,
                          "rows": [{"unit": n, "cells": c} for n, c in rows]}))
    else:
        print(f"{title}: cycles {lo}:{hi} of {cells.cycles:,}")
        sys.stdout.write(text)
    return 0


def after_run(args, prog, result, info):
    """--trace / --report / --plot of `lpu run` (the run kept a trace when any was given)."""
    want_trace, want_report, want_plot = (getattr(args, k, None) for k in ("trace", "report", "plot"))
    if getattr(args, "cycles", None) and not want_trace:
        raise LpuError("--cycles needs --trace FILE.json (it is the window of cycles the trace keeps)")
    if not (want_trace or want_report or want_plot):
        return
    from lpu.emulator import report as R
    from lpu.emulator import trace as T
    from lpu.api import write_atomic
    r = T.records(prog, result.trace, result.cycles)
    if want_trace:
        window = T.parse_window(args.cycles, result.cycles, "--cycles")
        doc, notes = T.chrome_trace(r, window)
        for n in notes:
            print(n, file=sys.stderr)

        def write(tmp):
            with open(tmp, "w") as f:
                json.dump(doc, f, separators=(",", ":"))
        write_atomic(want_trace, write)
        info["trace"] = want_trace
    if want_plot:
        write_atomic(want_plot, lambda tmp: R.plot(r, tmp))
        info["plot"] = want_plot
    if want_report:
        rep = R.report(r)
        info["report"] = rep
        if not args.json:
            sys.stdout.write(R.format_report(rep))


HANDLERS = {"trace": cmd_trace}
