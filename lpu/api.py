"""The thin public API that wires the stages: `compile`, `run`, `check`.

    import lpu.api as lpu
    prog, graph = lpu.compile("programs/mlp.lpu", params={"S": 32}, machine="tiny")
    result = lpu.run(prog, lpu.inputs_for(graph, prog, seed=0))
    again = lpu.run(prog, {"x": new_x}, resident=True)   # weights and states stay in SRAM
"""
from __future__ import annotations

import os

import numpy as np

from lpu.compiler.driver import CompileStats, compile_file, compile_source
from lpu.compiler.ir import IRGraph
from lpu.isa.errors import LpuError
from lpu.isa.machine import MachineConfig
from lpu.isa.program import Program
from lpu import npz
from lpu.outputs import write_atomic


def machine_of(name_or_path: str | MachineConfig | None) -> MachineConfig:
    if isinstance(name_or_path, MachineConfig):
        return name_or_path
    return MachineConfig.load(name_or_path or "tsp-v1")


def compile(path: str, params: dict | None = None, machine=None, stats: CompileStats | None = None,
            graph: bool = True) -> tuple[Program, IRGraph | None]:
    """Compile a .lpu file, or load a .lpubin (whose graph is rebuilt from its embedded source,
    with the params it was compiled with, only if `graph`: elaborating it is work the binary does
    not need, done within the limits). `params` given for a binary must agree with its own."""
    m = machine_of(machine)
    if path.endswith(".lpubin") or _starts_with_magic(path):
        from lpu.isa.encoding import load_binary
        prog = load_binary(path, m if machine is not None else None)
        check_binary_params(prog, params or {}, path)
        return prog, (graph_of_binary(prog) if graph else None)
    if not os.path.exists(path):
        raise LpuError(f"{path}: no such file")
    if os.path.isdir(path):
        raise LpuError(f"{path}: is a directory, not a .lpu program")
    if path.endswith((".s", ".asm")):
        raise LpuError(f"{path}: looks like assembly text; turn it into a binary first: lpu asm {path} -o PROG.lpubin")
    from lpu.isa.limits import how_to_raise, limit
    if os.path.isfile(path) and os.path.getsize(path) > limit("source_bytes"):
        raise LpuError(f"{path}: the program is too large: {os.path.getsize(path):,} bytes; {how_to_raise('source_bytes')}")
    try:
        return compile_file(path, params or {}, m, stats)
    except UnicodeDecodeError as e:
        raise LpuError(f"{path}: not a .lpu program (not UTF-8 text: byte {e.start} is {e.object[e.start]:#04x})") from None
    except OSError as e:
        raise LpuError(f"{path}: cannot read: {e.strerror or e}") from None


def _starts_with_magic(path: str) -> bool:
    from lpu.isa.encoding import MAGIC
    try:
        with open(path, "rb") as f:
            return f.read(len(MAGIC)) == MAGIC
    except OSError:
        return False


def check_binary_params(prog: Program, given: dict, path: str) -> None:
    """A binary remembers its params: `-p` values given with it must be the ones it was built with."""
    if not given:
        return
    unknown = sorted(k for k in given if k not in prog.params)
    if unknown:
        known = ", ".join(f"{k}={v}" for k, v in sorted(prog.params.items())) or "none recorded"
        raise LpuError(f"{path}: -p {unknown[0]}: the binary has no param {unknown[0]} (it was compiled with {known})")
    differ = [f"{k}={v} (compiled with {k}={prog.params[k]})" for k, v in sorted(given.items()) if prog.params[k] != v]
    if differ:
        raise LpuError(f"{path}: -p {', '.join(differ)}: a binary is fixed to its params; recompile the "
                       f"program with the new values (lpu compile {prog.source_name or 'PROG.lpu'} -p ...)")


def graph_of_binary(prog: Program) -> IRGraph | None:
    """The IR graph of a binary's embedded source, elaborated with the params it was compiled
    with (for --check and random inputs), if it carries its source and the source declares the
    binary's tensors."""
    if not prog.source_lines:
        return None
    from lpu.compiler.frontend import elaborate_source
    try:
        graph = elaborate_source("\n".join(prog.source_lines) + "\n", prog.source_name, dict(prog.params))
    except LpuError as e:
        if "LPU_LIMIT_" in e.message:
            raise LpuError(f"the source stored in the binary exceeds a limit:\n{e.message}") from None
        return None
    declared = {s.name: (s.dtype, tuple(s.shape)) for s in prog.symbols if s.kind in ("input", "weight", "state")}
    rebuilt = {name: (graph.node(nid).dtype, tuple(graph.node(nid).shape)) for name, nid in graph.decls.items()}
    return graph if rebuilt == declared else None


def inputs_for(graph: IRGraph | None, prog: Program, seed: int = 0, given: dict | None = None,
               source: str = "--inputs", into: dict | None = None, defer=None) -> dict:
    """Values for every input, weight and state: the given ones, the rest from `seed` (made in
    `into[name]` where that is an array of the value's shape and dtype: emulator/system.py
    `start`; integers there by its workers with `defer`, the same values: compiler/reference.py
    `integers`). `source` names where `given` came from, in error messages."""
    given = dict(given or {})
    declared = {s.name: s for s in prog.symbols if s.kind in ("input", "weight", "state")}
    unknown = sorted(set(given) - set(declared))
    if unknown:
        from lpu.compiler.errors import did_you_mean
        hint = did_you_mean(unknown[0], declared)
        raise LpuError(f"{source} has {', '.join(repr(u) for u in unknown)}, which the program does not declare "
                       f"(it declares {', '.join(sorted(declared)) or 'nothing'})" + (f"; {hint}" if hint else ""))
    if graph is not None:
        from lpu.compiler.reference import random_values
        values = random_values(graph, seed, into, defer)
    else:
        values = _declared_values(declared, seed, into, defer)
    for name, arr in given.items():
        sym = declared[name]
        arr = np.asarray(arr)
        want = f"{sym.dtype}{list(sym.shape)}"
        if tuple(arr.shape) != tuple(sym.shape):
            raise LpuError(f"{source}: '{name}' has shape {list(arr.shape)}, the program declares {want}")
        is_int = sym.dtype in ("i8", "i32")
        if arr.dtype.kind not in ("iu" if is_int else "iuf"):
            raise LpuError(f"{source}: '{name}' is {arr.dtype}, the program declares {want}"
                           + ("" if is_int else " (give floats or integers)"))
        if is_int and arr.size:
            info = np.iinfo(np.int8 if sym.dtype == "i8" else np.int32)
            lo, hi = int(info.min), int(info.max)
            if int(arr.min()) < lo or int(arr.max()) > hi:
                raise LpuError(f"{source}: '{name}' holds values outside {sym.dtype} range {lo}..{hi}")
        if arr.dtype.kind == "f" and not np.all(np.isfinite(arr)):
            bad = tuple(int(i) for i in np.argwhere(~np.isfinite(arr))[0])
            raise LpuError(f"{source}: '{name}' holds NaN or infinity (first at index {list(bad)})")
        with np.errstate(over="ignore"):
            values[name] = arr.astype(values[name].dtype if values.get(name) is not None else arr.dtype)
        if values[name].dtype.kind == "f" and not np.all(np.isfinite(values[name])):
            raise LpuError(f"{source}: '{name}' holds values too large for {sym.dtype}")
    return values


def _declared_values(declared: dict, seed: int, into: dict | None, defer=None) -> dict:
    """Values from the symbols alone (no graph): integers in [-8, 8], floats N(0, 0.1)."""
    from lpu.compiler.reference import integers, into_array, normals
    rng = np.random.default_rng(seed)
    values = {}
    for s in declared.values():
        if s.dtype in ("i8", "i32"):
            dt = np.int8 if s.dtype == "i8" else np.int32
            values[s.name] = integers(rng, s.name, s.shape, dt, into_array(into, s.name, s.shape, dt), defer)
        else:
            dt = np.float16 if s.dtype == "f16" else np.float32
            at = into_array(into, s.name, s.shape, dt)
            values[s.name] = normals(rng, s.shape, 0.1, lambda b, dt=dt: b.astype(dt),
                                     np.empty(s.shape, dt) if at is None else at)
    if defer is not None and not defer.check():      # a deferred draw was rejected: all made here
        return _declared_values(declared, seed, into)
    return values


def run(prog: Program, values: dict, trace: bool = False, resident: bool = False):
    """Emulate `prog` on `values`; resident: tensors left out keep what the previous run of
    `prog` left in SRAM (emulator/run.py `run`)."""
    from lpu.emulator.run import run as emulate
    return emulate(prog, values, trace=trace, resident=resident)


def check(graph: IRGraph, prog: Program, values: dict, result) -> dict:
    """Compare the emulator's outputs and final states with the numpy reference."""
    from lpu.compiler.reference import run_reference
    from lpu.compiler.semantics import TOLERANCE
    outs, states = run_reference(graph, values, k_tile=prog.machine.lanes)
    ok, max_abs, max_rel, worst = True, 0.0, 0.0, ""
    for kind, ref, got in (("output", outs, result.outputs), ("state", states, result.states)):
        for name, r in ref.items():
            if name not in got:
                continue
            e = np.asarray(got[name]).astype(np.float64)
            r64 = np.asarray(r).astype(np.float64)
            atol, rtol = TOLERANCE[_declared_dtype(graph, kind, name)]
            finite = np.isfinite(r64) & np.isfinite(e)
            same_inf = (r64 == e) | (np.isnan(r64) & np.isnan(e))
            with np.errstate(invalid="ignore", over="ignore"):
                diff = np.where(finite, np.abs(e - r64), np.where(same_inf, 0.0, np.inf))
                rel = diff / np.maximum(np.abs(r64), 1e-30)
            if diff.size:
                if float(diff.max()) > max_abs:
                    max_abs, worst = float(diff.max()), f"{kind} '{name}'"
                max_rel = max(max_rel, float(np.where(np.abs(r64) > atol, rel, 0).max()))
                if not np.all(diff <= atol + rtol * np.abs(np.where(finite, r64, 0))):
                    ok = False
    return {"ok": bool(ok), "max_abs_err": max_abs, "max_rel_err": max_rel, "worst": worst}


def _declared_dtype(graph: IRGraph, kind: str, name: str) -> str:
    """The dtype the program gives an output or state (bf16 values travel in float32 arrays,
    so the array's dtype cannot tell)."""
    nid = graph.outputs[name] if kind == "output" else graph.decls[name]
    return graph.node(nid).dtype


def load_npz(path: str, prog: Program | None = None) -> dict:
    """The arrays of an .npz file by name, or an LpuError saying why they cannot be read. With
    `prog`, each array's name, shape and dtype are checked against the tensors it declares from
    the .npy headers, before any array is loaded (lpu/npz.py)."""
    return npz.load_npz(path, prog)


__all__ = ["compile", "run", "check", "inputs_for", "machine_of", "write_atomic", "compile_source"]
