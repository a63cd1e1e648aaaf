"""`ddtree-deploy matrix`: the series against every SGLang release in a range.

Thin: parse options, call ``matrix_run``, render. Tables and progress go to stderr
(for people), ``--json`` documents to stdout, ``--markdown`` to a file. ``port`` and
``series refresh`` (keeping a family up with a new release) live in port_cmd.py.
"""

from __future__ import annotations

# matrix, matrix_run, rich.table and rich.progress are imported inside the command that uses them: every
# CLI start (a push included) would otherwise pay for them.
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Optional

import typer
from rich.markup import escape

from ddtree_deploy.base.errors import BadInput
from ddtree_deploy.cli.app import app, emit_json, err, handles_errors, say
from ddtree_deploy.engine.series import show

if TYPE_CHECKING:
    from ddtree_deploy.release.matrix import Matrix

_VERDICT_STYLE = {"ok": "green", "already upstream": "cyan", "failed": "bold red", "uncovered": "yellow",
                  "no family": "dim",
                  "outside range": "dim"}
_CELL_STYLE = {"exact": "green", "offset": "green", "already-applied": "cyan", "fuzz": "yellow",
               "failed": "bold red", "partly": "bold red", "skipped": "yellow", "no family": "dim"}


def _render_matrix(matrix: Matrix) -> None:
    from ddtree_deploy.release.matrix import Matrix

    for family, header, body in matrix.tables():
        rows = [r for r in matrix.rows if r.family == family]
        _render_table(matrix.label(family), header, body, list(Matrix(tuple(rows)).columns()))
    for line in matrix.details():
        err.print(f"[red]does not apply:[/] {escape(line)}", highlight=False, soft_wrap=True)
    err.print(f"{matrix.summary()}; time {matrix.timings.line()}", highlight=False)


#: A narrow terminal's matrix: each cell in a few characters (the legend under the table says them).
_COMPACT = (("exact", "="), ("offset ", ""), ("fuzz ", "~"), ("already-applied", "up"), ("failed", "X"),
            ("partly", "part"), ("skipped", "skip"), ("no family", ""))
COMPACT_LEGEND = ("cells: = exact, +N/-N offset by N lines, ~N fuzz N, up already applied, X failed, "
                  "part partly applied, skip skipped (an earlier entry failed)")


def _compact(text: str) -> str:
    for word, short in _COMPACT:
        if text.startswith(word):
            return short + text[len(word):].strip() if word.endswith(" ") else short
    return text


def _render_table(family: str | None, header: list[str], body: list[list[str]], entries: list[str]) -> None:
    from rich.table import Table

    from ddtree_deploy.cli.tables import show

    # The "why" column is long prose: printed under the table, one line per release.
    # The family is the table's title, not a column; the release's CUDA lane stays beside it.
    header, whys = [*header[:2], *header[3:-1]], [(row[0], row[-1]) for row in body]
    body = [[*row[:2], *row[3:-1]] for row in body]
    title = f"DDTree family {family} vs SGLang releases" if family else "SGLang releases no family judges"
    verdict_at, cells_from, cells_to = len(header) - 1, 2, header.index("compile")

    def table_of(head: list[str], cell: Callable[[str], str], **style) -> Table:
        table = Table(title=escape(title), **style)
        for name in head:
            table.add_column(name, overflow="fold")
        for row in body:
            styled = []
            for i, text in enumerate(row):
                colour = None
                if i == verdict_at:
                    colour = _VERDICT_STYLE.get(text)
                elif cells_from <= i < cells_to:
                    colour = _CELL_STYLE.get(text.split(" ", 1)[0] if not text.startswith("no family") else text)
                    text = cell(text)
                styled.append(f"[{colour}]{escape(text)}[/]" if colour else escape(text))
            table.add_row(*styled)
        return table

    def narrow():  # entries numbered, cells in a few characters, no borders; the legend follows
        numbered = [*header[:cells_from], *(str(n) for n in range(1, cells_to - cells_from + 1)),
                    *header[cells_to:]]
        yield table_of(numbered, _compact, box=None, pad_edge=False, collapse_padding=True, padding=(0, 1),
                       title_justify="left")
        for n, entry in enumerate(entries, 1):
            yield f"  [dim]{n}[/] {escape(entry)}"
        yield f"  [dim]{escape(COMPACT_LEGEND)}[/]"

    show(err, table_of(header, lambda text: text), narrow)
    for version, why in whys:
        if why:
            err.print(f"  {escape(version)}: {escape(why)}", highlight=False)


# help= rather than a docstring: typer keeps a docstring's line breaks inside a paragraph,
# so the text wrapped at the source's breaks and again at the terminal's. One line per
# paragraph here lets the terminal alone decide.
@app.command("matrix", help=(
    "The series against every SGLang release on PyPI in a range: release x patch.\n\n"
    "Exit 1 when a release inside its family's range fails (and, with --strict, when a "
    "release is newer than every family's range)."))
def matrix_command(
    from_version: str = typer.Option("0.5.11", "--from", help="Oldest release to include."),
    to_version: str = typer.Option("latest", "--to", help="Newest release to include, or 'latest'."),
    family: Optional[str] = typer.Option(None, "--family", help="Apply this family to every release."),
    strict: bool = typer.Option(False, "--strict", help="Exit 1 also when a release is uncovered."),
    fuzz: int = typer.Option(0, "--fuzz", min=0, max=2, help="Context lines a hunk may ignore (0-2)."),
    offline: bool = typer.Option(False, "--offline", help="Use the cached release listing and wheels only."),
    parallel: Optional[int] = typer.Option(None, "--parallel", "-j", min=1,
                                           help="Releases checked at once (default: CPU count)."),
    # The old spelling (every other command says --parallel): still accepted, not shown.
    jobs: Optional[int] = typer.Option(None, "--jobs", min=1, hidden=True),
    markdown: Optional[Path] = typer.Option(None, "--markdown", help="Also write the report as markdown here."),
    import_smoke: bool = typer.Option(False, "--import", help="Also install each release that takes the series "
                                      "into a throwaway CPU virtualenv and run the import and cli smoke levels."),
    json_output: bool = typer.Option(False, "--json", help="Print the matrix as one JSON document."),
) -> None:
    _exit(_matrix(from_version=from_version, to_version=to_version, family=family, strict=strict, fuzz=fuzz,
                  offline=offline, parallel=parallel, jobs=jobs, markdown=markdown, import_smoke=import_smoke,
                  json_output=json_output))


def _exit(code: int) -> None:
    # The bodies return their exit code (a result, not an error); the command turns it into one.
    if code:
        raise typer.Exit(code)


@handles_errors
def _matrix(*, from_version: str, to_version: str, family: Optional[str], strict: bool, fuzz: int,
            offline: bool, parallel: Optional[int], jobs: Optional[int], markdown: Optional[Path],
            import_smoke: bool, json_output: bool) -> int:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from ddtree_deploy.base.fsutil import require_writable_file
    from ddtree_deploy.release.matrix_run import run_matrix

    if markdown is not None:  # before the run: a bad path is bad input, not a crash after it
        require_writable_file(markdown, "--markdown")
    if parallel is not None and jobs is not None and parallel != jobs:
        raise BadInput(f"--parallel {parallel} and --jobs {jobs}: --jobs is the old name of --parallel; give one")
    workers = parallel if parallel is not None else jobs

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
            offline=offline, jobs=workers, progress=progress, import_smoke=import_smoke,
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
        say(f"matrix: {matrix.summary()}; exit {matrix.exit_code}")
    return matrix.exit_code
