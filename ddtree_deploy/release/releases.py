"""SGLang releases on PyPI: listing, one verified wheel download, reading files from a wheel.

Only ``fetch_project`` and ``download`` touch the network. The project's JSON
document is cached next to the wheels, so once a wheel and the document that
holds its sha256 are cached, ``ensure_wheel`` verifies and returns the wheel
without any network call (tests and ``make demo`` run offline).

We only read ``.py`` files out of a wheel, so any wheel of a release will do;
``choose_wheel`` prefers a pure one, then this machine's usual cp311 x86_64 one.
"""

from __future__ import annotations

import csv
import io
import json
import os
import tempfile
import threading
import zipfile
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from email.parser import HeaderParser
from pathlib import Path
from typing import Callable, Iterable, Iterator
from urllib.parse import urljoin

from packaging.utils import InvalidWheelFilename, parse_wheel_filename
from packaging.version import InvalidVersion, Version

from ddtree_deploy.base.codes import Code
from ddtree_deploy.base.digests import hasher, sha256_file, sha256_record
from ddtree_deploy.base.errors import BadInput, DeployError
from ddtree_deploy.base.fsutil import atomic_write
from ddtree_deploy.base.locations import cache_dir

PROJECT = "sglang"
DEFAULT_INDEX = "https://pypi.org/pypi"
TIMEOUT_S = 60  # per socket operation, not for the whole download
_CHUNK = 1 << 20


def index_url() -> str:
    """The PyPI JSON API root; DDTREE_DEPLOY_PYPI points it at a mirror."""
    return os.environ.get("DDTREE_DEPLOY_PYPI", DEFAULT_INDEX).rstrip("/")


@dataclass(frozen=True)
class ReleaseFile:
    filename: str
    url: str  # absolute
    sha256: str
    size: int
    yanked: bool

    @property
    def is_wheel(self) -> bool:
        return self.filename.endswith(".whl")


@dataclass(frozen=True)
class Release:
    version: Version
    files: tuple[ReleaseFile, ...]

    @property
    def yanked(self) -> bool:
        """A release is yanked when every one of its files is (PyPI yanks per file)."""
        return bool(self.files) and all(f.yanked for f in self.files)

    @property
    def wheels(self) -> tuple[ReleaseFile, ...]:
        return tuple(f for f in self.files if f.is_wheel)


# ---------------------------------------------------------------------------
# Listing (pure parsing + one network fetch, cached)


def parse_project(doc: dict, *, base_url: str) -> list[Release]:
    """Releases in a PyPI project JSON document, oldest first.

    Relative file URLs (mirrors rewrite them so) are resolved against ``base_url``,
    the URL the document came from. Versions that are not PEP 440 are skipped:
    nothing could select them anyway.
    """
    releases = []
    for raw_version, files in (doc.get("releases") or {}).items():
        try:
            version = Version(raw_version)
        except InvalidVersion:
            continue
        parsed = tuple(
            ReleaseFile(
                filename=f["filename"],
                url=urljoin(base_url, f["url"]),
                sha256=f["digests"]["sha256"],
                size=int(f.get("size") or 0),
                yanked=bool(f.get("yanked")),
            )
            for f in files
        )
        releases.append(Release(version=version, files=parsed))
    releases.sort(key=lambda r: r.version)
    return releases


def _project_url(project: str, index: str | None) -> str:
    return f"{(index or index_url()).rstrip('/')}/{project}/json"


def _project_cache(project: str) -> Path:
    return cache_dir() / "pypi" / f"{project}.json"


@contextmanager
def _network(url: str, *, failed: str, hint: str, answered_by: str = "") -> Iterator[None]:
    """The one place a network failure inside the block becomes a DeployError: an HTTP error
    status as ``<url>: HTTP <code><answered_by>``; no connection, a timeout or a cut stream
    as ``<url>: <failed> (<reason>)`` with ``hint`` and code ``network`` (callers and tests
    tell "offline" by that code)."""
    import urllib.error  # only the network functions need it: keep CLI start-up light

    try:
        yield
    except urllib.error.HTTPError as exc:
        raise DeployError(f"{url}: HTTP {exc.code}{answered_by}") from None
    except (urllib.error.URLError, OSError) as exc:
        raise DeployError(f"{url}: {failed} ({getattr(exc, 'reason', exc)})", hint=hint,
                          code=Code.NETWORK) from None


@contextmanager
def _cache_io(folder: Path) -> Iterator[None]:
    """A failure to write the download cache (no space, no permission) is the cache's, said as
    such: never taken for the network's, which only ``_network`` reports."""
    try:
        yield
    except OSError as exc:
        raise DeployError(f"{folder}: cannot write the download cache ({exc.strerror or exc})",
                          hint="free space there, or point DDTREE_DEPLOY_CACHE at a writable folder",
                          code=Code.CACHE) from None


def fetch_project(project: str = PROJECT, *, index: str | None = None) -> dict:
    """GET the project's JSON document from the index and cache it. Network."""
    import urllib.request

    url = _project_url(project, index)
    with _network(url, failed="cannot reach the package index", answered_by=" from the package index",
                  hint="check the network; wheels already in the cache work offline"):
        with urllib.request.urlopen(url, timeout=TIMEOUT_S) as resp:
            body = resp.read()
    try:
        doc = json.loads(body)
    except ValueError:
        raise DeployError(f"{url}: the package index answered something that is not JSON") from None
    doc["_source_url"] = url  # so that relative file URLs resolve after a cache round trip
    with _cache_io(_project_cache(project).parent):
        atomic_write(_project_cache(project), json.dumps(doc).encode())
    return doc


def cached_project(project: str = PROJECT) -> dict | None:
    """The cached project document, or None. Never touches the network."""
    path = _project_cache(project)
    try:
        return json.loads(path.read_bytes())
    except (OSError, ValueError):
        return None


def list_releases(project: str = PROJECT, *, refresh: bool = True, index: str | None = None) -> list[Release]:
    """Every release, oldest first; ``refresh=False`` uses the cached listing when there is one."""
    doc = None if refresh else cached_project(project)
    if doc is None:
        doc = fetch_project(project, index=index)
    return parse_project(doc, base_url=doc.get("_source_url") or _project_url(project, index))


def find_release(version: str, releases: Iterable[Release]) -> Release | None:
    want = parse_version(version)
    return next((r for r in releases if r.version == want), None)


def parse_version(version: str) -> Version:
    try:
        return Version(version)
    except InvalidVersion:
        raise BadInput(f"{version!r} is not a valid PEP 440 version", hint="e.g. 0.5.12.post1") from None


def _wheel_rank(filename: str) -> int | None:
    """Lower is better; None for a file that is not a usable wheel."""
    try:
        _, _, _, tags = parse_wheel_filename(filename)
    except InvalidWheelFilename:
        return None
    names = {(t.interpreter, t.platform) for t in tags}
    if any(p == "any" for _, p in names):
        return 0
    if any(i == "cp311" and "manylinux" in p and p.endswith("x86_64") for i, p in names):
        return 1
    if any("manylinux" in p and p.endswith("x86_64") for _, p in names):
        return 2
    return 3


def wheel_candidates(release: Release) -> list[ReleaseFile]:
    """The release's wheels, best first (we only read .py files, so any will do)."""
    ranked = [(r, f.filename, f) for f in release.wheels if (r := _wheel_rank(f.filename)) is not None]
    return [f for _, _, f in sorted(ranked, key=lambda t: (t[0], t[1]))]


def choose_wheel(release: Release) -> ReleaseFile:
    candidates = wheel_candidates(release)
    if not candidates:
        raise BadInput(
            f"sglang {release.version} has no wheel on the package index",
            hint="releases before 0.5.11 may ship only an sdist; choose a newer release",
        )
    return candidates[0]


# ---------------------------------------------------------------------------
# Download and cache


def wheel_cache() -> Path:
    return cache_dir() / "wheels"


#: ``(file, bytes received so far)``: called with 0 before the first byte, then after each chunk.
DownloadProgress = Callable[[ReleaseFile, int], None]

_listeners: list[DownloadProgress] = []
_listeners_lock = threading.Lock()


@contextmanager
def reporting_downloads(listener: DownloadProgress) -> Iterator[None]:
    """Every ``download`` in this block without a ``progress`` of its own reports to ``listener``
    (the CLI draws a progress bar): the commands that may need a wheel deep inside (a push's
    release snapshot, a check) need not pass a callback through every layer."""
    with _listeners_lock:
        _listeners.append(listener)
    try:
        yield
    finally:
        with _listeners_lock:
            _listeners.remove(listener)


def _report(progress: DownloadProgress | None) -> DownloadProgress | None:
    if progress is not None:
        return progress
    with _listeners_lock:
        return _listeners[-1] if _listeners else None


def download(file: ReleaseFile, dest_dir: Path | None = None, progress: DownloadProgress | None = None) -> Path:
    """Download one file, verify its sha256 while streaming, then rename it into place. Network.

    ``progress`` (else the listener of an enclosing ``reporting_downloads``) hears the bytes
    received."""
    import urllib.request

    report = _report(progress)
    dest_dir = dest_dir if dest_dir is not None else wheel_cache()
    with _cache_io(dest_dir):
        dest_dir.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=dest_dir, prefix=f".{file.filename}.")
    dest = dest_dir / file.filename
    digest = hasher()
    network = partial(_network, file.url, failed="download failed", hint="check the network and run again")
    try:
        with os.fdopen(fd, "wb") as fh:
            received = 0
            if report is not None:
                report(file, 0)
            with network():
                resp = urllib.request.urlopen(file.url, timeout=TIMEOUT_S)
            with resp:
                while True:
                    with network():
                        chunk = resp.read(_CHUNK)
                    if not chunk:
                        break
                    digest.update(chunk)
                    with _cache_io(dest_dir):
                        fh.write(chunk)
                    received += len(chunk)
                    if report is not None:
                        report(file, received)
        if digest.hexdigest() != file.sha256:
            raise DeployError(
                f"{file.filename}: sha256 {digest.hexdigest()} differs from the registry's {file.sha256}",
                hint="the download is corrupt or was tampered with; nothing was cached",
                code=Code.DIGEST,
            )
        with _cache_io(dest_dir):
            os.replace(tmp, dest)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return dest


def _cached_verified(release: Release) -> Path | None:
    """A cached wheel of ``release`` whose bytes match the registry; corrupt copies are removed."""
    for file in wheel_candidates(release):
        path = wheel_cache() / file.filename
        if path.is_file():
            if sha256_file(path) == file.sha256:
                return path
            path.unlink()  # corrupt or tampered: never use it, fetch it again
    return None


def ensure_wheel(version: str, project: str = PROJECT, *, index: str | None = None,
                 progress: DownloadProgress | None = None) -> Path:
    """A verified wheel of ``project==version`` in the cache, downloading only when needed.

    Offline path: cached listing knows the version and a cached wheel matches its
    sha256 -> no network at all. Otherwise refresh the listing and download
    (``progress``: see ``download``).
    """
    parse_version(version)
    doc = cached_project(project)
    for attempt in ("cache", "network"):
        if attempt == "network":
            doc = fetch_project(project, index=index)
        if doc is None:
            continue
        releases = parse_project(doc, base_url=doc.get("_source_url") or _project_url(project, index))
        release = find_release(version, releases)
        if release is None:
            if attempt == "network":
                recent = ", ".join(str(r.version) for r in releases[-5:])
                raise BadInput(f"{project} {version} is not a release on the package index",
                               hint=f"latest releases: {recent}")
            continue
        cached = _cached_verified(release)
        if cached is not None:
            return cached
        if attempt == "network":
            return download(choose_wheel(release), progress=progress)
    raise AssertionError("unreachable: the network attempt returns or raises")


# ---------------------------------------------------------------------------
# Reading a wheel (offline)


def _open_wheel(wheel: Path) -> zipfile.ZipFile:
    try:
        return zipfile.ZipFile(wheel)
    except (OSError, zipfile.BadZipFile) as exc:
        raise DeployError(f"{wheel}: not a readable wheel ({exc})",
                          hint="delete it from the cache and run again") from None


def _record_hashes(zf: zipfile.ZipFile) -> dict[str, str]:
    """path -> urlsafe-base64 sha256 from the wheel's RECORD (empty if it has none)."""
    names = [n for n in zf.namelist() if n.endswith(".dist-info/RECORD") and n.count("/") == 1]
    if not names:
        return {}
    text = zf.read(names[0]).decode("utf-8")
    out = {}
    for row in csv.reader(io.StringIO(text)):
        if len(row) >= 2 and row[1].startswith("sha256="):
            out[row[0]] = row[1][len("sha256="):]
    return out


def read_wheel_files(wheel: Path, paths: Iterable[str]) -> dict[str, bytes]:
    """The bytes of each of ``paths`` that the wheel holds (absent ones are left out).

    Each file read is checked against the wheel's RECORD, so a damaged archive
    never turns into a snapshot.
    """
    with _open_wheel(wheel) as zf:
        present = set(zf.namelist())
        record = _record_hashes(zf)
        out: dict[str, bytes] = {}
        for path in paths:
            if path not in present:
                continue
            data = zf.read(path)
            expected = record.get(path)
            if expected is not None:
                actual = sha256_record(data)
                if actual != expected:
                    raise DeployError(f"{wheel.name}: {path} does not match the wheel's RECORD",
                                      hint="the cached wheel is damaged; delete it and run again")
            out[path] = data
        return out


def wheel_version(wheel: Path) -> str:
    """The version in the wheel's ``*.dist-info/METADATA``."""
    with _open_wheel(wheel) as zf:
        names = [n for n in zf.namelist() if n.endswith(".dist-info/METADATA") and n.count("/") == 1]
        if not names:
            raise DeployError(f"{wheel.name}: no .dist-info/METADATA in the wheel")
        headers = HeaderParser().parsestr(zf.read(names[0]).decode("utf-8", errors="replace"))
    version = headers.get("Version")
    if not version:
        raise DeployError(f"{wheel.name}: METADATA has no Version")
    return version.strip()


__all__ = [
    "PROJECT",
    "Release",
    "ReleaseFile",
    "cached_project",
    "choose_wheel",
    "download",
    "ensure_wheel",
    "fetch_project",
    "find_release",
    "index_url",
    "list_releases",
    "parse_project",
    "parse_version",
    "read_wheel_files",
    "reporting_downloads",
    "wheel_cache",
    "wheel_candidates",
    "wheel_version",
]
