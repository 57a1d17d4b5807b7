"""Reading an `--inputs` .npz safely: the zip directory and each member's .npy header are read
and checked (names, shapes, dtypes and sizes, against the tensors the program declares and the
limit 'npz_bytes') before any array is loaded, so a small file that claims a huge array, or
holds a huge member under a name the program does not declare, is refused without reading it.
Pickled (object) arrays are never loaded."""
from __future__ import annotations

import math
import os
import stat
import zipfile

import numpy as np

from lpu.isa.errors import LpuError
from lpu.isa.limits import how_to_raise, limit

INT_DTYPES = ("i8", "i32")


def _open(path: str) -> zipfile.ZipFile:
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        raise LpuError(f"{path}: no such file") from None
    except OSError as e:
        raise LpuError(f"{path}: cannot read: {e.strerror or e}") from None
    if stat.S_ISDIR(mode):
        raise LpuError(f"{path}: is a directory, not an .npz file")
    if not stat.S_ISREG(mode):
        raise LpuError(f"{path}: not an .npz file (not a regular file: an .npz is a zip archive, written with "
                       "numpy.savez(path, name=array, ...))")
    try:
        if not zipfile.is_zipfile(path):
            raise LpuError(f"{path}: not an .npz file (write one with numpy.savez(path, name=array, ...))")
        return zipfile.ZipFile(path)
    except (OSError, zipfile.BadZipFile, ValueError, EOFError) as e:
        raise LpuError(f"{path}: a damaged .npz file ({e})") from None


def _header(z: zipfile.ZipFile, info: zipfile.ZipInfo, path: str):
    """(shape, dtype, header bytes) of one member, from its .npy header only."""
    try:
        with z.open(info) as f:
            version = np.lib.format.read_magic(f)
            if version == (1, 0):
                shape, fortran, dtype = np.lib.format.read_array_header_1_0(f)
            elif version in ((2, 0), (3, 0)):
                shape, fortran, dtype = np.lib.format.read_array_header_2_0(f)
            else:
                raise ValueError(f"unsupported .npy version {version}")
            return tuple(shape), np.dtype(dtype), f.tell()
    except Exception as e:  # noqa: BLE001 - numpy parses the header text with Python's tokenizer: any failure
        #                        (ValueError, SyntaxError, tokenize.TokenError, ...) means a bad header
        raise LpuError(f"{path}: member '{info.filename}' is not a valid .npy array ({e})") from None


def load_npz(path: str, prog=None) -> dict:
    """The arrays by name. With `prog`, names, shapes and dtypes must match its declared tensors."""
    declared = None if prog is None else {s.name: s for s in prog.symbols if s.kind in ("input", "weight", "state")}
    with _open(path) as z:
        try:
            infos = z.infolist()
        except (OSError, zipfile.BadZipFile) as e:
            raise LpuError(f"{path}: a damaged .npz file ({e})") from None
        names, total = {}, 0
        for info in infos:
            if info.is_dir():
                continue
            name = info.filename[:-4] if info.filename.endswith(".npy") else info.filename
            if name in names:
                raise LpuError(f"{path}: '{name}' appears twice in the archive")
            if declared is not None and name not in declared:
                from lpu.compiler.errors import did_you_mean
                hint = did_you_mean(name, declared)
                raise LpuError(f"--inputs {path} has '{name}', which the program does not declare (it declares "
                               f"{', '.join(sorted(declared)) or 'nothing'})" + (f"; {hint}" if hint else ""))
            shape, dtype, head = _header(z, info, path)
            if dtype.hasobject:
                raise LpuError(f"{path}: '{name}' holds Python objects (a pickle); only numeric arrays are read")
            if any(d < 0 for d in shape):
                raise LpuError(f"{path}: '{name}' has a negative dimension in its shape {list(shape)}")
            nbytes = math.prod(shape) * dtype.itemsize
            if info.file_size != head + nbytes:
                raise LpuError(f"{path}: '{name}' is damaged: its header says {list(shape)} {dtype} ({nbytes:,} bytes), "
                               f"the member holds {max(info.file_size - head, 0):,}")
            total += nbytes
            if total > limit("npz_bytes"):
                raise LpuError(f"{path}: the arrays take more than {limit('npz_bytes'):,} bytes; {how_to_raise('npz_bytes')}")
            if declared is not None:
                _check_declared(path, name, shape, dtype, declared[name])
            names[name] = info
        out = {}
        for name, info in names.items():
            try:
                with z.open(info) as f:
                    out[name] = np.lib.format.read_array(f, allow_pickle=False)
            except (OSError, ValueError, EOFError, zipfile.BadZipFile) as e:
                raise LpuError(f"{path}: a damaged .npz file ('{name}': {e})") from None
        return out


def _check_declared(path, name, shape, dtype, sym):
    want = f"{sym.dtype}{list(sym.shape)}"
    if tuple(shape) != tuple(sym.shape):
        raise LpuError(f"--inputs {path}: '{name}' has shape {list(shape)}, the program declares {want}")
    is_int = sym.dtype in INT_DTYPES
    if dtype.kind not in ("iu" if is_int else "iuf"):
        raise LpuError(f"--inputs {path}: '{name}' is {dtype}, the program declares {want}"
                       + ("" if is_int else " (give floats or integers)"))
