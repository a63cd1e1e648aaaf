"""Local file reads and writes: reads bounded (a regular file, a size cap), writes that never
leave a half-written file behind."""

from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path


class NotARegularFile(OSError):
    """A path that names something other than a bounded regular file: a folder, a device
    (``/dev/zero`` would be read for ever), a FIFO, or a file over the size cap. Its text
    says which, in words for a one-line message."""


def check_regular(path: str | os.PathLike[str], limit: int) -> None:
    """``read_regular``'s checks without reading: ``NotARegularFile`` (or the OSError of the
    open) unless ``path`` is a regular file of at most ``limit`` bytes."""
    fd = _open_checked(path, limit)
    os.close(fd)


def read_regular(path: str | os.PathLike[str], limit: int) -> bytes:
    """The bytes of ``path``, which must be a regular file of at most ``limit`` bytes.

    Opened without blocking (a FIFO never hangs the open), checked on the open descriptor
    (no swap between the check and the read), and never more than ``limit`` + 1 bytes read
    (a file that grows while read is refused too). ``NotARegularFile`` says why it is not
    one; any other ``OSError`` (ENOENT, EACCES) is the caller's to word.
    """
    fd = _open_checked(path, limit)
    try:
        chunks, left = [], limit + 1
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        data = b"".join(chunks)
        if len(data) > limit:
            raise NotARegularFile(f"{path} grew past the {_size(limit)} limit while it was read")
        return data
    finally:
        os.close(fd)


def _open_checked(path: str | os.PathLike[str], limit: int) -> int:
    fd = os.open(os.fspath(path), os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            raise NotARegularFile(f"{path} is a folder, not a file")
        if not stat.S_ISREG(st.st_mode):
            raise NotARegularFile(f"{path} is not a regular file ({_kind(st.st_mode)})")
        if st.st_size > limit:
            raise NotARegularFile(f"{path} is {st.st_size} bytes, over the {_size(limit)} limit")
    except BaseException:
        os.close(fd)
        raise
    return fd


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "not a file"


def _size(n: int) -> str:
    return f"{n >> 20} MiB" if n >= 1 << 20 and n % (1 << 20) == 0 else f"{n} bytes"


def atomic_write(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` through a temporary file in the same folder and a rename,
    so a reader (or a crash) sees the old content or the new one, never a mix."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def require_writable_folder(path: Path, option: str, *, given: Path | None = None,
                            todo: str | None = None) -> Path:
    """``path`` is a folder this process can write into, or can make and then write into;
    else ``BadInput`` naming ``option`` (``--write DIR``) and why: a file in the way, a folder
    that cannot be made or written (permissions, a read-only or virtual file system).

    A probe, for commands to call before their work: bad output folders are bad input
    (exit 2), not a traceback after minutes of work. It leaves nothing: the folders it made
    to try are removed again (the command makes them when it writes)."""
    from ddtree_deploy.base.errors import BadInput

    path = Path(path)
    shown = f"{option} {given or path}"  # as the user wrote it (``require_writable_file``: the file)
    todo = todo or f"give {option} a folder you can write"
    if path.exists() and not path.is_dir():
        raise BadInput(f"{shown}: {path} exists and is not a folder", hint=todo)
    made: list[Path] = []
    for parent in [path, *path.parents]:
        if parent.exists():
            if not parent.is_dir():
                raise BadInput(f"{shown}: {parent} is not a folder", hint=todo)
            break
        made.insert(0, parent)
    problem, created = None, []
    try:
        for folder in made:
            problem = f"cannot make {folder}"
            folder.mkdir()
            created.append(folder)
        problem = f"cannot write in {path}"
        fd, probe = tempfile.mkstemp(dir=path, prefix=".ddtree-probe-")
        os.close(fd)
        os.unlink(probe)
        problem = None
    except OSError as exc:
        problem = f"{problem} ({exc.strerror or type(exc).__name__})"
    for folder in reversed(created):
        try:
            folder.rmdir()
        except OSError:
            break  # something else wrote there meanwhile: leave it
    if problem:
        raise BadInput(f"{shown}: {problem}", hint=todo)
    return path


def require_writable_file(path: Path, option: str) -> Path:
    """``path`` is a file this process can write (its folder as ``require_writable_folder``),
    else ``BadInput``; a folder in its place is refused."""
    from ddtree_deploy.base.errors import BadInput

    path = Path(path)
    if path.is_dir():
        raise BadInput(f"{option} {path}: is a folder; give a file name", hint=f"e.g. {option} {path / 'report.md'}")
    require_writable_folder(path.parent, option, given=path, todo=f"give {option} a file in a folder you can write")
    return path
