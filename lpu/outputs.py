"""Writing the files a command produces (`-o`, `--save`, `--trace`, `--plot`), safely:

- checked before any work (`check_outputs`): an empty path, a directory, a missing folder, a
  path that is also an input, or two options naming one file are errors;
- a regular file is written whole or not at all (a temporary file in its folder, then a rename);
- a symbolic link is followed: the file it points to is written (the link stays a link);
- a path that exists and is not a regular file (a character device such as /dev/null or
  /dev/stdout, a FIFO) is written in place, never replaced; a socket or other kind is refused.
"""
from __future__ import annotations

import os
import shutil
import stat
import tempfile

from lpu.isa.errors import LpuError

OUTPUT_ARGS = {"output": "-o", "save": "--save", "trace": "--trace", "plot": "--plot"}
INPUT_ARGS = ("program", "binary", "source", "inputs", "machine", "gpu")


def _kind(path: str) -> str | None:
    """'file', 'dir', 'device' (written in place), 'other' (refused), or None if absent."""
    try:
        mode = os.stat(path).st_mode           # follows links
    except FileNotFoundError:
        return None
    except OSError as e:
        raise LpuError(f"{path}: cannot write: {e.strerror or e}") from None
    if stat.S_ISREG(mode):
        return "file"
    if stat.S_ISDIR(mode):
        return "dir"
    if stat.S_ISCHR(mode) or stat.S_ISFIFO(mode):
        return "device"
    return "other"


def _same(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return os.path.realpath(a) == os.path.realpath(b)


def check_outputs(args) -> None:
    """Before any work: every output of the command (attributes of `args` named in OUTPUT_ARGS)
    can be written, none is an input, and no two name one file."""
    inputs = [p for p in (getattr(args, k, None) for k in INPUT_ARGS) if isinstance(p, str) and os.path.isfile(p)]
    seen: list[tuple[str, str]] = []
    for key, flag in OUTPUT_ARGS.items():
        out = getattr(args, key, None)
        if not isinstance(out, str):
            continue
        if not out:
            raise LpuError(f"{flag} '': an empty path; give a file name to write")
        kind = _kind(out)
        if kind == "dir":
            raise LpuError(f"{out}: is a directory; give a file name to write")
        if kind == "other":
            raise LpuError(f"{out}: exists and is neither a regular file nor a device or FIFO; not overwriting it")
        target = os.path.realpath(out)
        if kind is None and not os.path.isdir(os.path.dirname(target)):
            raise LpuError(f"{out}: cannot write: directory {os.path.dirname(out) or '.'} does not exist")
        if kind == "file" and any(_same(out, p) for p in inputs):
            raise LpuError(f"{out}: is also an input of this command; write the output to another file")
        for other_flag, other in seen:
            if kind != "device" and (target == os.path.realpath(other) or (kind and _same(out, other))):
                raise LpuError(f"{flag} {out} and {other_flag} {other} name the same file; give each its own")
        seen.append((flag, out))


def write_atomic(path: str, write) -> None:
    """Call write(tmp_path) to produce the file's contents, then put them at `path`: by a rename
    for a regular file (nothing half-written is ever left), in place for a device or FIFO."""
    if not path:
        raise LpuError("an empty output path; give a file name to write")
    kind = _kind(path)
    if kind == "dir":
        raise LpuError(f"{path}: is a directory; give a file name to write")
    if kind == "other":
        raise LpuError(f"{path}: exists and is neither a regular file nor a device or FIFO; not overwriting it")
    if kind == "device":
        _write_in_place(path, write)
        return
    target = os.path.realpath(path)              # a link stays a link: its target is written
    d = os.path.dirname(target)
    try:
        fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=os.path.splitext(target)[1], dir=d)
    except OSError as e:
        raise LpuError(f"{path}: cannot write: {e.strerror or e} ({d})") from None
    os.close(fd)
    try:
        write(tmp)
        os.chmod(tmp, _new_file_mode(target))
        os.replace(tmp, target)
    except OSError as e:
        _remove(tmp)
        raise LpuError(f"{path}: cannot write: {e.strerror or e}") from None
    except BaseException:
        _remove(tmp)
        raise


def _write_in_place(path: str, write) -> None:
    d = tempfile.mkdtemp(prefix="lpu-out-")
    tmp = os.path.join(d, "out" + os.path.splitext(path)[1])
    try:
        write(tmp)
        with open(tmp, "rb") as src, open(path, "wb") as dst:
            shutil.copyfileobj(src, dst)
    except OSError as e:
        raise LpuError(f"{path}: cannot write: {e.strerror or e}") from None
    finally:
        shutil.rmtree(d, ignore_errors=True)


def _new_file_mode(path: str) -> int:
    """The mode `open(path, "w")` would give: the existing file's, else 0o666 less the umask."""
    try:
        return os.stat(path).st_mode & 0o777
    except OSError:
        umask = os.umask(0)
        os.umask(umask)
        return 0o666 & ~umask


def _remove(tmp: str) -> None:
    try:
        os.unlink(tmp)
    except OSError:
        pass
