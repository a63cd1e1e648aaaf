"""The compatibility matrix as a value: release x series entry, with verdicts and renderings.

Pure: no downloads, no applying, no printing. ``matrix_run`` fills it from real
wheels; the CLI prints it; the CI workflow publishes its markdown. Keeping the
model pure lets the verdict and exit-code rules be tested on hand-made rows.

Rules (issue 7):
- each release is judged with the family whose version range contains it;
- a failure of a release *inside* its family's range fails the run (exit 1);
- a release newer than every range is "uncovered" (exit 1 only with --strict); it
  is still probed with the newest family, so the report says whether a port
  would be trivial and, from the release facts, why not;
- a release older than every range (or in a gap between ranges) has "no family";
- with an explicit family, every release gets that family, and releases outside
  its range are "outside range" (informational).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Iterable, Mapping, Sequence

from packaging.version import Version

from ddtree_deploy.engine.check import ALREADY, FAILED, PARTLY, SKIPPED, EntryCheck, FileCheck
from ddtree_deploy.engine.patch_apply import HunkStatus
from ddtree_deploy.engine.series import FamilyInfo, pick_family
from ddtree_deploy.release.cuda_lanes import lane_label
from ddtree_deploy.release.facts import ReleaseFacts


class CellStatus(str, Enum):
    EXACT = "exact"
    OFFSET = "offset"
    ALREADY_APPLIED = "already-applied"
    FUZZ = "fuzz"
    # Some hunks of a file already in the release, others not: never "ok" (the release took
    # part of the change, or a forward match elsewhere would duplicate it).
    PARTLY = "partly applied"
    SKIPPED = "skipped"  # an earlier entry failed on the same file
    FAILED = "failed"
    NO_FAMILY = "no family"


# Worst first decides a cell made of several hunks. Already-applied ranks above
# offset: it means upstream changed under the patch, which an engineer must read.
_SEVERITY = {
    CellStatus.EXACT: 0,
    CellStatus.OFFSET: 1,
    CellStatus.ALREADY_APPLIED: 2,
    CellStatus.FUZZ: 3,
    CellStatus.PARTLY: 4,
    CellStatus.SKIPPED: 5,
    CellStatus.FAILED: 6,
    CellStatus.NO_FAMILY: 7,
}

_FROM_HUNK = {
    HunkStatus.EXACT: CellStatus.EXACT,
    HunkStatus.OFFSET: CellStatus.OFFSET,
    HunkStatus.FUZZ: CellStatus.FUZZ,
    HunkStatus.ALREADY_APPLIED: CellStatus.ALREADY_APPLIED,
    HunkStatus.FAILED: CellStatus.FAILED,
}


@dataclass(frozen=True)
class Cell:
    """One series entry applied to one release."""

    entry: str
    status: CellStatus
    note: str = ""  # "+3", "fuzz 1", or for a failure: where and what differs

    @property
    def ok(self) -> bool:
        return self.status not in (CellStatus.FAILED, CellStatus.PARTLY, CellStatus.SKIPPED,
                                   CellStatus.NO_FAMILY)

    def short(self) -> str:
        """The text of a table cell."""
        if self.status is CellStatus.OFFSET and self.note:
            return f"offset {self.note}"
        if self.status is CellStatus.FUZZ and self.note:
            return self.note
        return self.status.value


def _quote(text: str | None, width: int = 60) -> str:
    if text is None:
        return "<end of file>"
    text = text.rstrip("\n")
    return repr(text if len(text) <= width else text[: width - 3] + "...")


def _failure_note(fc: FileCheck) -> str:
    """The first problem of a failed file, precisely: what a porting engineer reads first."""
    bad = next((h for h in fc.hunks if h.status is HunkStatus.FAILED), None)
    if bad is None:
        return f"{fc.path}: {fc.message or 'failed'}"
    note = f"{fc.path} hunk {bad.index} (patch line {bad.patch_line})"
    if bad.ambiguous:
        note += f", ambiguous: old lines at line {bad.nearest_line}, new lines at line {bad.new_side_line}"
    elif bad.nearest_line is not None:
        note += f", nearest line {bad.nearest_line}"
    if bad.mismatches:
        m = bad.mismatches[0]
        note += f": line {m.line} expected {_quote(m.expected)}, found {_quote(m.actual)}"
    more = sum(1 for h in fc.hunks if h.status is HunkStatus.FAILED) - 1
    if more > 0:
        note += f" (+{more} more failed hunk{'s' if more > 1 else ''})"
    return note


def cell_from_entry(entry: EntryCheck) -> Cell:
    """Summarize one entry's check (its files and hunks) into one cell.

    The worst hunk decides. A file the entry could not touch because an earlier
    entry failed on it makes the cell "skipped" (the earlier cell says why).
    """
    failed = [f for f in entry.files if f.status == FAILED]
    if failed:
        return Cell(entry.name, CellStatus.FAILED, "; ".join(_failure_note(f) for f in failed))
    partly = [f for f in entry.files if f.status == PARTLY and not f.ok]
    if partly:
        return Cell(entry.name, CellStatus.PARTLY, "; ".join(f"{f.path}: {f.message}" for f in partly))
    skipped = [f for f in entry.files if f.status == SKIPPED]
    if skipped:
        return Cell(entry.name, CellStatus.SKIPPED, "; ".join(f"{f.path}: {f.message}" for f in skipped))
    hunks = [h for f in entry.files for h in f.hunks]
    if not hunks:
        # An ``add`` entry, or a section without hunks: the file was written whole.
        whole = [f for f in entry.files if f.status == ALREADY]
        return Cell(entry.name, CellStatus.ALREADY_APPLIED if whole else CellStatus.EXACT)
    worst = max((_FROM_HUNK[h.status] for h in hunks), key=_SEVERITY.__getitem__)
    if worst is CellStatus.OFFSET:
        biggest = max((h.offset for h in hunks if h.status is HunkStatus.OFFSET), key=abs)
        return Cell(entry.name, worst, f"{biggest:+d}")
    if worst is CellStatus.FUZZ:
        return Cell(entry.name, worst, f"fuzz {max(h.fuzz for h in hunks)}")
    return Cell(entry.name, worst)


class Coverage(str, Enum):
    IN_RANGE = "in range"  # judged by the family whose range contains it
    UNCOVERED = "uncovered"  # newer than every family's range (probed with the newest)
    NO_FAMILY = "no family"  # older than every range, or in a gap: not judged
    OUTSIDE = "outside range"  # an explicitly chosen family, applied outside its range


def upper_bound(info: FamilyInfo) -> tuple[Version, bool] | None:
    """The family range's upper end as (version, inclusive), or None when it is open.

    Read from the specifier's ``<``, ``<=``, ``==`` and ``~=`` clauses; this is what
    tells "newer than every range" (uncovered) from "older" or "in a gap" (no family).
    """
    bounds: list[tuple[Version, bool]] = []
    for clause in info.specifier:
        op, raw = clause.operator, clause.version
        if op in ("<", "<=", "==", "==="):
            if raw.endswith(".*"):
                continue  # == 0.5.* : no simple upper end; treat as open on that clause
            try:
                bounds.append((Version(raw), op != "<"))
            except ValueError:
                continue
        elif op == "~=":
            parts = Version(raw).release
            # ~=0.5.12 means >=0.5.12,<0.6 (the last component is free).
            head = list(parts[:-1]) if len(parts) > 1 else list(parts)
            head[-1] += 1
            bounds.append((Version(".".join(map(str, head))), False))
    if not bounds:
        return None
    return min(bounds, key=lambda b: (b[0], b[1]))


def _newer_than(version: Version, info: FamilyInfo) -> bool:
    bound = upper_bound(info)
    if bound is None:
        return False
    top, inclusive = bound
    return version > top if inclusive else version >= top


def assign(version: str, infos: Sequence[FamilyInfo], chosen: FamilyInfo | None = None
           ) -> tuple[FamilyInfo | None, Coverage]:
    """Which family to apply to ``version`` and how the result counts.

    ``chosen``: the family named with ``--family`` (applied everywhere). Otherwise the
    covering family; when none covers it, the newest family as a probe if the release
    is newer than every range ("uncovered"), else nothing ("no family"). Several
    covering families are an error in the families (``series.pick_family`` says so).
    """
    v = Version(version)
    if chosen is not None:
        return chosen, Coverage.IN_RANGE if chosen.covers(v) else Coverage.OUTSIDE
    infos = [f for f in infos if not f.unfinished]  # an unfinished port is applied only when named
    covering = [f for f in infos if f.covers(v)]
    if covering:
        return pick_family(version, infos), Coverage.IN_RANGE
    if infos and all(_newer_than(v, f) for f in infos):
        newest = max(infos, key=lambda f: (upper_bound(f) or (Version("0"), False))[0])
        return newest, Coverage.UNCOVERED
    return None, Coverage.NO_FAMILY


@dataclass(frozen=True)
class ReleaseRow:
    version: str
    family: str | None  # the family applied; None when nothing was applied
    coverage: Coverage
    cells: tuple[Cell, ...] = ()
    compile_errors: tuple[str, ...] = ()  # "sglang/x.py:12: invalid syntax"
    facts: ReleaseFacts | None = None
    why: str = ""  # release facts and probe result, for people
    smoke: tuple[tuple[str, str, str], ...] = ()  # --import: (level, status, detail) each

    @property
    def applies(self) -> bool:
        """The family applied cleanly and every result byte-compiled."""
        return self.family is not None and all(c.ok for c in self.cells) and not self.compile_errors

    @property
    def smoke_ok(self) -> bool:
        """No smoke level failed (true when none ran)."""
        return all(status != "failed" for _, status, _ in self.smoke)

    @property
    def verdict(self) -> str:
        if self.coverage is Coverage.IN_RANGE:
            if not (self.applies and self.smoke_ok):
                return "failed"
            if self.cells and all(c.status is CellStatus.ALREADY_APPLIED for c in self.cells):
                # Nothing to apply: the release already has the whole change. Not a failure,
                # but never "ok", which would read as "the family adds something here".
                return "already upstream"
            return "ok"
        return self.coverage.value

    def smoke_text(self) -> str:
        if not self.smoke:
            return "-"
        failed = [level for level, status, _ in self.smoke if status == "failed"]
        if failed:
            return "/".join(failed) + " failed"
        return "passed" if all(status == "passed" for _, status, _ in self.smoke) else "skipped"

    def compile_text(self) -> str:
        if self.family is None:
            return "-"
        if not all(c.ok for c in self.cells):
            return "skipped"  # nothing meaningful to compile when a hunk failed
        return "ok" if not self.compile_errors else f"{len(self.compile_errors)} error(s)"

    def to_json(self) -> dict:
        return {
            "version": self.version,
            "family": self.family,
            "cuda_lane": lane_label(self.version),
            "coverage": self.coverage.value,
            "verdict": self.verdict,
            "cells": [{"entry": c.entry, "status": c.status.value, "note": c.note} for c in self.cells],
            "compile": self.compile_text(),
            "compile_errors": list(self.compile_errors),
            "facts": self.facts.to_json() if self.facts else None,
            "why": self.why,
            "smoke": [{"level": lv, "status": st, "detail": d} for lv, st, d in self.smoke],
        }


@dataclass(frozen=True)
class Timings:
    """Where a run's time went, in seconds.

    Wall-clock phases: ``listing`` (release listing, family parsing), ``download``
    (wheels fetched or verified in the cache), ``check`` (apply + byte-compile in
    parallel workers), ``report`` (facts history, verdicts). Summed over workers:
    ``check_cpu`` (reading the wheel, applying, byte-compiling) and, when measured
    (benchmark), ``compile_cpu``: the byte-compile part of it.
    """

    listing: float = 0.0
    download: float = 0.0
    check: float = 0.0
    report: float = 0.0
    total: float = 0.0
    check_cpu: float = 0.0
    compile_cpu: float | None = None
    smoke: float = 0.0  # --import: throwaway venvs and their smoke levels

    def to_json(self) -> dict:
        return {k: (None if v is None else round(v, 3)) for k, v in self.__dict__.items()}

    def line(self) -> str:
        text = (
            f"{self.total:.1f} s: listing {self.listing:.1f} s, download {self.download:.1f} s, "
            f"apply+compile {self.check:.1f} s, report {self.report:.2f} s"
        )
        if self.smoke:
            text += f", import smoke {self.smoke:.1f} s"
        if self.compile_cpu is not None:
            text += (f" (worker CPU: read+apply {self.check_cpu - self.compile_cpu:.2f} s, "
                     f"byte-compile {self.compile_cpu:.2f} s)")
        return text


def short_entry(entry: str) -> str:
    """Column title: "0003" for "0003-server-args.patch", "+ddtree_utils.py" for an add."""
    if entry.startswith("add "):
        return "+" + entry.rsplit("/", 1)[-1]
    head = entry.split("-", 1)[0]
    return head if head.isdigit() else entry


@dataclass(frozen=True)
class Matrix:
    rows: tuple[ReleaseRow, ...]
    timings: Timings = field(default_factory=Timings)
    strict: bool = False
    # family name -> (its label for listings, its origin): whose each family is (series.FamilyInfo)
    families: Mapping[str, tuple[str, str]] = field(default_factory=dict)

    def label(self, family: str | None) -> str | None:
        return self.families.get(family, (family, None))[0] if family else family

    def columns(self) -> tuple[str, ...]:
        """Every entry name, in order of first appearance across the rows."""
        seen: dict[str, None] = {}
        for row in self.rows:
            for cell in row.cells:
                seen.setdefault(cell.entry, None)
        return tuple(seen)

    def failures(self) -> tuple[ReleaseRow, ...]:
        return tuple(r for r in self.rows if r.verdict == "failed")

    def uncovered(self) -> tuple[ReleaseRow, ...]:
        return tuple(r for r in self.rows if r.coverage is Coverage.UNCOVERED)

    @property
    def exit_code(self) -> int:
        if self.failures():
            return 1
        if self.strict and self.uncovered():
            return 1
        return 0

    def summary(self) -> str:
        counts: dict[str, int] = {}
        for row in self.rows:
            counts[row.verdict] = counts.get(row.verdict, 0) + 1
        parts = [f"{n} {verdict}" for verdict, n in counts.items()]
        return f"{len(self.rows)} release(s): " + ", ".join(parts)

    def tables(self) -> list[tuple[str | None, list[str], list[list[str]]]]:
        """One text table per family, its own entries as columns (families share no entry
        names, so one table over all of them is mostly "-"): (family, header, rows), in order
        of the families' first release; releases no family judged come last, under None."""
        groups: dict[str | None, list[ReleaseRow]] = {}
        for row in self.rows:
            groups.setdefault(row.family, []).append(row)
        if None in groups:
            groups[None] = groups.pop(None)
        return [(family, *Matrix(tuple(rows), self.timings, self.strict, self.families).table())
                for family, rows in groups.items()]

    def table(self) -> tuple[list[str], list[list[str]]]:
        """Header and rows of strings for a text table (the markdown report renders it)."""
        columns = self.columns()
        smoked = any(row.smoke for row in self.rows)
        # "cuda": the release's CUDA lane (cuda_lanes.py): cu129 up to 0.5.19, cu130 from 0.5.20.
        header = ["release", "cuda", "family", *map(short_entry, columns), "compile",
                  *(["import"] if smoked else []), "verdict", "why"]
        body = []
        for row in self.rows:
            by_entry = {c.entry: c for c in row.cells}
            cells = []
            for name in columns:
                cell = by_entry.get(name)
                cells.append(cell.short() if cell else ("no family" if row.family is None else "-"))
            smoke = [row.smoke_text()] if smoked else []
            body.append([row.version, lane_label(row.version), row.family or "-", *cells, row.compile_text(), *smoke,
                         row.verdict, row.why])
        return header, body

    def details(self) -> list[str]:
        """One line per failed cell or compile error: what an engineer has to look at."""
        lines = []
        for row in self.rows:
            for cell in row.cells:
                if cell.status in (CellStatus.FAILED, CellStatus.PARTLY):
                    lines.append(f"{row.version} [{row.family}] {cell.entry}: {cell.note}")
            for error in row.compile_errors:
                lines.append(f"{row.version} [{row.family}] compile: {error}")
            for level, status, detail in row.smoke:
                if status == "failed":
                    lines.append(f"{row.version} [{row.family}] {level}: {detail}")
        return lines

    def to_json(self) -> dict:
        return {
            "columns": list(self.columns()),
            "rows": [{**r.to_json(), "family_origin": self.families.get(r.family, (None, None))[1]}
                     for r in self.rows],
            "failed": [r.version for r in self.failures()],
            "uncovered": [r.version for r in self.uncovered()],
            "strict": self.strict,
            "exit_code": self.exit_code,
            "timings_s": self.timings.to_json(),
        }

    def to_markdown(self) -> str:
        header, body = self.table()

        def esc(text: str) -> str:
            return text.replace("|", "\\|").replace("\n", " ")

        out = ["# DDTree series vs SGLang releases", ""]
        out.append(f"{self.summary()}. Exit code {self.exit_code}" + (" (strict)." if self.strict else "."))
        out.append("")
        out.append("| " + " | ".join(esc(h) for h in header) + " |")
        out.append("|" + "---|" * len(header))
        for cells in body:
            out.append("| " + " | ".join(esc(c) for c in cells) + " |")
        out.append("")
        columns = self.columns()
        if columns:
            out.append("Columns: " + "; ".join(f"`{short_entry(c)}` = `{c}`" for c in columns) + ".")
            out.append("")
        details = self.details()
        if details:
            out.append("## What failed")
            out.append("")
            out.extend(f"- {esc(line)}" for line in details)
            out.append("")
        out.append(f"Time: {self.timings.line()}.")
        return "\n".join(out) + "\n"


def sort_rows(rows: Iterable[ReleaseRow]) -> tuple[ReleaseRow, ...]:
    return tuple(sorted(rows, key=lambda r: Version(r.version)))


__all__ = [
    "assign",
    "upper_bound",
    "Cell",
    "CellStatus",
    "Coverage",
    "Matrix",
    "ReleaseRow",
    "Timings",
    "cell_from_entry",
    "short_entry",
    "sort_rows",
]
