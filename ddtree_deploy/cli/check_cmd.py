"""`ddtree-deploy check`: apply the series to a snapshot in memory and byte-compile the results.

The table is for people (stderr); ``--json`` prints the report on stdout.
Exit 0 only when every hunk applied and every result compiles; 1 otherwise.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Optional

import typer
from rich.markup import escape

from ddtree_deploy.base.errors import EXIT_FAILED, BadInput, DeployError
from ddtree_deploy.cli.app import app, emit_json, err, handles_errors, say

# The checker (check -> patch_parse, patch_apply, series, snapshot) is imported when `check` runs, not at
# every CLI start (`--help`, `status`): see _check.
if TYPE_CHECKING:
    from ddtree_deploy.engine.check import CheckReport, EntryCheck
    from ddtree_deploy.engine.patch_apply import HunkResult
    from ddtree_deploy.engine.series import Series
    from ddtree_deploy.release.snapshot import Snapshot

PARTLY = "partly applied"  # ddtree_deploy.engine.check.PARTLY (a test pins the two equal)
_STYLE = {"applied": "green", "already-applied": "cyan", "failed": "bold red", "skipped": "yellow",
          PARTLY: "bold red"}


def _resolve(snapshot: str | None, release: str | None, family: str | None) -> tuple[Snapshot, Series]:
    """The snapshot to check and the family to apply (all bad input raised before any write)."""
    from ddtree_deploy.engine.series import choose_series
    from ddtree_deploy.release.snapshot import fresh_release_snapshot, load_snapshot

    if (snapshot is None) == (release is None):
        raise BadInput("give exactly one of --snapshot NAME or --release VERSION")
    version = release if release is not None else None
    snap = None
    if snapshot is not None:
        snap = load_snapshot(snapshot)
        version = snap.manifest.sglang_version
    assert version is not None
    series = choose_series(version, family)
    if family and not series.info.covers(version):
        err.print(f"[yellow]note:[/] family {escape(series.info.label)} ({series.specifier}) does not cover "
                  f"SGLang {version}; checking it anyway because --family was given", soft_wrap=True)
    if series.info.unfinished:  # only ever here by name: a range never picks it
        err.print(f"[yellow]warning:[/] family {escape(series.info.label)} is an unfinished port: its "
                  "rejected hunks fail until they are placed (series refresh --resolved); checking it "
                  "because --family was given (push refuses it)", soft_wrap=True)
    if snap is None:
        # "cached" is not claimed: a download, when one is needed, shows its own bar or line.
        err.print(f"[dim]snapshot sglang-{version}: from the release's verified wheel[/]")
        snap = fresh_release_snapshot(version, series.touched_paths())
    return snap, series


def _hunks_cell(hunks: tuple[HunkResult, ...]) -> str:
    from ddtree_deploy.engine.patch_apply import HunkStatus

    parts = []
    for status in HunkStatus:
        these = [h for h in hunks if h.status is status]
        if not these:
            continue
        text = f"{len(these)} {status.value}"
        if status is HunkStatus.OFFSET:
            text += " (" + ", ".join(f"{h.offset:+d}" for h in these) + ")"
        if status is HunkStatus.FUZZ:
            text += " (" + ", ".join(f"fuzz {h.fuzz}" for h in these) + ")"
        parts.append(text)
    return ", ".join(parts) or "-"


def _render(report: CheckReport, snap: Snapshot, series: Series, explain: bool = False) -> None:
    from rich.table import Table

    from ddtree_deploy.cli.tables import show

    title = (f"check: family {series.info.label} on snapshot {snap.name} "
             f"(sglang {snap.manifest.sglang_version}, fuzz {report.fuzz})")
    table = Table(title=escape(title))
    # fold, never truncate: a path cut to "sglang/srt/…" tells nobody anything.
    table.add_column("line", justify="right")
    table.add_column("entry", overflow="fold")
    table.add_column("file", overflow="fold")
    table.add_column("hunks", overflow="fold")
    table.add_column("result", no_wrap=True)
    for entry in report.entries:
        for i, f in enumerate(entry.files):
            style = "yellow" if f.status == PARTLY and f.ok else _STYLE.get(f.status, "")
            table.add_row(
                str(entry.line) if i == 0 else "",
                escape(entry.name) if i == 0 else "",
                escape(f.path),
                _hunks_cell(f.hunks),
                f"[{style}]{f.status}[/]" if style else f.status,
            )

    def narrow():  # a narrow terminal: per entry its line and name, then each file's result
        yield escape(title)
        for entry in report.entries:
            yield f"{entry.line:>4}  {escape(entry.name)}"
            for f in entry.files:
                style = "yellow" if f.status == PARTLY and f.ok else _STYLE.get(f.status, "")
                result = f"[{style}]{f.status}[/]" if style else f.status
                hunks = _hunks_cell(f.hunks)
                yield f"      {escape(f.path)}  {result}" + (f" ({escape(hunks)})" if hunks != "-" else "")

    show(err, table, narrow)
    for entry in report.entries:
        _render_failures(entry, series, explain)
    for c in report.compile_errors:
        err.print(f"[bold red]does not compile:[/] {escape(str(c))}", highlight=False, soft_wrap=True)


def _render_failures(entry: EntryCheck, series: Series, explain: bool = False) -> None:
    from ddtree_deploy.engine.series import show

    # Evidence quotes source lines: soft_wrap, so a narrow console or a CI log never
    # breaks a quoted line in two (the table above folds; these lines must not).
    patch_file = next((show(e.file) for e in series.entries if e.line == entry.line), entry.name)
    for f in entry.files:
        if f.status == PARTLY:
            # Which hunks are there already and where, so the engineer can read the file.
            style = "yellow" if f.ok else "red"
            where = f"{patch_file}:{f.header_line}" if f.header_line else patch_file
            err.print(f"[{style}]{escape(where)}[/]: {escape(f.path)}: {escape(f.message or PARTLY)}",
                      highlight=False, soft_wrap=True)
            for h in f.hunks:
                err.print(f"    hunk {h.index} {escape(h.header)}: {h.status.value} at line {h.line}",
                          highlight=False, soft_wrap=True)
            continue
        if f.ok:
            continue
        if f.message and all(h.ok for h in f.hunks):  # a file-level failure: no hunk tells it
            err.print(f"[red]{escape(entry.name)}[/]: {escape(f.path)}: {escape(f.message)}", highlight=False, soft_wrap=True)
        for h in f.hunks:
            if h.ok:
                continue
            if h.ambiguous:  # both places are in the reason; no "nearest" to add
                err.print(f"[red]{escape(patch_file)}:{h.patch_line}[/] hunk {h.index} {escape(h.header)} "
                          f"failed on {escape(f.path)}: {escape(h.reason)}", highlight=False, soft_wrap=True)
                if explain:
                    for line in side_by_side(h, max(err.width, 60)):
                        err.print(escape(line), highlight=False, soft_wrap=True)
                continue
            near = f" nearest match at line {h.nearest_line}" if h.nearest_line else ""
            why = f" ({escape(h.reason)})" if h.reason else ""
            err.print(f"[red]{escape(patch_file)}:{h.patch_line}[/] hunk {h.index} {escape(h.header)} "
                      f"failed on {escape(f.path)};{near}{why}", highlight=False, soft_wrap=True)
            for m in h.mismatches[:5]:
                actual = "(end of file)" if m.actual is None else repr(m.actual)
                err.print(f"    line {m.line}: expected {m.expected!r}, found {escape(actual)}", highlight=False, soft_wrap=True)


def side_by_side(h: HunkResult, width: int) -> list[str]:
    """An ambiguous hunk's two places, the old side's left and the new side's right: each row
    the file's line there, tagged as the hunk has it ('-' removed, '+' added, ' ' context) and
    '~' where the file differs from the hunk (a context line fuzz ignored)."""
    col = max((width - 7) // 2, 24)

    def title(place) -> str:
        notes = [f"{place.offset:+d}" if place.offset else "that line"] + ([f"fuzz {place.fuzz}"] if place.fuzz else [])
        return f"{place.side} lines at line {place.line} ({', '.join(notes)})"

    def cells(place) -> list[str]:
        out = []
        for k, (tag, want, have) in enumerate(place.rows):
            text = "(end of file)" if have is None else have
            out.append(f"{tag}{' ' if have == want else '~'}{place.line + k:>6} {text.expandtabs(4)}")
        return out

    def fit(text: str) -> str:
        return text if len(text) <= col else text[:col - 1] + "…"

    left, right = (cells(p) for p in h.places)
    rows = [f"    the patch puts hunk {h.index} at line {h.stated_line}; its two places rank alike:",
            f"    {fit(title(h.places[0])):<{col}} | {fit(title(h.places[1]))}"]
    for k in range(max(len(left), len(right))):
        a = left[k] if k < len(left) else ""
        b = right[k] if k < len(right) else ""
        rows.append(f"    {fit(a):<{col}} | {fit(b)}".rstrip())
    rows.append("    ('-' removed by the hunk, '+' added, '~' the file differs from the hunk there)")
    return rows


def _write(directory: Path, report: CheckReport) -> None:
    # The folder was proven writable before the check (fsutil.require_writable_folder); a write that
    # fails now (a full disk) is a failed step, said in one line.
    for p in report.patched.values():
        dest = directory / p.path
        try:
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_bytes(p.patched)
        except OSError as exc:
            raise DeployError(f"--write {directory}: writing {p.path} failed ({exc.strerror or exc})") from None
    from ddtree_deploy.engine.series import show

    err.print(f"[dim]wrote {len(report.patched)} patched files under {show(directory)}[/]")


@app.command("check")
def check(
    snapshot: Optional[str] = typer.Option(None, "--snapshot", help="check this snapshot (snapshot/<NAME>)"),
    release: Optional[str] = typer.Option(
        None, "--release", help="check a PyPI release (builds or refreshes snapshot/sglang-<VERSION>)"),
    family: Optional[str] = typer.Option(
        None, "--family", help="family name under patches/ or a family folder (default: by version)"),
    fuzz: int = typer.Option(0, "--fuzz", min=0, max=2, help="context lines a hunk may ignore (0..2)"),
    json_output: bool = typer.Option(False, "--json", help="print one JSON document on stdout"),
    write: Optional[Path] = typer.Option(None, "--write", help="write the patched files under DIR"),
    allow_partly_applied: bool = typer.Option(
        False, "--allow-partly-applied",
        help="accept a file some of whose hunks are already there: apply the rest (default: fail)"),
    explain: bool = typer.Option(
        False, "--explain",
        help="for a hunk refused as ambiguous, show both places side by side, as the file has them"),
) -> None:
    """Apply the series in memory and byte-compile the results; nothing leaves this machine."""
    ok = _check(snapshot=snapshot, release=release, family=family, fuzz=fuzz,
                json_output=json_output, write=write, allow_partly_applied=allow_partly_applied,
                explain=explain)
    # Raised outside @handles_errors, which reports any other exception as a crash.
    if not ok:
        raise typer.Exit(EXIT_FAILED)


@handles_errors
def _check(*, snapshot: str | None, release: str | None, family: str | None, fuzz: int,
           json_output: bool, write: Path | None, allow_partly_applied: bool = False,
           explain: bool = False) -> bool:
    if write is not None:
        from ddtree_deploy.base.fsutil import require_writable_folder

        require_writable_folder(write, "--write")  # bad input before any work: exit 2, one line
    from ddtree_deploy.engine.check import check_series
    from ddtree_deploy.engine.series import check_no_symlink_escape

    from ddtree_deploy.cli.download_view import downloads_shown

    with downloads_shown(json_output=json_output):
        snap, series = _resolve(snapshot, release, family)
    check_no_symlink_escape(series, snap.files_dir)
    report = check_series(series, snap.read_files(), fuzz=fuzz, allow_partly_applied=allow_partly_applied)
    if write is not None:
        _write(write, report)
    _render(report, snap, series, explain)
    counts = ", ".join(f"{n} {s}" for s, n in report.hunk_counts().items() if n)
    partly = sum(1 for e in report.entries for f in e.files if f.status == PARTLY)
    if partly:
        counts += f"; {partly} file{'s' if partly > 1 else ''} partly applied"
    verdict = "ok" if report.ok else "FAILED"
    if json_output:
        emit_json({"snapshot": {"name": snap.name, "sglang_version": snap.manifest.sglang_version,
                                "source": snap.manifest.source}, **report.to_json(),
                   "family_origin": series.info.origin, "family_rejects": list(series.info.rejects)})
    else:
        say(f"check {verdict}: family {series.info.label} on {snap.name}: hunks {counts or 'none'}; "
            f"{len(report.compile_errors)} compile errors")
    return report.ok


__all__ = ["check"]
