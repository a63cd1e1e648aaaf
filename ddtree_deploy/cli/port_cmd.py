"""`ddtree-deploy port` and `series refresh`: carry a family to a new SGLang release.

Thin: parse options, call ``ddtree_deploy.release.port``, render. Progress and what to edit go
to stderr (for people), ``--json`` documents to stdout.
"""

from __future__ import annotations

# ddtree_deploy.release.port is imported inside the commands: every CLI start would otherwise pay for it.
from pathlib import Path
from typing import TYPE_CHECKING, Optional

import typer
from rich.markup import escape

from ddtree_deploy.base import next_step
from ddtree_deploy.base.errors import EXIT_FAILED, BadInput
from ddtree_deploy.base.locations import repo_dir
from ddtree_deploy.cli.app import app, emit_json, err, handles_errors, say
if TYPE_CHECKING:  # the annotation only: the module itself loads inside the commands
    from ddtree_deploy.release import port as porting
from ddtree_deploy.engine.series import (
    families,
    family_folder,
    load_family,
    origin_of,
    read_family_info,
    require_families,
    show,
)

series_app = typer.Typer(help="Work on a family's patch files.", no_args_is_help=True)
app.add_typer(series_app, name="series")


def _exit(code: int) -> None:
    # The bodies return their exit code (a result, not an error); the command turns it into one.
    if code:
        raise typer.Exit(code)


def _newest_family() -> str:
    """The newest family (by the upper end of its range): what a new release is ported from."""
    from packaging.version import Version

    from ddtree_deploy.release.matrix import upper_bound

    infos = [f for f in require_families() if not f.unfinished]  # never port on from a half-ported one
    if not infos:
        raise BadInput("every family is an unfinished port (it has .rej files)", hint="name one with --family")
    return max(infos, key=lambda f: (upper_bound(f) or (Version("0"), False))[0]).name


# help= rather than docstrings (see matrix_cmd): one line per paragraph, so the terminal
# alone decides where the text wraps.
PORT_HELP = (
    "Apply a family to a new release and write a refreshed family (re-anchored hunks, new context).\n\n"
    "Hunks that do not land are kept as they were and written to <patch>.rej with the nearest location and "
    "the differing lines; the working tree holds the release's files with every landed hunk applied.\n\n"
    "Fix the rejects in the tree, then run `series refresh`. Exit 1 when any hunk was rejected.\n\n"
    "A hunk refused as ambiguous (its old and new lines both match, at places that rank alike) is made "
    "again with more context with --context N: from the release the family applies to (the newest it "
    "covers, or --context-from VERSION), the series applied there up to it and diffed around its change "
    "alone; if that hunk lands, its file's section is written with that much context."
)
REFRESH_HELP = (
    "Regenerate a family's patch files from an edited working tree (quilt's refresh).\n\n"
    "One patch per series entry, same order, same header text. A change is given to the entry whose own "
    "lines it resembles most (else to the last entry touching that file); the regenerated series is checked "
    "to rebuild the tree exactly before anything is written."
)


@app.command("port", help=PORT_HELP)
def port_command(
    to_version: str = typer.Option(..., "--to", help="The SGLang release to port the family to."),
    family: Optional[str] = typer.Option(None, "--family", help="The family to port (default: the newest)."),
    into: Optional[str] = typer.Option(None, "--into", help="The new family's name (default: sglang-X.Y.Z; "
                                                            "written to your families folder), or a folder."),
    fuzz: int = typer.Option(0, "--fuzz", min=0, max=2, help="Also accept hunks that match with fuzz (0-2)."),
    tree: Optional[Path] = typer.Option(None, "--tree", help="Where to write the working tree "
                                                             "(default: build/port-<family>)."),
    context: Optional[int] = typer.Option(None, "--context", min=4, max=50,
                                          help="Make hunks refused as ambiguous again with this many "
                                               "lines of context (4-50)."),
    context_from: Optional[str] = typer.Option(None, "--context-from",
                                               help="The release to make them from (default: the newest "
                                                    "the family covers)."),
    json_output: bool = typer.Option(False, "--json", help="Print the result as one JSON document."),
) -> None:
    _exit(_port(to_version=to_version, family=family, into=into, fuzz=fuzz, tree=tree, context=context,
                context_from=context_from, json_output=json_output))


@handles_errors
def _port(*, to_version: str, family: Optional[str], into: Optional[str], fuzz: int, tree: Optional[Path],
          json_output: bool, context: Optional[int] = None, context_from: Optional[str] = None) -> int:
    from packaging.version import InvalidVersion, Version

    source = load_family(family or _newest_family())
    if source.info.unfinished:
        err.print(f"[yellow]warning:[/] porting from {escape(source.info.label)}: its rejected hunks are "
                  "carried as they are and will be rejected again", soft_wrap=True)
    try:
        release = Version(to_version).release
    except InvalidVersion:
        raise BadInput(f"--to {to_version!r} is not a valid PEP 440 version", hint="e.g. 0.5.13") from None
    new_name = into or "sglang-" + ".".join(map(str, (list(release) + [0, 0])[:3]))
    target = family_folder(new_name)
    tree_dir = tree or repo_dir("build") / f"port-{target.name}"
    from ddtree_deploy.base.fsutil import require_writable_folder
    from ddtree_deploy.release import port as porting

    require_writable_folder(tree_dir, "--tree")  # both before any work: bad input, nothing written
    require_writable_folder(target.parent, "--into", given=target)
    if context_from is not None and context is None:
        raise BadInput("--context-from names where to make hunks again with more context; give --context N too",
                       hint="e.g. --context 8 --context-from 0.5.12.post1")

    outcome = porting.port_family(source, to_version, into=target, tree_dir=tree_dir, fuzz=fuzz,
                                  existing=families(), context=context, context_from=context_from)
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
        for path, index in entry.widened:
            err.print(f"    {escape(path)} hunk {index}: ambiguous as written; made again with {context} lines of "
                      f"context from SGLang {outcome.context_from}, it landed", highlight=False, soft_wrap=True)
    info = read_family_info(outcome.family_dir)
    err.print(f"wrote family {escape(show(outcome.family_dir))} and working tree {escape(show(outcome.tree_dir))}", soft_wrap=True)
    if not result.ok:
        err.print("[bold]what to edit:[/]", soft_wrap=True)
        for reject in result.rejects:
            where = (f"{show(outcome.tree_dir / reject.path)} near line {reject.tree_line}"
                     if reject.tree_line else f"{reject.path} (absent in {to_version}: move the change)")
            err.print(f"  {escape(where)}: {escape(reject.entry)}: {escape(reject.describe()[0])}", highlight=False, soft_wrap=True)
        for rej in outcome.rej_files:
            err.print(f"  details: {escape(show(rej))}", highlight=False, soft_wrap=True)
        ambiguous = sum(1 for r in result.rejects if r.hunk is not None and r.hunk.ambiguous)
        if ambiguous and context is None:
            # The offer: the ambiguous ones may land with more context, made from the family's release.
            err.print(f"{ambiguous} of them {'is' if ambiguous == 1 else 'are'} ambiguous (both sides match): "
                      f"to make {'it' if ambiguous == 1 else 'them'} again with more context from the release "
                      f"{escape(source.name)} applies to, run again with --context 8 (and another --into, or "
                      f"after removing {escape(show(outcome.family_dir))}): "
                      f"{escape(next_step.port(source.name, to_version))} --context 8", highlight=False, soft_wrap=True)
        err.print(f"then: {escape(next_step.series_refresh(outcome.family_dir.name, show(outcome.tree_dir)))}",
                  highlight=False, soft_wrap=True)
    if not json_output:
        verdict = "ok" if result.ok else f"{len(result.rejects)} hunk(s) rejected"
        say(f"port {verdict}: family {info.label} for SGLang {to_version}")
    return 0 if result.ok else EXIT_FAILED


def _port_json(outcome: "porting.PortOutcome") -> dict:
    result = outcome.result
    return {
        "ok": result.ok,
        "sglang": result.version,
        "family": outcome.family_dir.name,
        "family_dir": str(outcome.family_dir),
        "family_origin": origin_of(outcome.family_dir),
        "tree": str(outcome.tree_dir),
        "context_from": outcome.context_from,
        "entries": [
            {
                "entry": e.entry,
                "kind": e.kind,
                "written": e.text is not None,
                "hunks": [{"path": p, "index": h.index, "status": h.status.value, "line": h.line,
                           "offset": h.offset, "fuzz": h.fuzz} for p, h in e.results],
                "rejects": [{"path": r.path, "hunk": r.hunk.index if r.hunk else None, "reason": r.reason,
                             "tree_line": r.tree_line, "ambiguous": bool(r.hunk and r.hunk.ambiguous)}
                            for r in e.rejects],
                "widened": [{"path": p, "hunk": k} for p, k in e.widened],
            }
            for e in result.entries
        ],
        "rej_files": [str(p) for p in outcome.rej_files],
    }


@series_app.command("refresh", help=REFRESH_HELP)
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
    from ddtree_deploy.base.fsutil import require_writable_folder
    from ddtree_deploy.release import port as porting

    folder = family_folder(family)
    if folder.is_dir():  # (a missing family is refresh_family's to word)
        require_writable_folder(folder, "--family")
    outcome = porting.refresh_family(folder, from_dir, version=release, resolved=resolved)
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
        say(f"refresh: family {family}: {len(outcome.changed)} patch file(s) rewritten from the tree "
            f"(SGLang {outcome.version})")


__all__ = ["series_app", "port_command", "refresh_command"]
