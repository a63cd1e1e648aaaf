"""`ddtree-deploy push | rollback | status`, and `snapshot pull`: the host commands.

Thin: parse options, load the inventory and the series, call ddtree_deploy.deploy,
render. Progress goes to stderr, one summary line per host (or one JSON document) to
stdout. One host is the plain path; several (``--host`` repeated, ``--group``) are a
fleet: canary first, then ``--parallel`` at a time (ddtree_deploy.fleet decides, and
ddtree_deploy.fleet_run runs the threads), with an outcome table at the end.
"""

from __future__ import annotations

import time
from typing import Callable, List, Optional

import typer

from ddtree_deploy import deploy
from ddtree_deploy.cli.app import app, emit_json, err, handles_errors, out
from ddtree_deploy.cli.snapshot_cmd import report_snapshot, snapshot_app
from ddtree_deploy.cli.text import safe
from ddtree_deploy.codes import Code
from ddtree_deploy.errors import BadInput, DeployError
from ddtree_deploy.fleet import HostResult, Kind, Policy
from ddtree_deploy.inventory import Host, load_host
from ddtree_deploy.transport import transport_for

HOST_HELP = "inventory name (hosts/<name>.toml), a .toml path, or 'local' (this machine); repeatable"
GROUP_HELP = "host group from hosts/groups.toml (its members, in order); repeatable"
PARALLEL_HELP = "with several hosts: how many are worked on at once (default: all)"
FAMILY_HELP = "family folder or name under the patches folder (default: the one covering the host's SGLang)"


def _series_chooser(family: str | None):
    """(paths to discover, facts -> Series): the family is chosen by the host's version unless forced."""
    from ddtree_deploy.series import families, load_family, pick_family
    from ddtree_deploy.snapshot import all_touched_paths

    if family:
        series = load_family(family)
        return list(series.touched_paths()), (lambda facts: series), True
    paths = list(all_touched_paths())

    def choose(facts: dict):
        version = facts.get("sglang_version")
        if not version:
            raise DeployError(f"cannot tell the SGLang version at {facts.get('package_root')}", code=Code.NO_VERSION)
        return load_family(pick_family(version, families()).folder)

    return paths, choose, False


def _desire(host: Host, choose: Callable, forced: bool, check: Callable, chosen: dict | None = None):
    """facts -> Desired; records the series it chose in ``chosen`` (the smoke needs it).

    ``check`` (fleet_run.CheckOnce) runs the check once for the hosts that share its inputs.
    """
    from ddtree_deploy.desired import desired_for

    def desire(facts: dict):
        series = choose(facts)
        if chosen is not None:
            chosen[host.name] = series
        return check(host.name, series, facts, forced, lambda: desired_for(series, host.name, facts, forced=forced))

    return desire


def _say(line: str) -> None:
    # Every result line quotes host text (series, backup ids, errors): none is markup.
    out.print(safe(line), highlight=False)


def _each_host(hosts: List[Host], command: str, json_output: bool, run: Callable[..., dict]) -> None:
    """Run ``run`` per host with live progress; one failure never hides the other hosts."""
    results, worst = [], 0
    for host in hosts:
        try:
            with err.status(safe(f"{host.name}: starting")) as spinner:
                steps = _Steps(host.name, spinner)
                try:
                    doc = run(host, steps, _say)
                finally:
                    steps.finish()
            results.append(doc)
            if doc.get("ok") is False:  # e.g. a failed smoke: reported in full, exit 1
                worst = max(worst, 1)
        except DeployError as exc:
            if len(hosts) == 1:
                raise
            worst = max(worst, exc.exit_code)
            results.append({"host": host.name, "ok": False, **exc.to_json()})
            err.print(f"[bold red]{safe(host.name)}: error:[/] {safe(exc.message)}", highlight=False, soft_wrap=True)
            if exc.hint:
                err.print(f"[dim]hint:[/] {safe(exc.hint)}", highlight=False, soft_wrap=True)
    if json_output:
        emit_json({"command": command, "ok": worst == 0, "hosts": results})
    if worst:
        raise typer.Exit(worst)


class _Steps:
    """Progress on stderr: a live spinner for the running step, a timed line for each finished one."""

    def __init__(self, host: str, spinner):
        self.host, self.spinner = host, spinner
        self.step: str | None = None
        self.started = time.monotonic()

    def __call__(self, step: str) -> None:
        self.finish()
        self.step, self.started = step, time.monotonic()
        self.spinner.update(safe(f"{self.host}: {step}"))

    def finish(self) -> None:
        if self.step is not None:
            err.print(f"[dim]{safe(self.host)}:[/] {safe(self.step)} "
                      f"[dim]({time.monotonic() - self.started:.2f} s)[/]", highlight=False)
            self.step = None


def _print_plan(outcome: deploy.Outcome, say: Callable[[str], None]) -> None:
    if outcome.plan is None:
        return
    for step in outcome.plan.steps:
        frm = (step.current or "absent")[:12]
        to = (step.want or "absent")[:12]
        say(f"  {step.action:<8} {step.path}  {step.state.value}  {frm} -> {to}")


def _summary(outcome: deploy.Outcome, json_output: bool, show_plan: bool, say: Callable[[str], None]) -> dict:
    if not json_output:
        say(f"{outcome.host}: {outcome.summary}")
        if show_plan:
            _print_plan(outcome, say)
        if outcome.broke_lock:
            err.print("[yellow]" + safe(f"{outcome.host}: broke the lock of run {outcome.broke_lock.get('run_id')} "
                                        f"({outcome.broke_lock.get('holder')})") + "[/]")
    return outcome.to_json()


def _selection(host: List[str] | None, group: List[str] | None) -> List[Host]:
    """--host and --group into Hosts; every inventory parses before any connection."""
    from ddtree_deploy.fleet import select
    from ddtree_deploy.inventory import load_groups

    names = select(host or [], group or [], load_groups() if group else {})
    hosts = [load_host(n) for n in names]
    seen: dict[str, str] = {}
    for name, h in zip(names, hosts):
        if h.name in seen:  # two .toml paths with one stem: their results would be indistinguishable
            raise BadInput(f"{name} and {seen[h.name]} are both host {h.name!r}; give each host once")
        seen[h.name] = name
    return hosts


@app.command("push")
@handles_errors
def push(
    host: Optional[List[str]] = typer.Option(None, "--host", "-H", help=HOST_HELP),
    group: Optional[List[str]] = typer.Option(None, "--group", "-g", help=GROUP_HELP),
    family: Optional[str] = typer.Option(None, "--family", help=FAMILY_HELP),
    dry_run: bool = typer.Option(False, "--dry-run", help="print the plan (files, hashes, changes); touch nothing"),
    break_lock: bool = typer.Option(False, "--break-lock", help="take the deploy lock even if another run holds it"),
    trust_new_host: bool = typer.Option(False, "--trust-new-host", help="record an unknown host key in known_hosts"),
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
    json_output: bool = typer.Option(False, "--json", help="print one JSON document on stdout"),
) -> None:
    """Deploy the series: lock, drift check, check, back up, stage + verify, switch, journal, smoke."""
    from ddtree_deploy import smoke
    from ddtree_deploy.fleet import outcome_of_push, push_policy, spread_policy
    from ddtree_deploy.fleet_run import CheckOnce

    hosts = _selection(host, group)
    names = [h.name for h in hosts]
    policy = push_policy(names, canary=canary, parallel=parallel, max_failures=max_failures)
    if dry_run:  # it changes nothing: every host's plan is shown, none waits for a canary
        policy = spread_policy(names, parallel=parallel)
    smoking = not (no_smoke or dry_run)
    # Per host: will smoke levels run after the switch? Then the switch journals `switched`,
    # and only a passed smoke makes it `deployed`. A typo in [smoke] must not surface only
    # after the switch: every table is checked here.
    smokes: dict[str, bool] = {}
    for h in hosts:
        smokes[h.name] = smoking and bool(smoke.choose_levels(smoke.check_settings(h), level, source=h.source)
                                          if smoking else ())
    paths, choose, forced = _series_chooser(family)
    chosen: dict = {}
    check = CheckOnce()

    def run(h: Host, progress, say) -> dict:
        done: dict = {}

        def after_switch(outcome: deploy.Outcome, held: deploy.Held) -> None:
            # The smoke runs while the push still holds the host's deploy lock.
            done["after"] = smoke.after_push(h, lambda: transport_for(h, trust_new_host=trust_new_host), outcome,
                                             chosen[h.name], levels=level or None, auto_rollback=not no_rollback,
                                             progress=progress, held=held)

        outcome = deploy.push(h, transport_for(h, trust_new_host=trust_new_host), paths,
                              _desire(h, choose, forced, check, chosen), dry_run=dry_run,
                              break_lock=break_lock, smoke=smokes[h.name], after_switch=after_switch,
                              progress=progress)
        doc = _summary(outcome, json_output, show_plan=dry_run or outcome.changed, say=say)
        if not smokes[h.name]:
            if outcome.changed and not dry_run:
                skipped = "--no-smoke" if no_smoke else "no smoke levels configured"
                doc["smoke_skipped"] = skipped
                if not json_output:
                    say(f"{h.name}: smoke: not run ({skipped}); journal phase {outcome.phase}")
            return doc
        after = done.get("after")
        if after is None:
            return doc
        doc.update(after.to_json(), ok=after.ok)
        if not json_output:
            for line in after.lines():
                say(f"{h.name}: {line}" if not line.startswith(" ") else line)
        return doc

    _on_hosts(hosts, "push", json_output, run, policy, lambda doc: outcome_of_push(doc, dry_run=dry_run))


@app.command("rollback")
@handles_errors
def rollback(
    host: Optional[List[str]] = typer.Option(None, "--host", "-H", help=HOST_HELP),
    group: Optional[List[str]] = typer.Option(None, "--group", "-g", help=GROUP_HELP),
    to: Optional[str] = typer.Option(None, "--to", help="backup id to restore (default: the newest)"),
    dry_run: bool = typer.Option(False, "--dry-run", help="print the plan; touch nothing"),
    break_lock: bool = typer.Option(False, "--break-lock", help="take the deploy lock even if another run holds it"),
    trust_new_host: bool = typer.Option(False, "--trust-new-host", help="record an unknown host key in known_hosts"),
    parallel: Optional[int] = typer.Option(None, "--parallel", "-j", help=PARALLEL_HELP),
    json_output: bool = typer.Option(False, "--json", help="print one JSON document on stdout"),
) -> None:
    """Restore a backup through the same staged, verified switch; every file checked by sha256."""
    from ddtree_deploy.fleet import outcome_of_rollback, spread_policy

    hosts = _selection(host, group)
    if to is not None and len(hosts) > 1:  # backup ids are per host: one id cannot name a backup on each
        raise BadInput(f"--to {to}: a backup id belongs to one host; give it with a single --host",
                       hint="without --to, each host restores its own newest backup")
    policy = spread_policy([h.name for h in hosts], parallel=parallel)

    def run(h: Host, progress, say) -> dict:
        outcome = deploy.rollback(h, transport_for(h, trust_new_host=trust_new_host), to=to, dry_run=dry_run,
                                  break_lock=break_lock, progress=progress)
        return _summary(outcome, json_output, show_plan=dry_run or outcome.changed, say=say)

    _on_hosts(hosts, "rollback", json_output, run, policy, lambda doc: outcome_of_rollback(doc, dry_run=dry_run))


@app.command("status")
@handles_errors
def status(
    host: Optional[List[str]] = typer.Option(None, "--host", "-H", help=HOST_HELP),
    group: Optional[List[str]] = typer.Option(None, "--group", "-g", help=GROUP_HELP),
    family: Optional[str] = typer.Option(None, "--family", help=FAMILY_HELP),
    trust_new_host: bool = typer.Option(False, "--trust-new-host", help="record an unknown host key in known_hosts"),
    parallel: Optional[int] = typer.Option(None, "--parallel", "-j", help=PARALLEL_HELP),
    json_output: bool = typer.Option(False, "--json", help="print one JSON document on stdout"),
) -> None:
    """Per host: SGLang version, phase, deployed series, per-file state, backups, lock holder."""
    from ddtree_deploy.fleet import spread_policy
    from ddtree_deploy.fleet_run import CheckOnce

    hosts = _selection(host, group)
    policy = spread_policy([h.name for h in hosts], parallel=parallel)
    try:
        paths, choose, forced = _series_chooser(family)
    except BadInput as exc:
        # A broken series must not hide a host's state: report what the journal knows.
        err.print(f"[yellow]series not loaded ({safe(exc.message)}); per-file states come from the host's journal[/]",
                  highlight=False, soft_wrap=True)
        paths, choose, forced = [], None, False
    check = CheckOnce()

    def run(h: Host, progress, say) -> dict:
        desire = _desire(h, choose, forced, check) if choose else None
        progress("read state")

        def expected(facts: dict):
            try:
                return desire(facts) if desire else None
            except DeployError:
                return None  # status still reports what the journal knows

        doc = deploy.status(h, transport_for(h, trust_new_host=trust_new_host), paths, expected)
        if not json_output and len(hosts) == 1:  # a fleet gets one table instead (below)
            _print_status(doc)
        return doc

    _on_hosts(hosts, "status", json_output, run, policy, lambda doc: Kind.READ)


# ---------------------------------------------------------------- fleets (several hosts)


def _on_hosts(hosts: List[Host], command: str, json_output: bool, run: Callable[..., dict], policy: Policy,
              kind_of: Callable[[dict], Kind]) -> None:
    """One host: the plain path, unchanged. Several: the fleet path; exits non-zero unless all are ok."""
    if len(hosts) == 1:
        _each_host(hosts, command, json_output, run)
        return
    from ddtree_deploy.cli.fleet_view import FleetView, print_counts, print_outcomes, print_status_table
    from ddtree_deploy.fleet import detail_of
    from ddtree_deploy.fleet_run import run_fleet

    by_name = {h.name: h for h in hosts}

    def work(name: str, progress: Callable[[str], None]) -> HostResult:
        lines: list[str] = []
        doc = run(by_name[name], progress, lines.append)
        kind = kind_of(doc)
        detail = detail_of(doc, kind)
        return HostResult(name, kind, doc, detail, 0 if kind.ok else 1, tuple(lines))

    with FleetView([h.name for h in hosts], policy) as view:
        report = run_fleet(command, [h.name for h in hosts], policy, work, view)
    for r in report.results:  # results on stdout, in selection order, once every host is done
        for line in r.lines:
            _say(line)
    if command == "status":  # its table (stdout) already says how each host ended
        if not json_output:
            print_status_table(report)
        print_counts(report)
    else:
        print_outcomes(report)
    if json_output:
        emit_json(report.to_json())
    if report.exit_code:
        raise typer.Exit(report.exit_code)


def _print_status(doc: dict) -> None:
    # Every value here comes from the host (its journal, lock, paths): printed through `safe`.
    def say(line: str) -> None:
        out.print(safe(line), highlight=False)

    say(f"{doc['host']}: sglang {doc['sglang_version']} at {doc['package_root']}")
    say(f"  phase: {doc['phase']}: {doc['explanation']}")
    if doc["series"]:
        s = doc["series"]
        say(f"  series: {s['name']} ({str(s['id'] or '')[:12]}), run {s['run_id']}, {s['updated']}, "
            f"backup {s['backup_id']}")
    for f in doc["files"]:
        detail = f"  ({f['detail']})" if f.get("detail") else ""
        say(f"  {f['state']:<9} {f['path']}  {(f['sha256'] or 'absent')[:12]}{detail}")
    for b in doc["backups"]:
        say(f"  backup {b['id']}  {b['created']}  {b.get('series') or ''}")
    lock = doc["lock"]
    if lock:
        stale = " (stale: its process is gone)" if lock.get("stale") else ""
        say(f"  lock: held by {lock.get('holder')} since {lock.get('time')} (run {lock.get('run_id')}, "
            f"{lock.get('command')}){stale}")
    else:
        say("  lock: free")


@snapshot_app.command("pull")
@handles_errors
def pull(
    host: str = typer.Option(..., "--host", "-H", help="inventory name, a .toml path, or 'local'"),
    family: Optional[str] = typer.Option(None, "--family", help=FAMILY_HELP),
    name: Optional[str] = typer.Option(None, "--name", help="snapshot name (default: the host's name)"),
    trust_new_host: bool = typer.Option(False, "--trust-new-host", help="record an unknown host key in known_hosts"),
    json_output: bool = typer.Option(False, "--json", help="print one JSON document on stdout"),
) -> None:
    """Snapshot the host's own SGLang files (the pristine state push compares against)."""
    from ddtree_deploy.snapshot import snapshot_from_files

    h = load_host(host)
    paths, _choose, _forced = _series_chooser(family)
    err.print(f"[dim]{safe(h.name)}:[/] reading {len(paths)} file(s)")
    facts, files = deploy.pull(h, transport_for(h, trust_new_host=trust_new_host), paths)
    patched = deploy.patched_paths(facts, files)
    if patched:
        raise DeployError(f"{h.name}: {', '.join(patched)} are patched by ddtree-deploy, not pristine",
                          code=Code.NOT_PRISTINE, hint=f"roll back first (ddtree-deploy rollback --host {h.name})")
    if not facts.get("sglang_version"):
        raise BadInput(f"{h.name}: cannot tell the SGLang version at {facts.get('package_root')}")
    source = {"kind": "host", "host": h.name, "python": h.python}
    snap = snapshot_from_files(name or h.name, facts["sglang_version"], source, files,
                               package_root=facts.get("package_root"))
    report_snapshot(snap, json_output=json_output)


__all__ = ["push", "rollback", "status", "pull"]
