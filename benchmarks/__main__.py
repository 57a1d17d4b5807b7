"""The benchmark runner (issue 7): `python -m benchmarks [--quick] [--json] [--only SECTION,...]
[--machine M] [--limit S] [--out FILE]`.

Measures, in one run on this machine: emulator speed against a float32 numpy evaluation of the
same program, compile speed and its growth with depth, schedule quality against lower bounds
from the machine config (benchmarks/bounds.py), peak memory and `lpu run` start-up, and the cost
of tracing. Prints every figure with its target and a pass/FAIL mark, and writes the results as
JSON under benchmarks/results/ (after every section, atomically, so a run cut short keeps what
it measured)."""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import time

from benchmarks.suite import ROOT, SECTIONS, Bench

RESULTS = os.path.join(ROOT, "benchmarks", "results")


def _git_commit() -> str | None:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              cwd=ROOT, timeout=10).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def _environment(args) -> dict:
    import numba
    import numpy

    from benchmarks.speedprobe import blas_name, threads
    return {"date": datetime.date.today().isoformat(), "commit": _git_commit(), "machine": args.machine,
            "quick": args.quick, "python": platform.python_version(), "numpy": numpy.__version__,
            "numba": numba.__version__, "cpus": os.cpu_count(), "host": platform.machine(),
            "blas": blas_name(), "threads": threads()}


def write_json(path: str, doc: dict) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")
    os.replace(tmp, path)


def mark(it: dict) -> str:
    if it.get("error"):
        return "ERROR"
    if it.get("skipped"):
        return "skip"
    if it["ok"] is None:
        return ""
    return "pass" if it["ok"] else "FAIL"


def fmt_value(it: dict) -> str:
    v = it["value"]
    if v is None:
        return "-"
    if isinstance(v, float):
        s = f"{v:,.4g}" if abs(v) < 1000 else f"{v:,.0f}"
    elif isinstance(v, int):
        s = f"{v:,}"
    else:               # a figure already written out ("1,785,286 / True")
        s = str(v)
    return f"{s} {it['unit']}".strip()


def table(items: list) -> str:
    rows = [("section", "figure", "value", "target", "")]
    for it in items:
        note = it.get("error") or (f"skipped: {it['skipped']}" if it.get("skipped") else "")
        rows.append((it["section"], it["name"], fmt_value(it), it["target"] or "", mark(it) + (f"  {note}" if note else "")))
    w = [max(len(r[i]) for r in rows) for i in range(4)]
    return "\n".join(f"{r[0]:<{w[0]}}  {r[1]:<{w[1]}}  {r[2]:>{w[2]}}  {r[3]:<{w[3]}}  {r[4]}".rstrip() for r in rows)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="smaller params (a few minutes)")
    p.add_argument("--json", action="store_true", help="print one JSON object on stdout instead of the table")
    p.add_argument("--only", help=f"comma-separated sections: {','.join(SECTIONS)}")
    p.add_argument("--machine", default="tsp-v1", help="machine name or TOML file (default tsp-v1)")
    p.add_argument("--limit", type=float, help="seconds allowed per compile (default 600 quick, 3600 full)")
    p.add_argument("--out", help="results file (default benchmarks/results/DATE[-quick].json)")
    p.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    a = p.parse_args(argv)
    only = [s.strip() for s in a.only.split(",")] if a.only else list(SECTIONS)
    unknown = [s for s in only if s not in SECTIONS]
    if unknown:
        print(f"error: unknown section(s) {', '.join(unknown)}; choose from {', '.join(SECTIONS)}", file=sys.stderr)
        return 2
    limit = a.limit if a.limit is not None else (600 if a.quick else 3600)
    t_start = time.perf_counter()

    def log(msg):
        if not a.quiet:
            print(f"[{time.perf_counter() - t_start:7.1f} s] {msg}", file=sys.stderr, flush=True)

    env = _environment(a)
    suffix = "-quick" if a.quick else ""
    suffix += "" if a.machine == "tsp-v1" else f"-{os.path.splitext(os.path.basename(a.machine))[0]}"
    out = a.out or os.path.join(RESULTS, f"{env['date']}{suffix}.json")
    b = Bench(a.machine, a.quick, limit, log)
    items: list = []
    doc = {"environment": env, "sections": only, "complete": False, "items": items}
    for name in only:
        log(f"section {name}")
        items += SECTIONS[name](b)
        doc["wall_s"] = round(time.perf_counter() - t_start, 1)
        write_json(out, doc)
    doc["complete"] = True
    doc["summary"] = {"pass": sum(1 for it in items if it["ok"] is True),
                      "fail": sum(1 for it in items if it["ok"] is False),
                      "not measured": sum(1 for it in items if it.get("error") or it.get("skipped"))}
    write_json(out, doc)
    log(f"wrote {os.path.relpath(out, os.getcwd())}")
    if a.json:
        print(json.dumps(doc))
    else:
        print(f"benchmarks on {env['date']} (commit {env['commit']}, machine {a.machine}"
              f"{', --quick' if a.quick else ''}, {env['cpus']} CPUs, {doc['wall_s']:.0f} s)")
        print(f"numpy BLAS: {env['blas']}; threads: {env['threads']} (speed figures: default threads and 1 thread)")
        print(table(items))
        s = doc["summary"]
        print(f"{s['pass']} pass, {s['fail']} FAIL, {s['not measured']} not measured")
    return 0


if __name__ == "__main__":
    sys.exit(main())
