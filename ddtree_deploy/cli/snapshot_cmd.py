"""`ddtree-deploy snapshot ...`: take snapshots of the SGLang files the series touch.

``snapshot release`` takes them from a PyPI release's verified wheel, ``snapshot pull``
from a host (its own files, the pristine state push compares against).
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from ddtree_deploy.cli.app import app, emit_host, emit_json, err, handles_errors, say
from ddtree_deploy.cli.options import HOST_HELP, inventory_option
from ddtree_deploy.cli.text import safe
from ddtree_deploy.engine.series import show
from ddtree_deploy.release.snapshot import Snapshot, snapshot_from_release

snapshot_app = typer.Typer(
    name="snapshot",
    help="Take a snapshot (files + MANIFEST.json under snapshot/<name>/) of the SGLang files the series touch.",
    no_args_is_help=True,
)
app.add_typer(snapshot_app, name="snapshot")


def report_snapshot(snap: Snapshot, *, json_output: bool, host: str | None = None) -> None:
    """Print a snapshot: its manifest as JSON on stdout (``host``'s entry for a pulled one),
    or a short listing."""
    m = snap.manifest
    if json_output:
        doc = {"snapshot": m.name, "folder": str(snap.folder), "manifest": m.to_json()}
        if host is not None:
            emit_host(host, doc)
        else:
            emit_json(doc)
        return
    present = [f for f in m.files if not f.absent]
    # The version and paths may come from a host (snapshot pull): `say` prints them inert.
    say(f"snapshot {m.name}: sglang {m.sglang_version}, {len(present)} files, "
        f"{len(m.files) - len(present)} absent -> {show(snap.folder)}")
    width = max((len(f.path) for f in m.files), default=0)
    for f in m.files:
        detail = "absent (the series creates it)" if f.absent else f"{f.size:>8} B  sha256 {f.sha256[:16]}"
        say(f"  {f.path:<{width}}  {detail}")


@snapshot_app.command("release")
@handles_errors
def release(
    version: str = typer.Argument(..., help="SGLang release on PyPI, e.g. 0.5.12.post1"),
    name: Optional[str] = typer.Option(None, "--name", help="snapshot name (default: sglang-<version>)"),
    json_output: bool = typer.Option(False, "--json", help="print one JSON document on stdout"),
) -> None:
    """Snapshot a PyPI release: the files every family touches, from the verified wheel."""
    from ddtree_deploy.cli.download_view import downloads_shown

    with downloads_shown(json_output=json_output) as shown:
        snap = snapshot_from_release(version, name=name)
    # "cached" only when it was: a download above showed its own bar or line.
    err.print(f"[dim]snapshot of sglang {version}: from the wheel "
              f"{'just downloaded and verified' if shown.downloaded else 'in the cache, verified'}[/]", soft_wrap=True)
    report_snapshot(snap, json_output=json_output)


@snapshot_app.command("pull")
@handles_errors
def pull(
    host: str = typer.Option(..., "--host", "-H", help=HOST_HELP),
    inventory: Optional[Path] = inventory_option(),
    family: Optional[str] = typer.Option(None, "--family", help="family folder or name under the patches folder "
                                         "(default: the files of every family)"),
    name: Optional[str] = typer.Option(None, "--name", help="snapshot name (default: the host's name)"),
    trust_new_host: bool = typer.Option(False, "--trust-new-host", help="record an unknown host key in known_hosts"),
    json_output: bool = typer.Option(False, "--json", help="print one JSON document on stdout"),
) -> None:
    """Snapshot the host's own SGLang files (the pristine state push compares against)."""
    # The host's modules load only for this sub-command (``snapshot release`` needs none).
    from ddtree_deploy.base.errors import BadInput
    from ddtree_deploy.release.snapshot import snapshot_from_files
    from ddtree_deploy.remote.transport import transport_for
    from ddtree_deploy.session import pull as host_pull
    from ddtree_deploy.session.desired import Want
    from ddtree_deploy.settings.container import refuse_container
    from ddtree_deploy.settings.inventory import load_host

    h = load_host(host)
    refuse_container(h, "snapshot pull")
    paths = Want(family).paths
    err.print(f"[dim]{safe(h.name)}:[/] reading {len(paths)} file(s)")
    facts, files = host_pull.pull(h, transport_for(h, trust_new_host=trust_new_host), paths)
    refused = host_pull.not_pristine(h.name, facts, files)
    if refused is not None:
        raise refused
    if not facts.get("sglang_version"):
        raise BadInput(f"{h.name}: cannot tell the SGLang version at {facts.get('package_root')}")
    source = {"kind": "host", "host": h.name, "python": h.python}
    snap = snapshot_from_files(name or h.name, facts["sglang_version"], source, files,
                               package_root=facts.get("package_root"))
    report_snapshot(snap, json_output=json_output, host=h.name)


__all__ = ["snapshot_app", "report_snapshot", "pull"]
