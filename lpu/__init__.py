"""lpu: a cycle-level emulator of a Groq-style LPU, its compiler and a GPU baseline.

Installed, the stage folders of the repository (isa/, compiler/, emulator/, gpu_baseline/,
programs/) are the subpackages lpu.isa, lpu.compiler, ... (setuptools' package-dir mapping in
pyproject.toml). Run from a source checkout without installing (bare `pytest`, `python -m lpu.cli`
from the repository root), the same names resolve to those folders: the checkout's root joins
this package's path."""
import os as _os

_ROOT = _os.path.dirname(_os.path.dirname(_os.path.abspath(__file__)))
if _os.path.isfile(_os.path.join(_ROOT, "pyproject.toml")) and _os.path.isfile(_os.path.join(_ROOT, "isa", "opcodes.py")):
    __path__.append(_ROOT)
