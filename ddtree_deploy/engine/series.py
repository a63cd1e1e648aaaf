"""A patch family: its SGLang version range, its ordered series, and path safety.

A family lives in ``patches/<family>/``: ``family.toml`` gives the SGLang range
(a PEP 440 specifier) and ``series`` lists the entries in order. An entry is a
patch file in the folder, or ``add <source> <dest>``: a whole new file whose
single source lies under the repository's ``payload/``.

Everything here is checked before anything else happens: a path a patch
touches must be relative, normalized and inside the package (``sglang/...``),
so that no later step can be steered outside site-packages. Every problem is a
``BadInput`` naming the file, the line and what to do.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any, Iterable, Union

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version

from ddtree_deploy.base import next_step
from ddtree_deploy.base.errors import BadInput
from ddtree_deploy.base.locations import TOOLKIT, USER, family_roots, new_family_root, repo_dir, user_patches_dir
from ddtree_deploy.base.toml_input import TomlFile
from ddtree_deploy.engine import patch_parse

#: Every path the series may touch starts with this component: the package root
#: is the folder that *contains* ``sglang/`` (site-packages on a host).
PACKAGE = "sglang"
FAMILY_FILE = "family.toml"
SERIES_FILE = "series"
PAYLOAD = "payload"
_FAMILY_KEYS = ("sglang", "description", "smoke")


def show(path: Path) -> str:
    """A path as people want to read it in a message: relative to the cwd when inside it."""
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


# ---------------------------------------------------------------------------
# Path safety


def check_package_path(path: str, *, where: str) -> str:
    """Return ``path`` if it is a safe package-relative path, else raise BadInput.

    Safe: relative, no ``..`` or ``.`` or empty component, no backslash or NUL,
    first component ``sglang``. ``where`` is "file:line" for the message.
    """
    fix = "every path must be package-relative, like sglang/srt/server_args.py"
    if not path:
        raise BadInput(f"{where}: empty path", hint=fix)
    if "\x00" in path or "\\" in path:
        raise BadInput(f"{where}: path {path!r} contains a NUL or a backslash", hint=fix)
    if path.startswith("/"):
        raise BadInput(f"{where}: absolute path {path!r}", hint=fix)
    parts = path.split("/")
    if ".." in parts:
        raise BadInput(f"{where}: path {path!r} contains '..'", hint=fix)
    if any(p in ("", ".") for p in parts):
        raise BadInput(f"{where}: path {path!r} is not normalized (empty or '.' component)", hint=fix)
    if parts[0] != PACKAGE or len(parts) < 2:
        raise BadInput(f"{where}: path {path!r} is outside the {PACKAGE}/ package", hint=fix)
    return path


_HUNK = re.compile(r"^@@ -\d+(?:,(\d+))? \+\d+(?:,(\d+))? @@")


def header_paths(text: str) -> list[tuple[int, str]]:
    """(line, path as written) for every path a patch's headers name, hunk bodies skipped.

    Covers ``diff --git a/x b/y``, ``--- x``, ``+++ x`` and git's rename/copy lines.
    This runs before the patch engine parses anything, so a hostile path is
    refused as a path, whatever else is wrong with the patch. Hunk bodies are
    skipped by their line counts, so a removed line reading "-- /x" is content,
    not a header.
    """
    lines = text.split("\n")
    found: list[tuple[int, str]] = []
    i = 0
    while i < len(lines):
        line = lines[i].rstrip("\r")
        m = _HUNK.match(line)
        if m:
            old = int(m.group(1)) if m.group(1) is not None else 1
            new = int(m.group(2)) if m.group(2) is not None else 1
            i += 1
            while (old > 0 or new > 0) and i < len(lines):
                body = lines[i]
                if body.startswith("\\"):
                    pass
                elif body.startswith("-"):
                    old -= 1
                elif body.startswith("+"):
                    new -= 1
                elif body.startswith(" ") or body in ("", "\r"):
                    old, new = old - 1, new - 1
                else:
                    break  # a malformed hunk: the engine will say so
                i += 1
            continue
        if line.startswith(("--- ", "+++ ")):
            # diff -u appends a tab and a timestamp.
            found.append((i + 1, line[4:].split("\t", 1)[0].rstrip()))
        elif line.startswith("diff --git "):
            tokens = line.split(" ")
            if len(tokens) == 4:
                found.extend([(i + 1, tokens[2]), (i + 1, tokens[3])])
        elif line.startswith(("rename from ", "rename to ", "copy from ", "copy to ")):
            # git writes these without the a/ b/ prefix: give them one to strip.
            found.append((i + 1, "x/" + line.split(" ", 2)[2]))
        i += 1
    return found


def check_header_path(raw: str, *, where: str) -> None:
    """A header path as written (``a/sglang/x.py`` or ``/dev/null``): safe once a/ is stripped.

    Stripping the ``a/`` component would hide an absolute path (``/etc/x`` strips
    to ``etc/x``), so absolute and ``..`` paths are caught on the raw text first.
    """
    if raw == "/dev/null":
        return
    hint = "patch paths must look like a/sglang/... and b/sglang/..."
    if raw.startswith("/"):
        raise BadInput(f"{where}: absolute path {raw!r} in a patch header", hint=hint)
    parts = raw.replace("\\", "/").split("/")
    if ".." in parts:
        raise BadInput(f"{where}: path {raw!r} contains '..'", hint=hint)
    if "" in parts:
        raise BadInput(f"{where}: path {raw!r} has an empty component (a doubled '/')",
                       hint="write it with single slashes, like a/sglang/srt/server_args.py, or make the "
                            "patch again with plain git diff")
    # Like patch -p1, the engine strips exactly one leading component (git's a/ and b/).
    if parts[0] == PACKAGE:
        raise BadInput(f"{where}: path {raw!r} has no prefix before {PACKAGE}/ (git diff --no-prefix?); "
                       "the engine strips one leading component, as patch -p1 does",
                       hint="make the patch with git's a/ and b/ prefixes: git diff without --no-prefix")
    if parts[1:2] != [PACKAGE] and PACKAGE in parts[2:-1]:
        prefix = "/".join(parts[:parts.index(PACKAGE, 2)]) + "/"
        raise BadInput(f"{where}: path {raw!r} has a prefix of several components ({prefix!r}, a custom "
                       "git diff --src-prefix/--dst-prefix?); the engine strips one leading component, "
                       "as patch -p1 does",
                       hint="make the patch with git's a/ and b/ prefixes (or any one-component prefixes)")
    stripped = raw.split("/", 1)[1] if "/" in raw else raw
    check_package_path(stripped, where=where)


# ---------------------------------------------------------------------------
# The typed family


@dataclass(frozen=True)
class FamilyInfo:
    """What ``family.toml`` says: enough to pick a family without parsing its patches.

    Also whose it is (``origin``: the toolkit's, or the user's own, found in the user's
    folder: see locations.family_roots) and whether it is an unfinished port (``rejects``:
    the .rej files port left in it). An unfinished family is never chosen by version range.
    """

    name: str
    folder: Path
    specifier: SpecifierSet
    description: str
    smoke: Any = None  # smoke_settings.FamilySmoke: how this family's tree shows to the smoke ([smoke])
    origin: str = TOOLKIT  # locations.TOOLKIT or locations.USER
    rejects: tuple[str, ...] = ()  # names of the .rej files in the folder

    @property
    def users(self) -> bool:
        return self.origin == USER

    @property
    def unfinished(self) -> bool:
        return bool(self.rejects)

    @property
    def label(self) -> str:
        """The name as every listing shows it: whose it is and whether it is finished."""
        notes = []
        if self.users:
            notes.append(f"yours, in {show(self.folder.parent)}")
        if self.unfinished:
            n = len(self.rejects)
            notes.append(f"an unfinished port: {n} .rej file{'s' if n > 1 else ''}")
        return f"{self.name} ({'; '.join(notes)})" if notes else self.name

    def covers(self, version: str | Version) -> bool:
        v = version if isinstance(version, Version) else Version(str(version))
        # Post- and pre-releases count: 0.5.12.post1 is a 0.5.12 release.
        return self.specifier.contains(v, prereleases=True)


@dataclass(frozen=True)
class PatchEntry:
    """A patch file of the series."""

    name: str  # the file name, as written in ``series``
    line: int  # its line in ``series``
    file: Path
    file_patches: tuple[patch_parse.FilePatch, ...]

    kind = "patch"

    def paths(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(fp.path for fp in self.file_patches))


@dataclass(frozen=True)
class AddEntry:
    """``add <source> <dest>``: a whole new file, its bytes read at load time."""

    source: str  # as written, e.g. payload/ddtree_utils.py
    dest: str  # package-relative, e.g. sglang/srt/speculative/ddtree_utils.py
    line: int
    file: Path
    content: bytes

    kind = "add"

    @property
    def name(self) -> str:
        return f"add {self.source}"

    def paths(self) -> tuple[str, ...]:
        return (self.dest,)


Entry = Union[PatchEntry, AddEntry]


@dataclass(frozen=True)
class Series:
    """A loaded, validated family: every patch parsed, every path checked."""

    info: FamilyInfo
    series_file: Path
    entries: tuple[Entry, ...]

    @property
    def name(self) -> str:
        return self.info.name

    @property
    def specifier(self) -> SpecifierSet:
        return self.info.specifier

    def touched_paths(self) -> tuple[str, ...]:
        """Package-relative paths the series changes or creates, in first-use order."""
        return tuple(self.origins())

    def origins(self) -> dict[str, str]:
        """Each touched path -> "file:line" of the first place that names it (for messages)."""
        found: dict[str, str] = {}
        for entry in self.entries:
            if isinstance(entry, PatchEntry):
                for fp in entry.file_patches:
                    found.setdefault(fp.path, f"{show(entry.file)}:{fp.header_line}")
            else:
                found.setdefault(entry.dest, f"{show(self.series_file)}:{entry.line}")
        return found


# ---------------------------------------------------------------------------
# Loading


_SGLANG_EXAMPLE = 'e.g. sglang = ">=0.5.12,<0.5.13"'


def read_family_info(folder: Path) -> FamilyInfo:
    """Read and validate ``<folder>/family.toml`` (messages in toml_input's one format)."""
    toml_path = folder / FAMILY_FILE
    where = show(toml_path)
    if not toml_path.is_file():
        raise BadInput(
            f"{where}: missing",
            hint='a family folder needs family.toml with sglang = "<PEP 440 range>"',
        )
    text = toml_path.read_text(encoding="utf-8", errors="replace")
    doc = TomlFile(text, source=where)
    doc.unknown("", _FAMILY_KEYS)
    raw = doc.get("sglang")
    if not isinstance(raw, str):
        what = "missing" if raw is None else f"not {raw!r}"
        raise doc.bad("sglang", f"must be a string holding a PEP 440 specifier ({what})", _SGLANG_EXAMPLE)
    try:
        spec = SpecifierSet(raw)
    except InvalidSpecifier:
        raise doc.bad("sglang", f"{raw!r} is not a valid PEP 440 specifier", _SGLANG_EXAMPLE) from None
    if not str(spec):
        raise doc.bad("sglang", f"{raw!r} is empty: a family must name its SGLang range", _SGLANG_EXAMPLE)
    description = doc.get("description")
    if description is None:
        description = ""
    elif not isinstance(description, str):
        raise doc.bad("description", f"must be a string, not {description!r}",
                      'write it in quotes: description = "..."')
    doc.table("smoke")  # a [smoke] that is no table: this format; its keys are smoke_settings'
    # [smoke]: validated here, with the rest of the family, so a bad key stops a push
    # before it changes anything (ddtree_deploy.settings.smoke owns the keys).
    from ddtree_deploy.settings.smoke import parse_family_smoke

    smoke = parse_family_smoke(doc)  # its TomlFile: a wrong key names its line
    return FamilyInfo(name=folder.name, folder=folder, specifier=spec, description=description, smoke=smoke,
                      origin=origin_of(folder), rejects=tuple(sorted(p.name for p in folder.glob("*.rej"))))


def origin_of(folder: Path) -> str:
    """USER for a family in the user's own folder (locations.user_patches_dir), else TOOLKIT."""
    user = user_patches_dir()
    if user is not None and folder.resolve().is_relative_to(user.resolve()):
        return USER
    return TOOLKIT


def _read_series_lines(path: Path) -> list[tuple[int, str]]:
    if not path.is_file():
        raise BadInput(f"{show(path)}: missing", hint="a family folder needs a 'series' file")
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BadInput(f"{show(path)}: not UTF-8 ({exc.reason} at byte {exc.start})") from None
    out = []
    for number, line in enumerate(text.split("\n"), start=1):
        stripped = line.strip()
        if stripped and not stripped.startswith("#"):
            out.append((number, stripped))
    return out


def _load_patch(folder: Path, name: str, number: int, where: str) -> PatchEntry:
    if "/" in name or "\\" in name or name in (".", ".."):
        raise BadInput(
            f"{where}: entry {name!r} is not a file name in the family folder",
            hint="list patch files by name; new whole files use 'add payload/<file> sglang/<dest>'",
        )
    file = folder / name
    if not file.is_file():
        raise BadInput(f"{where}: entry {name!r} does not exist ({show(file)})",
                       hint="add the patch file or remove the entry")
    # A symlink in the family folder must not smuggle in a file from elsewhere (as for 'add').
    if not file.resolve().is_relative_to(folder.resolve()):
        raise BadInput(f"{where}: entry {name!r} is a symlink to {file.resolve()}, outside the family "
                       f"folder {show(folder)}",
                       hint="copy the patch into the family folder instead of linking to it")
    try:
        text = file.read_bytes().decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BadInput(f"{show(file)}: not UTF-8 ({exc.reason} at byte {exc.start})") from None
    for line, raw in header_paths(text):
        check_header_path(raw, where=f"{show(file)}:{line}")
    file_patches = tuple(patch_parse.parse_patch(text, name=show(file)))
    for fp in file_patches:
        at = f"{show(file)}:{fp.header_line}"
        # The engine's stripped view too, whatever form the headers took.
        for p in (fp.source_path, fp.target_path):
            if p is not None:
                check_package_path(p, where=at)
        if fp.is_deletion:
            # A deploy replaces files and can restore them; it never removes package files.
            raise BadInput(f"{at}: the patch deletes {fp.path}; deleting package files is not supported")
        if fp.source_path is not None and fp.target_path is not None and fp.source_path != fp.target_path:
            raise BadInput(
                f"{at}: the patch renames {fp.source_path} to {fp.target_path}; renames are not supported"
            )
    return PatchEntry(name=name, line=number, file=file, file_patches=file_patches)


def _load_add(tokens: list[str], number: int, where: str, payload_dir: Path) -> AddEntry:
    usage = "write: add payload/<file> sglang/<package-relative destination>"
    if len(tokens) != 3:
        raise BadInput(f"{where}: 'add' takes a source and a destination", hint=usage)
    _, source, dest = tokens
    parts = PurePosixPath(source).parts
    if source.startswith("/") or ".." in source.split("/") or len(parts) < 2 or parts[0] != PAYLOAD:
        raise BadInput(f"{where}: add source {source!r} must be a path inside {PAYLOAD}/", hint=usage)
    check_package_path(dest, where=where)
    file = payload_dir.joinpath(*parts[1:])
    if not file.is_file():
        raise BadInput(f"{where}: add source {source!r} does not exist ({show(file)})",
                       hint="create the payload file or remove the entry")
    # A symlink inside payload/ must not smuggle in a file from elsewhere.
    if not file.resolve().is_relative_to(payload_dir.resolve()):
        raise BadInput(f"{where}: add source {source!r} resolves outside {PAYLOAD}/ ({file.resolve()})")
    return AddEntry(source=source, dest=dest, line=number, file=file, content=file.read_bytes())


def load_family(folder: Path | str, *, payload_dir: Path | None = None) -> Series:
    """Load and validate a family folder: range, entries, patches, paths.

    ``folder`` is a path, or a family name looked up under ``patches/``.
    ``payload_dir`` is where ``add payload/...`` sources live. By default it is
    the ``payload/`` beside the ``patches/`` that holds the family (sources are
    repository-relative), or DDTREE_DEPLOY_PAYLOAD when set.
    """
    folder = family_folder(folder)
    if not folder.is_dir():
        raise BadInput(no_such_family(show(folder)), hint=NO_SUCH_FAMILY_HINT)
    if payload_dir is None:
        # Sources are repository-relative: the payload/ beside the family's patches/, or (a
        # user's family, made by port, has none beside it) the toolkit's own.
        beside = folder.resolve().parent.parent / PAYLOAD
        payload_dir = (repo_dir(PAYLOAD) if os.environ.get("DDTREE_DEPLOY_PAYLOAD") or not beside.is_dir()
                       else beside)
    info = read_family_info(folder)
    series_file = folder / SERIES_FILE
    entries: list[Entry] = []
    seen: dict[str, int] = {}
    for number, text in _read_series_lines(series_file):
        where = f"{show(series_file)}:{number}"
        tokens = text.split()
        if tokens[0] == "add":
            add = _load_add(tokens, number, where, payload_dir)
            entry: Entry = add
            key = f"add -> {add.dest}"
        elif len(tokens) == 1:
            entry = _load_patch(folder, tokens[0], number, where)
            key = entry.name
        else:
            raise BadInput(f"{where}: cannot read entry {text!r}",
                           hint="one patch file name per line, or 'add <source> <dest>'")
        if key in seen:
            raise BadInput(f"{where}: duplicate entry {text!r} (already on line {seen[key]})",
                           hint="each patch is applied once; remove one of the lines")
        seen[key] = number
        entries.append(entry)
    if not entries:
        raise BadInput(f"{show(series_file)}: the series has no entries")
    return Series(info=info, series_file=series_file, entries=tuple(entries))


def families(patches_dir: Path | None = None) -> list[FamilyInfo]:
    """Every family (folders holding a family.toml): under ``patches_dir``, or else the toolkit's
    then the user's own (locations.family_roots), each by name."""
    roots = [patches_dir] if patches_dir is not None else [root for root, _ in family_roots()]
    found = []
    for root in roots:
        if root.is_dir():
            found += [read_family_info(d) for d in sorted(root.iterdir()) if (d / FAMILY_FILE).is_file()]
    return found


# ---------------------------------------------------------------- naming and choosing a family
# The one home of "which family": --family as a name or a folder, a host's journal naming a
# family, the family that covers an SGLang version; with one text for each failure.

NO_FAMILY_HINT = "a family is a folder with family.toml and series"


def family_folder(name: Path | str, patches_dir: Path | None = None) -> Path:
    """The folder ``--family`` names: a bare name (one path component that is not a folder
    here) is the family of that name under ``patches_dir``, or else in the toolkit's or the
    user's folder; anything else is the path as given. It may not exist yet (``port --into``
    names a new one: it goes to locations.new_family_root)."""
    folder = Path(name)
    if folder.is_dir() or len(folder.parts) != 1:
        return folder
    if patches_dir is not None:
        return patches_dir / folder
    found = [root / folder for root, _ in family_roots() if (root / folder / FAMILY_FILE).is_file()]
    if len(found) > 1:
        raise BadInput(f"family {str(name)!r} is both the toolkit's ({show(found[0])}) and yours ({show(found[1])})",
                       hint="name it by its folder, or rename yours")
    return found[0] if found else new_family_root() / folder


NO_SUCH_FAMILY_HINT = "name a family under patches/ or give a family folder (family.toml + series)"


def no_such_family(name: str, patches_dir: Path | None = None) -> str:
    """The one text for a family name or folder that is not a family (hint: NO_SUCH_FAMILY_HINT)."""
    known = ", ".join(f.label for f in families(patches_dir)) or "(none)"
    return f"no such family {name!r} (families here: {known})"


def require_families(patches_dir: Path | None = None) -> list[FamilyInfo]:
    """Every family, or BadInput when there is none."""
    infos = families(patches_dir)
    if not infos:
        raise BadInput("no family under patches/", hint=NO_FAMILY_HINT)
    return infos


def known_family(name: object, patches_dir: Path | None = None) -> Path | None:
    """The folder of the family called ``name`` among the known ones, else None. For a name
    that comes from a host (its journal): only ever a key among the families here, never a path."""
    if not isinstance(name, str):
        return None
    return {f.name: f.folder for f in families(patches_dir)}.get(name)


def choose_series(version: str, family: Path | str | None = None) -> Series:
    """The series for SGLang ``version``: the ``--family`` given (name or folder; whether it covers
    ``version``, or is finished, is the caller's call), else the one finished family whose range
    contains it."""
    if family:
        return load_family(family)
    return load_family(pick_family(version, families()).folder)


def require_finished(series: Series, command: str) -> None:
    """An unfinished port (a family with .rej files) is never deployed, even named with --family."""
    info = series.info
    if info.unfinished:
        raise BadInput(f"family {info.label} still has hunks port could not place ({', '.join(info.rejects)}); "
                       f"{command} refuses an unfinished port",
                       hint=f"apply the rejected hunks in its working tree, then run "
                            f"{next_step.series_refresh(info.name, 'TREE')}")


def pick_family(version: str, infos: Iterable[FamilyInfo]) -> FamilyInfo:
    """The one finished family whose range contains ``version`` (an unfinished port, one with
    .rej files, is never chosen by its range: only by name, with --family)."""
    try:
        v = Version(version)
    except InvalidVersion:
        raise BadInput(f"SGLang version {version!r} is not a valid PEP 440 version") from None
    infos = list(infos)
    matches = [f for f in infos if f.covers(v) and not f.unfinished]
    listing = ", ".join(f"{f.label} ({f.specifier})" for f in infos) or "(none)"
    if not matches:
        unfinished = [f for f in infos if f.covers(v)]
        if unfinished:
            raise BadInput(f"no finished family covers SGLang {version}: {', '.join(f.label for f in unfinished)} "
                           "is not chosen by its range until its rejected hunks are placed",
                           hint=f"finish it (apply the .rej hunks in its working tree, then series refresh "
                                f"--resolved), or name it: --family {unfinished[0].name}")
        raise BadInput(f"no family covers SGLang {version}; families: {listing}",
                       hint="add a family for this release, or force one with --family")
    if len(matches) > 1:
        raise BadInput(
            f"SGLang {version} is covered by several families: {', '.join(f.name for f in matches)}",
            hint="make the families' ranges disjoint, or choose with --family",
        )
    return matches[0]


def check_no_symlink_escape(series: Series, root: Path) -> None:
    """No touched path may leave ``root`` through a symlink already in ``root``.

    ``root`` is the folder that contains ``sglang/`` (a snapshot's files/ or a
    package root). Each existing component is resolved; one that lands outside
    ``root`` is refused before anything reads or writes through it.
    """
    base = root.resolve()
    for path, origin in series.origins().items():
        current = root
        for part in path.split("/"):
            current = current / part
            if current.is_symlink() and not current.resolve().is_relative_to(base):
                raise BadInput(
                    f"{origin}: {path} passes through a symlink {show(current)} -> "
                    f"{current.resolve()} outside the package root",
                    hint="remove the symlink from the snapshot or take the snapshot again",
                )


__all__ = [
    "PACKAGE",
    "AddEntry",
    "Entry",
    "FamilyInfo",
    "PatchEntry",
    "Series",
    "check_no_symlink_escape",
    "check_package_path",
    "choose_series",
    "families",
    "family_folder",
    "known_family",
    "NO_SUCH_FAMILY_HINT",
    "no_such_family",
    "origin_of",
    "require_families",
    "require_finished",
    "load_family",
    "pick_family",
    "read_family_info",
    "show",
]
