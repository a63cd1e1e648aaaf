"""`ddtree-deploy smoke`: prove a host's deployed series works, level by level.

Thin: select the hosts (``--host`` repeated, ``--group``), call ``rollout.smoke_hosts``,
render. One host: progress on stderr, one line per level on stdout. Several: the fleet
view, each host's lines, then the outcome table (``smoke passed`` / ``smoke failed`` / why
it could not run). ``--json``: the fleet document, one host or several (each host's report
in its ``hosts`` entry). Exit 1 when a host did not pass.
"""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from ddtree_deploy.cli.app import app, handles_errors
from ddtree_deploy.cli.options import GROUP_HELP, HOSTS_HELP, inventory_option
from ddtree_deploy.remote.transport import transport_for
from ddtree_deploy.settings import smoke as smoke_settings

LEVEL_HELP = ("a level to run: " + ", ".join(smoke_settings.LEVELS) +
              "; repeatable (default: the levels of the host's smoke table)")


@app.command("smoke")
@handles_errors
def smoke_cmd(
    host: Optional[List[str]] = typer.Option(None, "--host", "-H", help=HOSTS_HELP),
    group: Optional[List[str]] = typer.Option(None, "--group", "-g", help=GROUP_HELP),
    inventory: Optional[Path] = inventory_option(),
    level: Optional[List[str]] = typer.Option(None, "--level", "-l", help=LEVEL_HELP),
    parallel: Optional[int] = typer.Option(None, "--parallel", "-j", help="with several hosts: how many are "
                                           "smoke-tested at once (default: all)"),
    trust_new_host: bool = typer.Option(False, "--trust-new-host", help="record an unknown host key in known_hosts"),
    json_output: bool = typer.Option(False, "--json", help="print one JSON document on stdout"),
) -> None:
    """Run the smoke levels (compile, import, cli, launch) against the series deployed on each host."""
    from ddtree_deploy.cli.fleet_view import render
    from ddtree_deploy.fleets import rollout

    hosts = rollout.select_hosts(host or [], group or [])
    # Level names and report lines come from the hosts: the views print them inert.
    render("smoke", hosts, json_output,
           lambda view: rollout.smoke_hosts(hosts, lambda x: transport_for(x, trust_new_host=trust_new_host),
                                            levels=level, parallel=parallel, on_event=view))


__all__ = ["smoke_cmd"]
