"""`ddtree-deploy smoke`: prove a host's deployed series works, level by level.

Thin: load the inventory, call ``rollout.smoke_one``, render. Progress on stderr; one
line per level (or one JSON document) on stdout; exit 1 when a level fails.
"""

from __future__ import annotations

from typing import List, Optional

import typer

from ddtree_deploy import smoke_settings
from ddtree_deploy.cli.app import app, emit_json, handles_errors, out
from ddtree_deploy.cli.text import safe
from ddtree_deploy.inventory import load_host
from ddtree_deploy.transport import transport_for

LEVEL_HELP = ("a level to run: " + ", ".join(smoke_settings.LEVELS) +
              "; repeatable (default: the levels of the host's smoke table)")


@app.command("smoke")
@handles_errors
def smoke_cmd(
    host: str = typer.Option(..., "--host", "-H", help="inventory name (hosts/<name>.toml), a .toml path, or 'local'"),
    level: Optional[List[str]] = typer.Option(None, "--level", "-l", help=LEVEL_HELP),
    trust_new_host: bool = typer.Option(False, "--trust-new-host", help="record an unknown host key in known_hosts"),
    json_output: bool = typer.Option(False, "--json", help="print one JSON document on stdout"),
) -> None:
    """Run the smoke levels (compile, import, cli, launch) against the series deployed on a host."""
    from ddtree_deploy import rollout
    from ddtree_deploy.cli.fleet_view import HostView

    h = load_host(host)
    with HostView(h.name) as view:  # level names and report lines come from the host: printed inert
        report = rollout.smoke_one(h, lambda x: transport_for(x, trust_new_host=trust_new_host), levels=level,
                                   on_event=view)
    if json_output:
        emit_json(report.to_json())
    else:
        out.print(safe(f"{h.name}: smoke {'passed' if report.ok else 'FAILED'}"), highlight=False)
        for line in report.lines():
            out.print(safe("  " + line), highlight=False)
    if not report.ok:
        raise typer.Exit(1)


__all__ = ["smoke_cmd"]
