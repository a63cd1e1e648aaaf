"""`ddtree-deploy matrix`, `port` and `series refresh`: keeping up with SGLang releases.

Thin: parse options, call ``matrix_run`` / ``port``, render. Tables and progress
go to stderr (for people), ``--json`` documents to stdout, ``--markdown`` to a file.
"""

from __future__ import annotations

# matrix_run, port and rich.progress are imported inside the commands that use them: every
# CLI start (a push included) would otherwise pay for them.
from pathlib import Path
from typing import Optional

import typer
from packaging.version import InvalidVersion, Version
from rich.markup import escape
from rich.table import Table

from ddtree_deploy.cli.app import app, emit_json, err, handles_errors, out
from ddtree_deploy.errors import EXIT_FAILED, BadInput
from ddtree_deploy.locations import repo_dir
from ddtree_deploy.matrix import Matrix, upper_bound
from ddtree_deploy.series import families, load_family, show

series_app = typer.Typer(help="Work on a family's patch files.", no_args_is_help=True)
app.add_typer(series_app, name="series")

_VERDICT_STYLE = {"ok": "green", "already upstream": "cyan", "failed": "bold red", "uncovered": "yellow",
                  "no family": "dim",
                  "outside range": "dim"}
_CELL_STYLE = {"exact": "green", "offset": "green", "already-applied": "cyan", "fuzz": "yellow",
               "failed": "bold red", "partly": "bold red", "skipped": "yellow", "no family": "dim"}


def _render_matrix(matrix: Matrix) -> None:
    for family, header, body in matrix.tables():
        _render_table(family, header, body)
    for line in matrix.details():
        err.print(f"[red]does not apply:[/] {escape(line)}", highlight=False, soft_wrap=True)
    err.print(f"{matrix.summary()}; time {matrix.timings.line()}", highlight=False, soft_wrap=True)


def _render_table(family: str | None, header: list[str], body: list[list[str]]) -> None:
    # The "why" column is long prose: printed under the table, one line per release.
    # The family is the table's title, not a column.
    header, whys = [header[0], *header[2:-1]], [(row[0], row[-1]) for row in body]
    body = [[row[0], *row[2:-1]] for row in body]
    title = f"DDTree family {family} vs SGLang releases" if family else "SGLang releases no family judges"
    table = Table(title=escape(title))
    for name in header:
        table.add_column(name, overflow="fold")
    verdict_at, cells_from, cells_to = len(header) - 1, 1, header.index("compile")
    for row in body:
        styled = []
        for i, text in enumerate(row):
            style = None
            if i == verdict_at:
                style = _VERDICT_STYLE.get(text)
            elif cells_from <= i < cells_to:
                style = _CELL_STYLE.get(text.split(" ", 1)[0] if not text.startswith("no family") else text)
            styled.append(f"[{style}]{escape(text)}[/]" if style else escape(text))
        table.add_row(*styled)
    err.print(table)
    for version, why in whys:
        if why:
            err.print(f"  {escape(version)}: {escape(why)}", highlight=False, soft_wrap=True)


@app.command("matrix")
def matrix_command(
    from_version: str = typer.Option("0.5.11", "--from", help="Oldest release to include."),
    to_version: str = typer.Option("latest", "--to", help="Newest release to include, or 'latest'."),
    family: Optional[str] = typer.Option(None, "--family", help="Apply this family to every release."),
    strict: bool = typer.Option(False, "--strict", help="Exit 1 also when a release is uncovered."),
    fuzz: int = typer.Option(0, "--fuzz", min=0, max=2, help="Context lines a hunk may ignore (0-2)."),
    offline: bool = typer.Option(False, "--offline", help="Use the cached release listing and wheels only."),
    jobs: Optional[int] = typer.Option(None, "--jobs", min=1, help="Parallel workers (default: CPU count)."),
    markdown: Optional[Path] = typer.Option(None, "--markdown", help="Also write the report as markdown here."),
    import_smoke: bool = typer.Option(False, "--import", help="Also install each release that takes the series "
                                      "into a throwaway CPU virtualenv and run the import and cli smoke levels."),
    json_output: bool = typer.Option(False, "--json", help="Print the matrix as one JSON document."),
) -> None:
    """The series against every SGLang release on PyPI in a range: release x patch.

    Exit 1 when a release inside its family's range fails (and, with --strict, when a
    release is newer than every family's range).
    """
    _exit(_matrix(from_version=from_version, to_version=to_version, family=family, strict=strict, fuzz=fuzz,
                  offline=offline, jobs=jobs, markdown=markdown, import_smoke=import_smoke,
                  json_output=json_output))


def _exit(code: int) -> None:
    # The bodies return their exit code (a result, not an error); the command turns it into one.
    if code:
        raise typer.Exit(code)


@handles_errors
def _matrix(*, from_version: str, to_version: str, family: Optional[str], strict: bool, fuzz: int,
            offline: bool, jobs: Optional[int], markdown: Optional[Path], import_smoke: bool,
            json_output: bool) -> int:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from ddtree_deploy.matrix_run import run_matrix

    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=err, transient=True) as bar:
        tasks: dict[str, int] = {}

        def progress(phase: str, done: int, total: int) -> None:
            if phase not in tasks:
                label = {"download": "wheels (download / verify)", "apply": "apply + compile",
                         "import": "import smoke (throwaway venvs)"}.get(phase, phase)
                tasks[phase] = bar.add_task(label, total=total)
            bar.update(tasks[phase], completed=done, total=total)

        matrix = run_matrix(
            from_version=from_version, to_version=to_version, family=family, strict=strict, fuzz=fuzz,
            offline=offline, jobs=jobs, progress=progress, import_smoke=import_smoke,
            warn=lambda message: err.print(f"[yellow]warning:[/] {escape(message)}", soft_wrap=True),
        )
    if markdown is not None:
        markdown.parent.mkdir(parents=True, exist_ok=True)
        markdown.write_text(matrix.to_markdown(), encoding="utf-8")
        err.print(f"[dim]markdown report: {escape(show(markdown))}[/]", soft_wrap=True)
    _render_matrix(matrix)
    if json_output:
        emit_json(matrix.to_json())
    else:
        out.print(f"matrix: {matrix.summary()}; exit {matrix.exit_code}", highlight=False)
    return matrix.exit_code


def _newest_family() -> str:
    """The newest family (by the upper end of its range): what a new release is ported from."""
    infos = families()
    if not infos:
        raise BadInput("no family under patches/", hint="a family is a folder with family.toml and series")
    return max(infos, key=lambda f: (upper_bound(f) or (Version("0"), False))[0]).name


def _family_path(name: str) -> Path:
    path = Path(name)
    return path if len(path.parts) > 1 else repo_dir("patches") / name


@app.command("port")
def port_command(
    to_version: str = typer.Option(..., "--to", help="The SGLang release to port the family to."),
    family: Optional[str] = typer.Option(None, "--family", help="The family to port (default: the newest)."),
    into: Optional[str] = typer.Option(None, "--into", help="The new family's name (default: sglang-X.Y.Z)."),
    fuzz: int = typer.Option(0, "--fuzz", min=0, max=2, help="Also accept hunks that match with fuzz (0-2)."),
    tree: Optional[Path] = typer.Option(None, "--tree", help="Where to write the working tree "
                                                             "(default: build/port-<family>)."),
    json_output: bool = typer.Option(False, "--json", help="Print the result as one JSON document."),
) -> None:
    """Apply a family to a new release and write a refreshed family (re-anchored hunks, new context).

    Hunks that do not land are kept as they were and written to <patch>.rej with the nearest
    location and the differing lines; the working tree holds the release's files with every
    landed hunk applied. Fix the rejects in the tree, then run `series refresh`. Exit 1 when
    any hunk was rejected.
    """
    _exit(_port(to_version=to_version, family=family, into=into, fuzz=fuzz, tree=tree, json_output=json_output))


@handles_errors
def _port(*, to_version: str, family: Optional[str], into: Optional[str], fuzz: int, tree: Optional[Path],
          json_output: bool) -> int:
    source = load_family(family or _newest_family())
    try:
        release = Version(to_version).release
    except InvalidVersion:
        raise BadInput(f"--to {to_version!r} is not a valid PEP 440 version", hint="e.g. 0.5.13") from None
    new_name = into or "sglang-" + ".".join(map(str, (list(release) + [0, 0])[:3]))
    target = _family_path(new_name)
    tree_dir = tree or repo_dir("build") / f"port-{target.name}"
    from ddtree_deploy import port as porting

    outcome = porting.port_family(source, to_version, into=target, tree_dir=tree_dir, fuzz=fuzz,
                                  existing=families())
    result = outcome.result
    if json_output:
        emit_json(_port_json(outcome))
    for entry in result.entries:
        if entry.kind == "add":
            err.print(f"  {escape(entry.entry)}: whole file, kept as is", highlight=False, soft_wrap=True)
            continue
        landed = [h for _, h in entry.results if h.ok]
        status = "ok" if entry.ok else f"{len(entry.rejects)} rejected"
        note = "" if entry.text is not None or entry.kind == "add" else " (all already upstream: dropped)"
        err.print(f"  {escape(entry.entry)}: {len(landed)} hunk(s) landed, {status}{note}", highlight=False, soft_wrap=True)
    err.print(f"wrote family {escape(show(outcome.family_dir))} and working tree {escape(show(outcome.tree_dir))}", soft_wrap=True)
    if not result.ok:
        err.print("[bold]what to edit:[/]", soft_wrap=True)
        for reject in result.rejects:
            where = (f"{show(outcome.tree_dir / reject.path)} near line {reject.tree_line}"
                     if reject.tree_line else f"{reject.path} (absent in {to_version}: move the change)")
            err.print(f"  {escape(where)}: {escape(reject.entry)}: {escape(reject.describe()[0])}", highlight=False, soft_wrap=True)
        for rej in outcome.rej_files:
            err.print(f"  details: {escape(show(rej))}", highlight=False, soft_wrap=True)
        err.print(f"then: ddtree-deploy series refresh --family {escape(outcome.family_dir.name)} "
                  f"--from {escape(show(outcome.tree_dir))} --resolved", highlight=False, soft_wrap=True)
    if not json_output:
        verdict = "ok" if result.ok else f"{len(result.rejects)} hunk(s) rejected"
        out.print(f"port {verdict}: family {outcome.family_dir.name} for SGLang {to_version}", highlight=False)
    return 0 if result.ok else EXIT_FAILED


def _port_json(outcome: "porting.PortOutcome") -> dict:
    result = outcome.result
    return {
        "ok": result.ok,
        "sglang": result.version,
        "family": outcome.family_dir.name,
        "family_dir": str(outcome.family_dir),
        "tree": str(outcome.tree_dir),
        "entries": [
            {
                "entry": e.entry,
                "kind": e.kind,
                "written": e.text is not None,
                "hunks": [{"path": p, "index": h.index, "status": h.status.value, "line": h.line,
                           "offset": h.offset, "fuzz": h.fuzz} for p, h in e.results],
                "rejects": [{"path": r.path, "hunk": r.hunk.index if r.hunk else None, "reason": r.reason,
                             "tree_line": r.tree_line} for r in e.rejects],
            }
            for e in result.entries
        ],
        "rej_files": [str(p) for p in outcome.rej_files],
    }


@series_app.command("refresh")
@handles_errors
def refresh_command(
    family: str = typer.Option(..., "--family", help="The family whose patch files to regenerate."),
    from_dir: Path = typer.Option(..., "--from", help="The edited working tree (as `port` wrote it)."),
    release: Optional[str] = typer.Option(None, "--release", help="The SGLang release the tree was made "
                                                                  "from (default: from the tree's manifest)."),
    resolved: bool = typer.Option(False, "--resolved", help="The family's .rej hunks were applied by hand: "
                                                            "go ahead and delete the .rej files."),
    json_output: bool = typer.Option(False, "--json", help="Print the result as one JSON document."),
) -> None:
    """Regenerate a family's patch files from an edited working tree (quilt's refresh).

    One patch per series entry, same order, same header text. A change is given to the
    entry whose own lines it resembles most (else to the last entry touching that file);
    the regenerated series is checked to rebuild the tree exactly before anything is written.
    """
    from ddtree_deploy import port as porting

    outcome = porting.refresh_family(_family_path(family), from_dir, version=release, resolved=resolved)
    if json_output:
        emit_json({
            "sglang": outcome.version,
            "changed": list(outcome.changed),
            "unchanged": list(outcome.unchanged),
            "removed_rejects": [str(p) for p in outcome.removed_rejects],
            "payload_drift": list(outcome.payload_drift),
            "dropped": [{"entry": e, "path": p} for e, p in outcome.dropped],
        })
    for name in outcome.changed:
        err.print(f"  refreshed {escape(name)}", highlight=False, soft_wrap=True)
    for name in outcome.unchanged:
        err.print(f"  [dim]unchanged {escape(name)}[/]", highlight=False, soft_wrap=True)
    for entry, path in outcome.dropped:
        err.print(f"  [yellow]note:[/] {escape(entry)} no longer changes {escape(path)}", highlight=False, soft_wrap=True)
    for name in outcome.payload_drift:
        err.print(f"  [yellow]note:[/] the tree's copy of {escape(name)} differs from its payload file; "
                  "the payload is the source: copy the edit there", highlight=False, soft_wrap=True)
    for rej in outcome.removed_rejects:
        err.print(f"  removed {escape(show(rej))}", highlight=False, soft_wrap=True)
    if not json_output:
        out.print(f"refresh: family {family}: {len(outcome.changed)} patch file(s) rewritten from the tree "
                  f"(SGLang {outcome.version})", highlight=False)
