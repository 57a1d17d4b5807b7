"""Errors in .lpu source: one `SourceError` carries every diagnostic found, sorted by position,
each rendered as `file:line:col: error: message`, the source line, a caret, and a hint."""
from __future__ import annotations

import difflib
from dataclasses import dataclass

from lpu.isa.errors import LpuError
from lpu.isa.limits import how_to_raise, limit


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
            text = _printable(self.source_line).expandtabs(4).rstrip()
            caret = len(_printable(self.source_line[:max(self.col - 1, 0)]).expandtabs(4))
            out.append(f"    {text}")
            out.append("    " + " " * caret + "^")
        if self.hint:
            out.append(f"    hint: {self.hint}")
        return "\n".join(out)


class SourceError(LpuError):
    """One or more errors in a .lpu program."""

    def __init__(self, diagnostics: list[Diagnostic]):
        unique = sorted(set(diagnostics), key=lambda d: (d.file, d.line, d.col, d.message))
        self.diagnostics = unique
        first = unique[0] if unique else Diagnostic("", 0, 0, "")
        shown = unique[:limit("errors")]
        text = "\n".join(d.render() for d in shown)
        if len(unique) > len(shown):
            text += (f"\n... and {len(unique) - len(shown)} more error{'s' * (len(unique) - len(shown) > 1)} "
                     f"({how_to_raise('errors')})")
        super().__init__(text, file=first.file, line=first.line, col=first.col, errors=len(unique),
                         diagnostics=[{"file": d.file, "line": d.line, "col": d.col, "message": d.message,
                                       "hint": d.hint} for d in shown])

    @classmethod
    def at(cls, source: "SourceText", line: int, col: int, message: str, hint: str = "") -> "SourceError":
        return cls([source.diagnostic(line, col, message, hint)])


class SourceText:
    """A named source text, for turning positions into diagnostics."""

    def __init__(self, name: str, text: str):
        self.name = name
        self.text = text
        self.lines = split_lines(text)

    def diagnostic(self, line: int, col: int, message: str, hint: str = "") -> Diagnostic:
        src = self.lines[line - 1] if 0 < line <= len(self.lines) else ""
        return Diagnostic(self.name, line, col, message, hint, src)


def split_lines(text: str) -> list[str]:
    """The lines of `text` as the lexer counts them: only "\\n" ends a line (not \\x0c, \\x0b,
    \\x1c, \\x85 or \\u2028, which str.splitlines also splits at); a final "\\n" ends the last line."""
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return lines


def _printable(line: str) -> str:
    """A source line for echoing under a message: each control or separator character (other
    than a tab) becomes one space, so the caret stays under the column it points at."""
    return "".join(" " if (c < " " and c != "\t") or c in "\x7f\x85\u2028\u2029" else c for c in line)


DID_YOU_MEAN_CANDIDATES = 200   # at most this many candidates (the closest in length) are compared


def did_you_mean(name: str, candidates) -> str:
    """A hint naming the closest candidate, or '' when nothing is close. Linear in the number of
    candidates: only names of about the same length, at most DID_YOU_MEAN_CANDIDATES, are compared."""
    near = [c for c in set(candidates) if abs(len(c) - len(name)) <= max(2, len(name) // 2)]
    if len(near) > DID_YOU_MEAN_CANDIDATES:
        near = sorted(near, key=lambda c: (abs(len(c) - len(name)), c))[:DID_YOU_MEAN_CANDIDATES]
    close = difflib.get_close_matches(name, sorted(near), n=1, cutoff=0.6)
    return f"did you mean `{close[0]}`?" if close else ""
