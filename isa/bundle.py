"""The multi-chip bundle: every chip's program of a system in one file (`.lpubin`, like a
one-chip binary, told apart by its version).

Layout (all integers little-endian):

    magic       8 bytes  b"\\x89LPUBIN\\n" (isa/encoding.py's)
    version     u16      BUNDLE_VERSION (a one-chip binary has encoding.FORMAT_VERSION, so an lpu
                         that reads only those refuses a bundle by its version, with a message)
    length      u32      bytes after this field, up to and including the checksum
    header      u32 length, then JSON: {"system": SystemConfig.to_dict(), "outputs": {name: chip},
                "params": {...}, "chips": N, "rows": [{name: [start, stop]} per chip]: the rows
                of axis 0 of each split tensor a chip holds (compiler/partition.py), or
                [[start, stop] per axis] (a tensor-parallel rank's part, compiler/system_tp.py)}
    chips       N times: u32 length, then the chip's program as a one-chip .lpubin (encoding.encode)
    checksum    u32      CRC-32 of everything before it
"""
from __future__ import annotations

import dataclasses
import json
import struct
import zlib

from lpu.isa import encoding as E
from lpu.isa.errors import BinaryError
from lpu.isa.system import SystemConfig

BUNDLE_VERSION = 1001
_PRE = len(E.MAGIC) + 6


def is_bundle(data: bytes) -> bool:
    return (len(data) >= _PRE and data[:len(E.MAGIC)] == E.MAGIC
            and struct.unpack_from("<H", data, len(E.MAGIC))[0] == BUNDLE_VERSION)


def bundle_parts(sp) -> list:
    """The bytes of a SystemProgram (compiler/system.py) as parts, one after another, the
    checksum last: a bundle of many chips is written without a whole copy of it in memory."""
    rows = [{k: [list(x) for x in v] if v and isinstance(v[0], (tuple, list)) else list(v) for k, v in r.items()}
            for r in (sp.rows or [{} for _ in sp.chips])]
    head = json.dumps({"system": sp.system.to_dict(), "outputs": dict(sp.outputs), "params": dict(sp.params),
                       "chips": len(sp.chips), "rows": rows}, sort_keys=True).encode()
    parts = [struct.pack("<I", len(head)), head]
    for p in sp.chips:
        blob = E.encode(p)
        parts += [struct.pack("<I", len(blob)), blob]
    parts.insert(0, E.MAGIC + struct.pack("<HI", BUNDLE_VERSION, sum(len(x) for x in parts) + 4))
    crc = 0
    for x in parts:
        crc = zlib.crc32(x, crc)
    return parts + [struct.pack("<I", crc)]


def encode_bundle(sp) -> bytes:
    """Bytes of a SystemProgram (compiler/system.py)."""
    return b"".join(bundle_parts(sp))


def decode_bundle(data: bytes):
    """(SystemConfig, [Program], outputs, params, rows) of bundle bytes."""
    if not is_bundle(data):
        raise BinaryError("not a system bundle")
    total = _PRE + struct.unpack_from("<I", data, len(E.MAGIC) + 2)[0]
    if len(data) != total:
        raise BinaryError(f"{'truncated' if len(data) < total else 'corrupt'} system bundle: {len(data)} bytes, "
                          f"its header says {total}")
    view = memoryview(data)                  # slices of it are not copies
    if struct.unpack_from("<I", data, total - 4)[0] != zlib.crc32(view[:total - 4]):
        raise BinaryError("corrupt system bundle: checksum mismatch (the file was damaged)")
    pos = _PRE
    try:
        (n,) = struct.unpack_from("<I", data, pos)
        head = json.loads(data[pos + 4:pos + 4 + n].decode())
        pos += 4 + n
        system = SystemConfig.from_stored(head["system"])
        progs, seen = [], {}
        for c in range(int(head["chips"])):
            (n,) = struct.unpack_from("<I", data, pos)
            blob = view[pos + 4:pos + 4 + n]
            key = (n, zlib.crc32(blob))
            twin = seen.get(key)
            if twin is not None and view[twin[0]:twin[0] + n] == blob:   # the same program (tensor-parallel
                progs.append(dataclasses.replace(twin[1]))                # ranks): its arrays shared
            else:
                try:
                    progs.append(E.decode(blob, system.machine))
                except BinaryError as e:
                    raise BinaryError(f"chip {c}: {e.message}") from None
                seen[key] = (pos + 4, progs[-1])
            pos += 4 + n
    except (struct.error, ValueError, KeyError, TypeError) as e:
        raise BinaryError(f"corrupt system bundle: {e}") from None
    if pos != total - 4 or len(progs) != system.chips:
        raise BinaryError("corrupt system bundle: its chip programs do not fill it")
    outputs = {str(k): int(v) for k, v in head["outputs"].items()}
    try:
        rows = [{str(k): _part(v) for k, v in r.items()} for r in head["rows"]]
    except (KeyError, TypeError, ValueError, IndexError, AttributeError):
        raise BinaryError("corrupt system bundle: bad 'rows' in its header") from None
    if len(rows) != len(progs):
        raise BinaryError("corrupt system bundle: 'rows' does not list every chip")
    return system, progs, outputs, dict(head["params"]), rows


def save_bundle(sp, path: str) -> None:
    E.write_parts(bundle_parts(sp), path)


def _part(v) -> tuple:
    """A chip's part of a split tensor: (start, stop) of axis 0, or ((start, stop) per axis)."""
    if v and isinstance(v[0], list):
        return tuple((int(a), int(b)) for a, b in v)
    return (int(v[0]), int(v[1]))
