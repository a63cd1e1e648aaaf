"""`ddtree-deploy push | rollback | status`: the host commands.

Thin: parse options, call ddtree_deploy.fleets.rollout (which does the work on one host or a
fleet and says how each host ended), render. Progress goes to stderr (a spinner for one
host, a row per host for a fleet), one summary line per host (or one JSON document) to
stdout, and with several hosts (``--host`` repeated, ``--group``) an outcome table.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, List, Optional

import typer

from ddtree_deploy.cli.app import app, handles_errors, say
from ddtree_deploy.cli.options import GROUP_HELP, HOSTS_HELP, inventory_option
from ddtree_deploy.remote.transport import transport_for
from ddtree_deploy.serve.live import DEFAULT_WINDOW_S as LIVE_WINDOW_S
from ddtree_deploy.settings.inventory import Host

HOST_HELP = HOSTS_HELP  # (serve_cmd imports it from here)
PARALLEL_HELP = "with several hosts: how many are worked on at once (default: all)"
FAMILY_HELP = "family folder or name under the patches folder (default: the one covering the host's SGLang)"
REPLACE_DRIFTED_HELP = ("replace files edited outside ddtree-deploy too (refused without it): their bytes are "
                        "kept first, as found, in a backup of their own on the host (drifted/ in its state "
                        "folder, listed by status); their diff is printed (with --dry-run: nothing changes)")
FORCE_DRIVER_HELP = ("push even where the host's NVIDIA driver cannot run its SGLang release's CUDA lane "
                     "(refused without it, before any change: docs/deploy.md, \"The host's driver\"), or "
                     "nvidia-smi's answer is no driver version; the refusal becomes a warning line")


def _connect(trust_new_host: bool) -> Callable[[Host], object]:
    return lambda h: transport_for(h, trust_new_host=trust_new_host)


def _render(command: str, hosts: List[Host], json_output: bool, call: Callable, canary: str | None = None) -> None:
    from ddtree_deploy.cli.fleet_view import render

    render(command, hosts, json_output, call, canary=canary,
           single=(lambda r: _print_any_status(r.doc)) if command == "status" else None)


def _print_any_status(doc: dict) -> None:
    if doc.get("kind") == "container":  # a [container] host (issue 32)
        from ddtree_deploy.cli.container_view import print_container_status

        print_container_status(doc)
        return
    _print_status(doc)


@app.command("push")
@handles_errors
def push(
    host: Optional[List[str]] = typer.Option(None, "--host", "-H", help=HOST_HELP),
    group: Optional[List[str]] = typer.Option(None, "--group", "-g", help=GROUP_HELP),
    inventory: Optional[Path] = inventory_option(),
    family: Optional[str] = typer.Option(None, "--family", help=FAMILY_HELP),
    dry_run: bool = typer.Option(False, "--dry-run", help="print the plan (files, hashes, changes); touch nothing"),
    diff: bool = typer.Option(False, "--diff", help="print the unified diff each host gets, per file, from its "
                              "current file (with --dry-run: would get); a drifted file: the host's bytes "
                              "against what the series expects"),
    break_lock: bool = typer.Option(False, "--break-lock", help="take the deploy lock even if another run holds it"),
    replace_drifted: bool = typer.Option(False, "--replace-drifted", help=REPLACE_DRIFTED_HELP),
    trust_new_host: bool = typer.Option(False, "--trust-new-host", help="record an unknown host key in known_hosts"),
    force_driver: bool = typer.Option(False, "--force-driver", help=FORCE_DRIVER_HELP),
    no_smoke: bool = typer.Option(False, "--no-smoke", help="switch only: run no smoke level afterwards"),
    no_rollback: bool = typer.Option(False, "--no-rollback", help="keep the new files when a smoke level fails"),
    level: Optional[List[str]] = typer.Option(None, "--level", "-l",
                                              help="smoke level to run after the switch; repeatable "
                                              "(default: the host's [smoke] levels)"),
    canary: Optional[str] = typer.Option(None, "--canary", help="with several hosts: the host pushed and "
                                         "smoke-tested alone first (default: the first selected)"),
    parallel: Optional[int] = typer.Option(None, "--parallel", "-j", help=PARALLEL_HELP),
    max_failures: int = typer.Option(0, "--max-failures", help="with several hosts: failures tolerated "
                                     "before no new host is started"),
    no_analysis: bool = typer.Option(False, "--no-analysis", help="skip the speed analysis ([analysis]): promote "
                                     "a healthy, proven server without judging its speed (said in the outcome)"),
    analysis: Optional[List[str]] = typer.Option(None, "--analysis", metavar="KEY=VALUE",
                                                 help="override one [analysis] key for this push, e.g. "
                                                 "window_s=60 or thresholds.output_tps=-3%; repeatable"),
    json_output: bool = typer.Option(False, "--json", help="print one JSON document on stdout"),
) -> None:
    """Deploy the series: lock, drift check, check, back up, stage + verify, switch, journal, smoke."""
    from ddtree_deploy.fleets import rollout
    from ddtree_deploy.settings.analysis import parse_override

    hosts = rollout.select_hosts(host or [], group or [])
    options = rollout.PushOptions(family=family, dry_run=dry_run, break_lock=break_lock, smoke=not no_smoke,
                                  levels=tuple(level or ()), auto_rollback=not no_rollback, canary=canary,
                                  parallel=parallel, max_failures=max_failures, diff=diff,
                                  replace_drifted=replace_drifted, force_driver=force_driver, analysis=not no_analysis,
                                  analysis_overrides=tuple(parse_override(a) for a in analysis or ()))
    _render("push", hosts, json_output,
            lambda view: rollout.push(hosts, _connect(trust_new_host), options, on_event=view),
            canary=rollout.push_policy_for(hosts, options).canary)


@app.command("rollback")
@handles_errors
def rollback(
    host: Optional[List[str]] = typer.Option(None, "--host", "-H", help=HOST_HELP),
    group: Optional[List[str]] = typer.Option(None, "--group", "-g", help=GROUP_HELP),
    inventory: Optional[Path] = inventory_option(),
    to: Optional[str] = typer.Option(None, "--to", help="backup id to restore (default: the newest)"),
    dry_run: bool = typer.Option(False, "--dry-run", help="print the plan; touch nothing"),
    break_lock: bool = typer.Option(False, "--break-lock", help="take the deploy lock even if another run holds it"),
    replace_drifted: bool = typer.Option(False, "--replace-drifted", help=REPLACE_DRIFTED_HELP),
    trust_new_host: bool = typer.Option(False, "--trust-new-host", help="record an unknown host key in known_hosts"),
    parallel: Optional[int] = typer.Option(None, "--parallel", "-j", help=PARALLEL_HELP),
    json_output: bool = typer.Option(False, "--json", help="print one JSON document on stdout"),
) -> None:
    """Restore a backup through the same staged, verified switch; every file checked by sha256."""
    from ddtree_deploy.fleets import rollout

    hosts = rollout.select_hosts(host or [], group or [])
    _render("rollback", hosts, json_output,
            lambda view: rollout.rollback(hosts, _connect(trust_new_host), to=to, dry_run=dry_run,
                                          break_lock=break_lock, parallel=parallel, replace_drifted=replace_drifted,
                                          on_event=view))


@app.command("status")
@handles_errors
def status(
    host: Optional[List[str]] = typer.Option(None, "--host", "-H", help=HOST_HELP),
    group: Optional[List[str]] = typer.Option(None, "--group", "-g", help=GROUP_HELP),
    inventory: Optional[Path] = inventory_option(),
    family: Optional[str] = typer.Option(None, "--family", help=FAMILY_HELP),
    diff: bool = typer.Option(False, "--diff", help="each drifted file: the host's bytes against what the "
                              "series expects there (unified diff)"),
    trust_new_host: bool = typer.Option(False, "--trust-new-host", help="record an unknown host key in known_hosts"),
    parallel: Optional[int] = typer.Option(None, "--parallel", "-j", help=PARALLEL_HELP),
    window: float = typer.Option(LIVE_WINDOW_S, "--window", metavar="SECONDS",
                                 help="a host with [serve]: its live DDTree line measures the server over this "
                                      f"window, two scrapes of /metrics this far apart (default {LIVE_WINDOW_S:g} "
                                      "s; 0: no live line)"),
    json_output: bool = typer.Option(False, "--json", help="print one JSON document on stdout"),
) -> None:
    """Per host: SGLang version, phase, deployed series, per-file state, backups, lock holder,
    and for a host with [serve] the live DDTree line (accept length, tokens/s, ITL)."""
    from ddtree_deploy.fleets import rollout
    from ddtree_deploy.serve.live import check_window

    window_s = check_window(window)  # bad input before any host is read
    hosts = rollout.select_hosts(host or [], group or [])
    _render("status", hosts, json_output,
            lambda view: rollout.status(hosts, _connect(trust_new_host), family=family, parallel=parallel,
                                        diff=diff, window_s=window_s, on_event=view))


def _print_status(doc: dict) -> None:
    # Every value here comes from the host (its journal, lock, paths): `say` prints it inert.
    say(f"{doc['host']}: sglang {doc['sglang_version']} at {doc['package_root']}")
    if doc.get("state_home"):
        say(f"  state: {doc['state_home']}")
    _print_driver(doc)
    phase = f"MIXED (journal: {doc['phase']})" if doc.get("mixed") else doc["phase"]
    say(f"  phase: {phase}: {doc['explanation']}")
    if doc["series"]:
        s = doc["series"]
        say(f"  series: {s['name']} ({str(s['id'] or '')[:12]}), run {s['run_id']}, {s['updated']}, "
            f"backup {s['backup_id']}")
    for f in doc["files"]:
        detail = f"  ({f['detail']})" if f.get("detail") else ""
        say(f"  {f['state']:<9} {f['path']}  {(f['sha256'] or 'absent')[:12]}{detail}")
    for b in doc["backups"]:
        say(f"  backup {b['id']}  {b['created']}  {b.get('series') or ''}")
    for k in doc.get("drifted_backups") or ():
        say(f"  kept edits {k['id']}  {k['created']}  ({k.get('command')} run {k.get('run_id')} replaced them): "
            f"{k.get('folder')}")
        for f in k["files"]:
            say(f"    {f['path']}  {(f['sha256'] or 'absent')[:12]}  -> {f.get('file')}")
    serving = doc.get("serving")
    if serving:
        from ddtree_deploy.serve.plan import process_line

        say(f"  serving: {serving['explanation']}")
        for p in serving.get("processes") or ():
            say(f"    {process_line(p)}")
    _print_live(doc)
    print_lock(doc["lock"])
    _print_installs(doc)


def _print_driver(doc: dict) -> None:
    """The host's NVIDIA driver, the CUDA it supports and the SGLang lane that allows (one line)."""
    driver = doc.get("driver")
    if driver:
        say(f"  {driver['line']}")


def _print_live(doc: dict) -> None:
    """The host's live DDTree line (``serve/live.py``, rendered there; host text, printed inert)."""
    live = doc.get("live")
    if live:
        say(f"  live: {live['line']}")


def print_lock(lock: dict | None) -> None:
    """A status block's lock line (host text, printed inert)."""
    if lock:
        stale = " (stale: its process is gone)" if lock.get("stale") else ""
        say(f"  lock: held by {lock.get('holder')} since {lock.get('time')} (run {lock.get('run_id')}, "
            f"{lock.get('command')}){stale}")
    else:
        say("  lock: free")


def _print_installs(doc: dict) -> None:
    """The other SGLang installs keeping state in the same state folder (each its own)."""
    others = [i for i in doc.get("installs") or () if not i.get("this")]
    if not others:
        return
    say(f"  {len(others)} other install(s) keep their own state in the same state folder:")
    for i in others:
        what = (f"{i.get('phase')} {i.get('series') or ''} (run {i.get('run_id')})" if i.get("phase")
                else "never deployed")
        lock = f"; lock held by {i['lock'].get('holder')} ({i['lock'].get('command')})" if i.get("lock") else ""
        root = i.get("package_root") or "an earlier layout's state, claimed by no install yet"
        say(f"    {root} (python {i.get('python') or '?'}): sglang {i.get('sglang_version') or '?'}, {what}{lock}")


__all__ = ["print_lock", "push", "rollback", "status"]
