"""`ddtree-deploy restart`: restart the serving SGLang on hosts through their [serve] table.

Thin, like deploy_cmd: parse, call ddtree_deploy.fleets.rollout.restart (the lock, the restart,
the health wait and the DDTree proof, recorded on the host; fleets in waves), render.
"""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from ddtree_deploy.cli.app import app, handles_errors
from ddtree_deploy.cli.deploy_cmd import GROUP_HELP, HOST_HELP, _connect, _render
from ddtree_deploy.cli.options import inventory_option


@app.command("restart")
@handles_errors
def restart(
    host: Optional[List[str]] = typer.Option(None, "--host", "-H", help=HOST_HELP),
    group: Optional[List[str]] = typer.Option(None, "--group", "-g", help=GROUP_HELP),
    inventory: Optional[Path] = inventory_option(),
    canary: Optional[str] = typer.Option(None, "--canary", help="with several hosts: the host restarted alone "
                                         "first, healthy before any other (default: the first selected)"),
    parallel: Optional[int] = typer.Option(None, "--parallel", "-j", help="with several hosts: how many restart "
                                           "at once, in waves; never more servers down (default: all)"),
    max_failures: int = typer.Option(0, "--max-failures", help="with several hosts: failures tolerated "
                                     "before no new wave is started"),
    break_lock: bool = typer.Option(False, "--break-lock", help="take the deploy lock even if another run holds it"),
    trust_new_host: bool = typer.Option(False, "--trust-new-host", help="record an unknown host key in known_hosts"),
    json_output: bool = typer.Option(False, "--json", help="print one JSON document on stdout"),
) -> None:
    """Restart the host's SGLang server ([serve] restart), wait for its health, prove DDTree; recorded."""
    from ddtree_deploy.fleets import rollout

    hosts = rollout.select_hosts(host or [], group or [])
    policy = rollout.restart_policy_for(hosts, canary=canary, parallel=parallel, max_failures=max_failures)
    _render("restart", hosts, json_output,
            lambda view: rollout.restart(hosts, _connect(trust_new_host), canary=canary, parallel=parallel,
                                         max_failures=max_failures, break_lock=break_lock, on_event=view),
            canary=policy.canary)


__all__ = ["restart"]
