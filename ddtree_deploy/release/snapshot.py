"""Snapshots: the SGLang files a series touches, with a manifest that pins their bytes.

A snapshot is ``snapshot/<name>/MANIFEST.json`` plus ``snapshot/<name>/files/<pkg path>``.
The manifest records where the files came from (a PyPI wheel or a host), the
SGLang version, and per file its package-relative path, sha256 and size; a file
the series creates is recorded as absent. Manifests may be committed; the files
are SGLang's own and are gitignored (re-created from the cached wheel on demand).

Writing is all-or-nothing: a snapshot is built in a temporary folder beside its
final place and swapped in, so a failure leaves the previous snapshot intact.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterable, Mapping

from ddtree_deploy.base import next_step
from ddtree_deploy.base.digests import sha256, sha256_file
from ddtree_deploy.base.errors import BadInput
from ddtree_deploy.base.locations import repo_dir
from ddtree_deploy.engine.series import check_package_path, families, load_family, show
from ddtree_deploy.release import releases

FORMAT = 1
MANIFEST = "MANIFEST.json"
FILES = "files"
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]*$")


@dataclass(frozen=True)
class FileEntry:
    path: str
    sha256: str | None  # None: absent (a file the series creates)
    size: int | None

    @property
    def absent(self) -> bool:
        return self.sha256 is None

    def to_json(self) -> dict:
        if self.absent:
            return {"path": self.path, "absent": True}
        return {"path": self.path, "sha256": self.sha256, "size": self.size}


@dataclass(frozen=True)
class Manifest:
    name: str
    source: dict
    sglang_version: str
    package_root: str | None
    created: str
    files: tuple[FileEntry, ...]  # sorted by path

    def to_json(self) -> dict:
        doc: dict[str, Any] = {
            "format": FORMAT,
            "name": self.name,
            "source": self.source,
            "sglang_version": self.sglang_version,
        }
        if self.package_root is not None:
            doc["package_root"] = self.package_root
        doc["created"] = self.created
        doc["files"] = [f.to_json() for f in self.files]
        return doc

    def paths(self) -> tuple[str, ...]:
        return tuple(f.path for f in self.files)


def snapshot_root() -> Path:
    return repo_dir("snapshot")


def check_name(name: str) -> str:
    if not _NAME.match(name or ""):
        raise BadInput(
            f"snapshot name {name!r} is not a plain folder name",
            hint="use letters, digits and . _ + - (e.g. sglang-0.5.12.post1 or ct200)",
        )
    return name


def release_name(version: str) -> str:
    return f"sglang-{version}"


# ---------------------------------------------------------------------------
# Reading


def _manifest_from_json(doc: Any, where: str) -> Manifest:
    def bad(what: str) -> BadInput:
        return BadInput(f"{where}: {what}", hint=f"take the snapshot again ({next_step.snapshot_release()} or {next_step.snapshot_pull('HOST')})")

    if not isinstance(doc, dict):
        raise bad("not a JSON object")
    if doc.get("format") != FORMAT:
        raise bad(f"format {doc.get('format')!r} is not {FORMAT}")
    for key in ("name", "sglang_version", "created"):
        if not isinstance(doc.get(key), str):
            raise bad(f"{key!r} missing or not a string")
    if not isinstance(doc.get("source"), dict) or doc["source"].get("kind") not in ("pypi", "host"):
        raise bad("'source' must be an object with kind 'pypi' or 'host'")
    if not isinstance(doc.get("files"), list):
        raise bad("'files' missing or not a list")
    entries = []
    for i, f in enumerate(doc["files"]):
        if not isinstance(f, dict) or not isinstance(f.get("path"), str):
            raise bad(f"files[{i}] has no 'path'")
        path = check_package_path(f["path"], where=f"{where}: files[{i}]")
        if f.get("absent") is True:
            entries.append(FileEntry(path, None, None))
        elif isinstance(f.get("sha256"), str) and isinstance(f.get("size"), int):
            entries.append(FileEntry(path, f["sha256"], f["size"]))
        else:
            raise bad(f"files[{i}] ({path}) needs sha256 and size, or absent: true")
    if len({e.path for e in entries}) != len(entries):
        raise bad("a path is listed twice in 'files'")
    root = doc.get("package_root")
    return Manifest(
        name=doc["name"],
        source=doc["source"],
        sglang_version=doc["sglang_version"],
        package_root=root if isinstance(root, str) else None,
        created=doc["created"],
        files=tuple(sorted(entries, key=lambda e: e.path)),
    )


@dataclass(frozen=True)
class Snapshot:
    folder: Path
    manifest: Manifest

    @property
    def name(self) -> str:
        return self.manifest.name

    @property
    def files_dir(self) -> Path:
        return self.folder / FILES

    def read_files(self) -> dict[str, bytes | None]:
        """path -> bytes (None for absent), each checked against the manifest."""
        out: dict[str, bytes | None] = {}
        for entry in self.manifest.files:
            path = self.files_dir / entry.path
            if entry.absent:
                if path.exists():
                    raise BadInput(
                        f"{show(path)}: exists but {MANIFEST} records it as absent",
                        hint=f"take the snapshot {self.name!r} again",
                    )
                out[entry.path] = None
                continue
            if path.is_symlink() or not path.is_file():
                raise BadInput(
                    f"{show(path)}: missing from the snapshot (or not a plain file)",
                    hint=f"take the snapshot {self.name!r} again",
                )
            data = path.read_bytes()
            if len(data) != entry.size or sha256(data) != entry.sha256:
                raise BadInput(
                    f"{show(path)}: sha256 {sha256(data)[:16]}... does not match {MANIFEST} "
                    f"({entry.sha256[:16]}...): the file changed after the snapshot was taken",
                    hint=f"take the snapshot {self.name!r} again; never edit snapshot files by hand",
                )
            out[entry.path] = data
        return out


def load_snapshot(name_or_folder: str | Path) -> Snapshot:
    """A snapshot by name (under snapshot/) or by folder; the manifest is validated, files are not read."""
    folder = Path(name_or_folder)
    if len(folder.parts) == 1 and not folder.is_dir():
        folder = snapshot_root() / check_name(str(name_or_folder))
    manifest_path = folder / MANIFEST
    where = show(manifest_path)
    if not manifest_path.is_file():
        raise BadInput(f"{where}: no such snapshot",
                       hint=f"take one: {next_step.snapshot_release()}")
    try:
        doc = json.loads(manifest_path.read_bytes())
    except ValueError as exc:
        raise BadInput(f"{where}: not valid JSON ({exc})") from None
    return Snapshot(folder=folder, manifest=_manifest_from_json(doc, where))


# ---------------------------------------------------------------------------
# Writing


def _now() -> str:
    return datetime.now(timezone.utc).replace(microsecond=0).isoformat().replace("+00:00", "Z")


@contextmanager
def _one_writer(folder: Path):
    """Serialise the swaps of one snapshot folder across processes (two `check --release` or
    fleet pushes refreshing the same release snapshot): a swap is two renames, and a second
    writer between them would find the name taken by a non-empty folder."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    with open(folder.parent / f".{folder.name}.lock", "a+b") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file is closed
        yield


def _write_folder(folder: Path, manifest: Manifest, files: Mapping[str, bytes | None]) -> None:
    """Build the snapshot beside ``folder`` and swap it in; the old one survives any failure.
    The caller holds ``_one_writer(folder)``."""
    tmp = Path(tempfile.mkdtemp(dir=folder.parent, prefix=f".{folder.name}.new."))
    old = None
    try:
        for path, data in files.items():
            if data is None:
                continue
            dest = tmp / FILES / path
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_bytes(data)
        text = json.dumps(manifest.to_json(), indent=2) + "\n"
        (tmp / MANIFEST).write_text(text, encoding="utf-8")
        if folder.exists():
            old = Path(tempfile.mkdtemp(dir=folder.parent, prefix=f".{folder.name}.old."))
            os.replace(folder, old / "x")
        os.replace(tmp, folder)
    except BaseException:
        if old is not None and not folder.exists():
            os.replace(old / "x", folder)
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    finally:
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)


def snapshot_from_files(
    name: str,
    version: str,
    source: dict,
    files: Mapping[str, bytes | None],
    *,
    package_root: str | None = None,
    root: Path | None = None,
) -> Snapshot:
    """Write ``snapshot/<name>`` from path -> bytes (None: the file is absent there).

    Used for release wheels here and for ``snapshot pull`` from a host. Every path
    is checked before anything is written. When the files and source equal the
    existing snapshot's, its ``created`` time is kept, so a committed manifest
    does not change when nothing did.
    """
    check_name(name)
    if source.get("kind") not in ("pypi", "host"):
        raise BadInput(f"snapshot source kind {source.get('kind')!r} is not 'pypi' or 'host'")
    for path in files:
        check_package_path(path, where=f"snapshot {name}")
    entries = tuple(
        FileEntry(p, None, None) if data is None else FileEntry(p, sha256(data), len(data))
        for p, data in sorted(files.items())
    )
    folder = (root if root is not None else snapshot_root()) / name
    created = _now()
    with _one_writer(folder):  # the comparison with the previous manifest too: no swap under it
        try:
            previous = load_snapshot(folder).manifest
        except BadInput:
            previous = None
        if (
            previous is not None
            and previous.files == entries
            and previous.source == source
            and previous.sglang_version == version
            and previous.package_root == package_root
        ):
            created = previous.created
        manifest = Manifest(name, source, version, package_root, created, entries)
        _write_folder(folder, manifest, files)
    return Snapshot(folder=folder, manifest=manifest)


def all_touched_paths(patches_dir: Path | None = None, payload_dir: Path | None = None) -> tuple[str, ...]:
    """The union of every family's touched paths, so one snapshot serves any family."""
    found: dict[str, None] = {}
    for info in families(patches_dir):
        for path in load_family(info.folder, payload_dir=payload_dir).touched_paths():
            found.setdefault(path, None)
    return tuple(sorted(found))


def snapshot_from_release(
    version: str,
    *,
    name: str | None = None,
    paths: Iterable[str] | None = None,
    root: Path | None = None,
) -> Snapshot:
    """Snapshot the files the series touch from the release's (cached, verified) wheel.

    ``paths`` defaults to the union of what all families touch.
    """
    name = check_name(name or release_name(version))
    wanted = tuple(sorted(set(paths))) if paths is not None else all_touched_paths()
    if not wanted:
        raise BadInput("no family touches any file: nothing to snapshot",
                       hint="add a family under patches/")
    wheel = releases.ensure_wheel(version)
    actual = releases.wheel_version(wheel)
    if releases.parse_version(actual) != releases.parse_version(version):
        raise BadInput(f"{wheel.name}: its METADATA says version {actual}, not {version}")
    found = releases.read_wheel_files(wheel, wanted)
    files: dict[str, bytes | None] = {p: found.get(p) for p in wanted}
    source = {
        "kind": "pypi",
        "project": releases.PROJECT,
        "wheel": wheel.name,
        "sha256": sha256_file(wheel),
    }
    return snapshot_from_files(name, actual, source, files, root=root)


def fresh_release_snapshot(version: str, paths: Iterable[str]) -> Snapshot:
    """The release's snapshot, re-created when it is missing, damaged or does not cover ``paths``.

    A fresh clone has the committed manifest but not SGLang's files: those are
    re-extracted from the cached wheel, and the manifest stays byte-identical.
    """
    name = release_name(version)
    needed = set(paths)
    covered: set[str] = set()
    try:
        snap: Snapshot | None = load_snapshot(name)
    except BadInput:
        snap = None
    if snap is not None:
        covered = set(snap.manifest.paths())
        if needed <= covered and _intact(snap):
            return snap
    return snapshot_from_release(version, name=name, paths=sorted(needed | covered | set(_union_or_empty())))


def _intact(snap: Snapshot) -> bool:
    try:
        snap.read_files()
    except BadInput:
        return False
    return True


def _union_or_empty() -> tuple[str, ...]:
    # Cover every family when they all load; a broken unrelated family must not
    # stop a check of the one asked for (its own error shows when it is checked).
    try:
        return all_touched_paths()
    except BadInput:
        return ()


__all__ = [
    "FileEntry",
    "Manifest",
    "Snapshot",
    "all_touched_paths",
    "check_name",
    "fresh_release_snapshot",
    "load_snapshot",
    "release_name",
    "snapshot_from_files",
    "snapshot_from_release",
    "snapshot_root",
]
