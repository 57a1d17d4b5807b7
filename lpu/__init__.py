"""lpu: a cycle-level emulator of a Groq-style LPU, its compiler and a GPU baseline.

Installed, the stage folders of the repository (isa/, compiler/, emulator/, gpu_baseline/,
programs/) are the subpackages lpu.isa, lpu.compiler, ... (setuptools' package-dir mapping in
pyproject.toml). Run from a source checkout without installing (bare `pytest`, `python -m lpu.cli`
from the repository root), the same names resolve to those folders: the checkout's root joins
this package's path.

NUMPY_MADVISE_HUGEPAGE=0 (numpy's own switch, read when numpy is imported; set here unless the
environment sets it): numpy asks for transparent huge pages for every large array, and where
the kernel compacts memory to find them (defrag=madvise, the default) a fresh array costs far
more: a chip's 109 MB SRAM image 0.36-0.42 s of system time against 0.08 s in 4 KiB pages on
the development machine, Llama-2-7B L=2 on 8 chips in one process 8.9 -> 6.0 CPU-s; the
emulator runs no slower in small pages (bert_large L=1 on one chip, prepared: 11.6-16.0 CPU-s
either way)."""
import os as _os

_os.environ.setdefault("NUMPY_MADVISE_HUGEPAGE", "0")

_ROOT = _os.path.dirname(_os.path.dirname(_os.path.abspath(__file__)))
if _os.path.isfile(_os.path.join(_ROOT, "pyproject.toml")) and _os.path.isfile(_os.path.join(_ROOT, "isa", "opcodes.py")):
    __path__.append(_ROOT)
