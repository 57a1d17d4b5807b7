"""The import graph of the project: no circles, `isa` imports nothing else of the project,
`emulator` nothing of `compiler`, and imports sit at the top of their module except where one
avoids a real start-up cost (ALLOWED, with the reason).

The graph comes from the source (ast), so it sees every module-level import, including those
that Python would resolve lazily."""
from __future__ import annotations

import ast
from pathlib import Path

import networkx as nx
import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("isa", "compiler", "emulator", "gpu_baseline")      # installed as lpu.<name>
TOP = "lpu"                                                       # the lpu/ folder: lpu.<module>

# (file, imported module) -> why the import is inside a function
ALLOWED = {
    ("compiler/driver.py", "lpu.compiler.frontend"):
        "the front end imports Lark (0.1-0.2 s); compiling an IR graph or running a binary needs none of it",
    ("compiler/ir.py", "networkx"): "0.14 s of every `lpu run` (1.8-2.0 s in all); only a pass that asks for "
                                    "the graph's networkx view needs it",
    ("emulator/report.py", "matplotlib"): "optional `plot` extra, and slow to import",
    ("emulator/report.py", "matplotlib.pyplot"): "optional `plot` extra, and slow to import",
    ("gpu_baseline/calibrate.py", "torch"): "only on a GPU machine, and slow to import",
    ("gpu_baseline/calibrate.py", "torch.profiler"): "only on a GPU machine, and slow to import",
}


def _module_name(path: Path) -> str:
    rel = path.relative_to(ROOT)
    parts = list(rel.with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts) if parts[0] == TOP else ".".join(["lpu", *parts])


def _files(folders) -> list[Path]:
    return sorted(p for f in folders for p in (ROOT / f).glob("*.py"))


def _known() -> set[str]:
    return {_module_name(p) for p in _files((*PACKAGES, TOP))}


def _resolve(name: str, known: set[str]) -> str | None:
    """The project module an import refers to (a package's __init__ if not a module)."""
    while name:
        if name in known:
            return name
        name = name.rpartition(".")[0]
    return None


def _imports(path: Path):
    """(module as written, imported name, at module level?) for every import of a file."""
    tree = ast.parse(path.read_text())
    funcs = [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))]
    inner = {id(m) for f in funcs for m in ast.walk(f) if m is not f}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                yield a.name, a.name, id(node) not in inner
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for a in node.names:        # `from lpu.compiler import ops` imports lpu.compiler.ops
                yield node.module, f"{node.module}.{a.name}", id(node) not in inner


def graph(folders) -> nx.DiGraph:
    known = _known()
    g = nx.DiGraph()
    for p in _files(folders):
        src = _module_name(p)
        g.add_node(src)
        for _, name, top in _imports(p):
            dst = _resolve(name, known)
            if dst and dst != src and top:
                g.add_edge(src, dst)
    return g


def test_packages_have_no_import_cycle():
    g = graph(PACKAGES)
    assert not list(nx.simple_cycles(g)), list(nx.simple_cycles(g))


def test_top_level_has_no_import_cycle():
    g = graph((*PACKAGES, TOP))
    known = _known()
    for p in _files((TOP,)):          # the CLI's lazy imports count here: they are its circle
        for _, name, _ in _imports(p):
            dst = _resolve(name, known)
            if dst and dst != _module_name(p):
                g.add_edge(_module_name(p), dst)
    assert not list(nx.simple_cycles(g)), list(nx.simple_cycles(g))


def test_isa_imports_nothing_else_of_the_project():
    g = graph(PACKAGES)
    bad = [(a, b) for a, b in g.edges if a.startswith("lpu.isa") and not b.startswith("lpu.isa")]
    assert not bad


def test_emulator_imports_nothing_of_the_compiler():
    g = graph(PACKAGES)
    bad = [(a, b) for a, b in g.edges if a.startswith("lpu.emulator") and b.startswith("lpu.compiler")]
    assert not bad


def test_no_function_level_imports_but_the_allowed():
    found = set()
    for p in _files(PACKAGES):
        for module, _, top in _imports(p):
            if not top:
                found.add((str(p.relative_to(ROOT)), module))
    assert found == set(ALLOWED), (found - set(ALLOWED), set(ALLOWED) - found)


# The command line imports the stages lazily: `lpu --help`, `--version` and a bad argument must
# not pay for Lark, networkx and Numba (about a second); in lpu/ only these may be imported
# inside a function.
LAZY_IN_CLI = ("lpu.api", "lpu.compiler", "lpu.emulator", "lpu.gpu_baseline", "lpu.isa", "matplotlib",
               "importlib.metadata", "zipfile")


def test_cli_imports_inside_functions_only_the_heavy_stages():
    bad = set()
    for p in _files((TOP,)):
        for _, name, top in _imports(p):
            if not top and not name.startswith(LAZY_IN_CLI):
                bad.add((str(p.relative_to(ROOT)), name))
    assert not bad, bad


def test_the_graph_sees_imports():
    """The test above would pass on an empty graph: check it finds known edges."""
    g = graph(PACKAGES)
    assert g.has_edge("lpu.compiler.lower_ops", "lpu.compiler.lower_common")
    assert g.has_edge("lpu.compiler.lower_mxm", "lpu.compiler.lower_common")
    assert g.has_edge("lpu.emulator.core", "lpu.emulator.arith")
    assert g.has_edge("lpu.compiler.ops", "lpu.isa.opcodes")
