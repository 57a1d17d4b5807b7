"""The front end's entry points: .lpu source -> typed IR graph."""
from __future__ import annotations

from pathlib import Path

from lpu.compiler.elaborate import elaborate
from lpu.compiler.errors import SourceError, SourceText
from lpu.compiler.ir import IRGraph
from lpu.compiler.parse import parse


def elaborate_source(text: str, name: str = "<string>", params: dict[str, int] | None = None) -> IRGraph:
    """Parse and elaborate a program; `params` overrides its `param` values (`-p NAME=INT`)."""
    return elaborate(parse(text, name), text, name, params)


def elaborate_file(path, params: dict[str, int] | None = None) -> IRGraph:
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as e:
        raise SourceError([SourceText(str(path), "").diagnostic(0, 0, f"cannot read the program: {e.strerror}")]) from None
    return elaborate_source(text, str(path), params)
