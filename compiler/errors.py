"""Errors in .lpu source: one `SourceError` carries every diagnostic found, sorted by position,
each rendered as `file:line:col: error: message`, the source line, a caret, and a hint."""
from __future__ import annotations

import difflib
from dataclasses import dataclass

from lpu.isa.errors import LpuError


@dataclass(frozen=True)
class Diagnostic:
    file: str
    line: int            # 1-based; 0 when the error has no source position (e.g. a -p override)
    col: int
    message: str
    hint: str = ""
    source_line: str = ""

    def render(self) -> str:
        where = f"{self.file}:{self.line}:{self.col}" if self.line else self.file
        out = [f"{where}: error: {self.message}"]
        if self.line and self.source_line:
            text = self.source_line.expandtabs(4).rstrip()
            out.append(f"    {text}")
            out.append("    " + " " * max(self.col - 1, 0) + "^")
        if self.hint:
            out.append(f"    hint: {self.hint}")
        return "\n".join(out)


class SourceError(LpuError):
    """One or more errors in a .lpu program."""

    def __init__(self, diagnostics: list[Diagnostic]):
        unique = sorted(set(diagnostics), key=lambda d: (d.file, d.line, d.col, d.message))
        self.diagnostics = unique
        first = unique[0] if unique else Diagnostic("", 0, 0, "")
        super().__init__("\n".join(d.render() for d in unique), file=first.file, line=first.line, col=first.col,
                         diagnostics=[{"file": d.file, "line": d.line, "col": d.col, "message": d.message,
                                       "hint": d.hint} for d in unique])

    @classmethod
    def at(cls, source: "SourceText", line: int, col: int, message: str, hint: str = "") -> "SourceError":
        return cls([source.diagnostic(line, col, message, hint)])


class SourceText:
    """A named source text, for turning positions into diagnostics."""

    def __init__(self, name: str, text: str):
        self.name = name
        self.text = text
        self.lines = text.splitlines()

    def diagnostic(self, line: int, col: int, message: str, hint: str = "") -> Diagnostic:
        src = self.lines[line - 1] if 0 < line <= len(self.lines) else ""
        return Diagnostic(self.name, line, col, message, hint, src)


def did_you_mean(name: str, candidates) -> str:
    """A hint naming the closest candidate, or '' when nothing is close."""
    close = difflib.get_close_matches(name, sorted(set(candidates)), n=1, cutoff=0.6)
    return f"did you mean `{close[0]}`?" if close else ""
