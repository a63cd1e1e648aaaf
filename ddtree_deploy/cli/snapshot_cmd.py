"""`ddtree-deploy snapshot ...`: take snapshots of the SGLang files the series touch.

``snapshot_app`` is the sub-app; other command modules register more
sub-commands on it (``snapshot pull`` from a host lives with the push code:
``from ddtree_deploy.cli.snapshot_cmd import snapshot_app`` then
``@snapshot_app.command("pull")``), and reuse ``report_snapshot`` to print one.
"""

from __future__ import annotations

from typing import Optional

import typer

from ddtree_deploy.cli.app import app, emit_json, err, handles_errors, out
from ddtree_deploy.cli.text import safe
from ddtree_deploy.series import show
from ddtree_deploy.snapshot import Snapshot, snapshot_from_release

snapshot_app = typer.Typer(
    name="snapshot",
    help="Take a snapshot (files + MANIFEST.json under snapshot/<name>/) of the SGLang files the series touch.",
    no_args_is_help=True,
)
app.add_typer(snapshot_app, name="snapshot")


def report_snapshot(snap: Snapshot, *, json_output: bool) -> None:
    """Print a snapshot: its manifest as JSON on stdout, or a short listing."""
    m = snap.manifest
    if json_output:
        emit_json({"snapshot": m.name, "folder": str(snap.folder), "manifest": m.to_json()})
        return
    present = [f for f in m.files if not f.absent]
    # The version and paths may come from a host (snapshot pull): printed through `safe`.
    out.print(safe(f"snapshot {m.name}: sglang {m.sglang_version}, {len(present)} files, "
                   f"{len(m.files) - len(present)} absent -> {show(snap.folder)}"), highlight=False)
    width = max((len(f.path) for f in m.files), default=0)
    for f in m.files:
        detail = "absent (the series creates it)" if f.absent else f"{f.size:>8} B  sha256 {f.sha256[:16]}"
        out.print(safe(f"  {f.path:<{width}}  {detail}"), highlight=False)


@snapshot_app.command("release")
@handles_errors
def release(
    version: str = typer.Argument(..., help="SGLang release on PyPI, e.g. 0.5.12.post1"),
    name: Optional[str] = typer.Option(None, "--name", help="snapshot name (default: sglang-<version>)"),
    json_output: bool = typer.Option(False, "--json", help="print one JSON document on stdout"),
) -> None:
    """Snapshot a PyPI release: the files every family touches, from the verified wheel."""
    err.print(f"[dim]snapshot of sglang {version} from its wheel (cached under the user's cache folder)[/]", soft_wrap=True)
    snap = snapshot_from_release(version, name=name)
    report_snapshot(snap, json_output=json_output)


__all__ = ["snapshot_app", "report_snapshot"]
