"""docs/isa.md, generated from the one opcode table (isa/opcodes.py): `python -m tools.isadoc`
rewrites it, `--check` exits 1 when it is stale (tests/test_readme.py checks it too)."""
from __future__ import annotations

import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PATH = os.path.join(ROOT, "docs", "isa.md")


def render() -> str:
    from lpu.isa import opcodes as O
    from lpu.isa.machine import UNIT_C2C, UNIT_ICU, UNIT_MEM, UNIT_MXM, UNIT_SXM, UNIT_VXM
    units = {UNIT_ICU: "ICU (any queue)", UNIT_MEM: "MEM (a slice's queue)", UNIT_MXM: "MXM (a plane's queues)",
             UNIT_VXM: "VXM (an ALU's queue)", UNIT_SXM: "SXM (a hemisphere's queues)",
             UNIT_C2C: "C2C (a chip-to-chip link's queue; docs/system.md)"}
    out = ["# The instruction set", "",
           "Generated from `isa/opcodes.py` by `python -m tools.isadoc`; do not edit by hand. The encoder,",
           "decoder, assembler, disassembler, emulator dispatch, scheduler and checker all derive from that",
           "table. Latencies are names of config values (`[latency]` in `isa/machines/*.toml`).", "",
           "## Conventions", "", "```", O.__doc__.strip(), "```", "",
           "Dtype codes: " + ", ".join(f"{d} = {i} ({O.DTYPE_WIDTH[i]} byte{'s' if O.DTYPE_WIDTH[i] > 1 else ''})"
                                       for i, d in enumerate(O.DTYPES)) + ".", ""]
    for unit, title in units.items():
        out += [f"## {title}", "", "| code | opcode | fields | latency | phase | meaning |", "|---|---|---|---|---|---|"]
        for s in O.OPS:
            if s.unit != unit:
                continue
            fields = ", ".join(f"{n}:{k}" for n, k in s.fields) or "-"
            out.append(f"| {s.code} | `{s.name}` | {fields} | {s.latency or '-'} | {s.phase} | "
                       f"{s.doc.replace('|', '/')} |")
        out.append("")
    out += [f"Opcode table fingerprint (recorded in every .lpubin): `{O.TABLE_HASH}`.", ""]
    return "\n".join(out)


def main(argv) -> int:
    text = render()
    if "--check" in argv:
        with open(PATH) as f:
            stale = f.read() != text
        if stale:
            print("docs/isa.md is stale: python -m tools.isadoc")
        return 1 if stale else 0
    with open(PATH + ".tmp", "w") as f:
        f.write(text)
    os.replace(PATH + ".tmp", PATH)
    print("wrote docs/isa.md")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
