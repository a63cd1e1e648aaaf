"""The main use case, in one place: push (push -> smoke -> mark, or roll back), rollback,
status and smoke, on one host or a fleet (canary first, then waves).

It sits above ``session/push`` (the locked, verified switch) and ``smoke`` (the levels), and
below the CLI: the CLI parses, calls one function here, and renders what it gets back.
Every host ends as a ``fleet.HostResult`` whose ``kind`` is decided here from the typed
values the steps return (``host_push.Outcome``, ``AfterPush``, the ``DeployError`` and
where it was raised), never re-read from the JSON document. Progress is reported as
``Event``s to one callback (called from worker threads with several hosts); what the
single-host command prints as its result is in ``HostResult.lines``.

Calls go down: rollout -> fleet_run / fleet, deploy, smoke -> transport. Nothing below
imports this module.
"""

from __future__ import annotations

import enum
import uuid
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any, Callable, Sequence

from ddtree_deploy.base import hooks, next_step
from ddtree_deploy.base.codes import Code, Phase
from ddtree_deploy.base.errors import BadInput, Changed, DeployError, clause
from ddtree_deploy.base.progress import Heartbeat, Progress, quiet
from ddtree_deploy.fleets.fleet import (
    FleetReport,
    HostResult,
    Kind,
    Policy,
    attention,
    push_policy,
    spread_policy,
)
from ddtree_deploy.fleets.run import run_fleet
from ddtree_deploy.fleets.host_check import analysis_settings, check_tables, unused_analysis
from ddtree_deploy.session import driver_gate
from ddtree_deploy.session import push as host_push
from ddtree_deploy.session import status as host_status
from ddtree_deploy.session.desired import Want
from ddtree_deploy.settings import smoke as smoke_settings
from ddtree_deploy.settings.container import refuse_container
from ddtree_deploy.settings.inventory import Host
from ddtree_deploy.smoke import plan as smoke_plan, report as smoke_report, run as smoke_run

Connect = Callable[[Host], Any]  # Host -> a fresh Transport (each call: a new connection)


# ---------------------------------------------------------------- events


class EventKind(enum.Enum):
    STARTED = "started"  # a host's work began
    STEP = "step"  # a host began a step (the previous one, if any, finished)
    HEARTBEAT = "heartbeat"  # a long smoke level is still running (``seconds`` so far)
    WARNING = "warning"  # something the operator must see now (a broken lock, a series not loaded)
    DOWNLOAD = "download"  # a release wheel is downloading (``text``: its name; ``received`` of ``total`` bytes)
    FINISHED = "finished"  # a host ended: ``result`` says how


@dataclass(frozen=True)
class Event:
    kind: EventKind
    host: str
    text: str = ""
    seconds: float | None = None
    result: HostResult | None = None
    received: int | None = None  # DOWNLOAD: bytes so far (0: it starts)
    total: int | None = None  # DOWNLOAD: the file's size


Listener = Callable[[Event], None]


def _ignore(_event: Event) -> None:
    pass


class _Relay:
    """fleet_run's Events protocol -> one Listener."""

    def __init__(self, listener: Listener):
        self.listener = listener

    def started(self, host: str) -> None:
        self.listener(Event(EventKind.STARTED, host))

    def step(self, host: str, text: str) -> None:
        self.listener(Event(EventKind.STEP, host, text))

    def finished(self, result: HostResult) -> None:
        self.listener(Event(EventKind.FINISHED, result.host, result=result))


def select_hosts(host: Sequence[str], group: Sequence[str]) -> list[Host]:
    """--host and --group into Hosts; every inventory parses before any connection."""
    from ddtree_deploy.fleets.fleet import select
    from ddtree_deploy.settings.inventory import load_groups, load_host

    names = select(list(host or []), list(group or []), load_groups() if group else {})
    hosts = [load_host(n) for n in names]
    seen: dict[str, str] = {}
    for name, h in zip(names, hosts):
        if h.name in seen:  # two .toml paths with one stem: their results would be indistinguishable
            raise BadInput(f"{name} and {seen[h.name]} are both host {h.name!r}; give each host once")
        seen[h.name] = name
    return hosts


# ---------------------------------------------------------------- after the switch: smoke, mark or roll back


@dataclass(frozen=True)
class AfterPush:
    """What happened after a push's switch: the smoke, and the mark or rollback it led to."""

    report: smoke_report.SmokeReport | None  # None: no level ran (see ``skipped`` / ``error``)
    skipped: str | None = None  # why no level ran (``--no-smoke``, none configured, nothing switched)
    rollback: host_push.Outcome | None = None  # the automatic rollback, when one ran and succeeded
    rollback_error: str | None = None  # the rollback itself failed: the host needs a person
    kept: bool = False  # failed, and --no-rollback kept the new files
    host: str = "HOST"
    error: str | None = None  # the smoke could not run (connection lost, program died)
    marked: bool = False  # passed, and the journal moved switched -> deployed
    mark_error: str | None = None  # passed, but moving the journal to deployed failed
    phase: str | None = None  # the journal phase this left, when known
    serve: Any = None  # serve_gate.ServeGate: the server restart that followed a passed smoke ([serve])

    @property
    def ok(self) -> bool:
        return (self.error is None and self.mark_error is None and (self.report is None or self.report.ok)
                and (self.serve is None or self.serve.ok))

    @property
    def smoked(self) -> bool:
        """A smoke was attempted (it ran, or it could not run)."""
        return self.report is not None or self.error is not None

    def to_json(self) -> dict:
        doc = {
            "smoke": self.report.to_json() if self.report else None,
            "smoke_skipped": self.skipped,
            "smoke_error": self.error,
            "mark_error": self.mark_error,
            "auto_rollback": (None if self.report is None or self.report.ok else {
                "done": self.rollback is not None,
                "outcome": self.rollback.to_json() if self.rollback is not None else None,
                "error": self.rollback_error,
                "kept_new_files": self.kept,
            }),
        }
        if self.phase is not None:
            doc["phase"] = self.phase
        if self.serve is not None:
            doc["serve"] = self.serve.to_json()
        return doc

    def _next(self) -> str:
        return f"the host stays `switched`: {next_step.smoke_or_rollback(self.host)}"

    def lines(self) -> list[str]:
        served = self.serve.lines() if self.serve is not None else []
        if self.report is None:
            if self.error is not None:
                return [f"smoke: could not run ({self.error}); {self._next()}"]
            return [f"smoke: not run ({self.skipped})"] + served
        out = ["smoke:"] + ["  " + line for line in self.report.lines()]
        if self.report.ok:
            if served:
                return out + ["smoke passed"] + served
            if self.mark_error is not None:
                return out + [f"smoke passed, but marking the host deployed FAILED ({self.mark_error}); "
                              f"{self._next()}"]
            return out + (["smoke passed: journal marked deployed"] if self.marked else [])
        if self.rollback is not None:
            out.append(f"smoke failed at {self.report.failed.level}: rolled back automatically: "
                       f"{self.rollback.summary}")
        elif self.kept:
            out.append(f"smoke failed at {self.report.failed.level}: new files KEPT (--no-rollback); "
                       f"journal phase `switched`; roll back with {next_step.rollback(self.host)}")
        else:
            out.append(f"smoke failed at {self.report.failed.level}, and the automatic rollback FAILED: "
                       f"{self.rollback_error}")
        return out


def after_push(host, make_transport: Callable[[], Any], outcome: host_push.Outcome, series, *,
               levels: Sequence[str] | None = None, auto_rollback: bool = True, log_dir=None,
               progress: Progress = quiet, held: host_push.PushSession | None = None,
               heartbeat: Heartbeat | None = None, serve=None,
               smoke: bool = True, analysis=None, baseline=None, no_analysis: bool = False) -> AfterPush:
    """Run the host's smoke levels after a push switched files; roll back if one fails.

    ``outcome`` is ``host_push.push``'s; nothing runs when it changed nothing (a dry run,
    or already deployed: ``smoke`` checks those on demand), unless the host is still
    ``switched`` by a run whose smoke never passed (``outcome.smoke_pending``): that one is
    smoke-tested now. When every level passes, the journal moves ``switched`` ->
    ``deployed`` (``host_push.mark``, compare-and-set on the run id). The rollback restores
    the backup the push made, through the same verified switch as ``host_push.rollback``.

    ``held`` (``host_push.begin_push``'s session, ``locked``): the push's session, still
    holding the deploy lock; the mark goes through it, and so does the rollback
    (``PushSession.rollback``: the lock is released only with its apply, so no other run
    acts on the host in between). Without it, ``host_push.mark`` and ``host_push.rollback`` open
    sessions of their own.

    A host whose earlier smoke failed at a level (recorded in its journal, kept by
    ``--no-rollback``: ``outcome.smoke_failed``) runs that level again, whatever
    ``levels`` says: it is never marked deployed on a smoke that skipped it.

    ``serve`` (the host's ``serve_settings.ServeSettings``, with ``held``): once the smoke
    passed (or none runs: ``smoke`` False is ``--no-smoke``), the server is restarted and
    must be healthy and serve DDTree before the mark (``serve_gate.gate_push``); with
    ``analysis`` (the host's ``[analysis]``) it then bakes against ``baseline`` and is promoted
    only when not slower (``no_analysis``: ``--no-analysis``, skipped and said).
    """

    def mark(phase: str, smoke_doc: dict | None = None) -> None:
        if held is not None:
            progress(f"journal: {phase}")
            held.mark(phase, smoke_doc)
        else:
            host_push.mark(host, make_transport(), pending, phase, smoke=smoke_doc, progress=progress)

    pending = outcome.smoke_pending
    if not outcome.changed and pending is None:
        return AfterPush(None, skipped="nothing was switched", host=host.name)

    def gated(report, skipped=None) -> AfterPush:  # [serve]: restart, health, proof, then the mark
        from ddtree_deploy.fleets import serve_gate

        gate = serve_gate.gate_push(host, serve, held, lambda _h: make_transport(), outcome, series,
                                    auto_rollback=auto_rollback, progress=progress, heartbeat=heartbeat,
                                    analysis=analysis, baseline=baseline, no_analysis=no_analysis)
        phase = (Phase.DEPLOYED if gate.marked else Phase.ROLLED_BACK if gate.rollback is not None
                 else Phase.SWITCHED)
        return AfterPush(report, skipped=skipped, host=host.name, marked=gate.marked, phase=phase, serve=gate)

    serving = serve is not None and held is not None and pending is not None
    if serving and not smoke:
        if outcome.smoke_failed:  # a level failed on these files: --no-smoke never marks them
            return AfterPush(None, skipped="--no-smoke", host=host.name, phase=Phase.SWITCHED)
        return gated(None, "--no-smoke")
    redo = outcome.smoke_failed if pending is not None else None
    try:  # the smoke room plans it; base/hooks.py: a test's keep-alive interval (20 s by default)
        plan = smoke_plan.plan_after_switch(host, series, levels, run_id=outcome.run_id, redo=redo,
                                            heartbeat=hooks.smoke_heartbeat_s())
    except BadInput as exc:
        if not redo:
            raise
        return AfterPush(None, host=host.name, phase=Phase.SWITCHED,
                         error=f"its earlier smoke failed at {redo}, which cannot run here: {exc.message}")
    if not plan.levels:
        if serving:
            return gated(None, "no smoke levels configured")
        return AfterPush(None, skipped="no smoke levels configured", host=host.name)
    try:
        report = smoke_run.run_on_host(host, make_transport(), plan, log_dir=log_dir, progress=progress,
                                   heartbeat=heartbeat)
    except DeployError as exc:
        return AfterPush(None, host=host.name, error=clause(exc, host.name), phase=Phase.SWITCHED if pending else None)
    if report.ok:
        if pending is None:
            return AfterPush(report, host=host.name)
        if serving:
            return gated(report)
        try:
            mark(Phase.DEPLOYED)
        except DeployError as exc:
            return AfterPush(report, host=host.name, mark_error=clause(exc, host.name))
        return AfterPush(report, host=host.name, marked=True, phase=Phase.DEPLOYED)
    if not auto_rollback:
        note = None
        if pending is not None:
            try:  # the journal keeps which level failed; the phase stays `switched`
                mark(Phase.SWITCHED, {"failed": report.failed.level, "detail": report.failed.detail[:500]})
            except DeployError as exc:
                note = clause(exc, host.name)
        return AfterPush(report, kept=True, host=host.name, mark_error=note,
                         phase=Phase.SWITCHED if pending else None)
    progress(f"smoke failed at {report.failed.level}: rolling back to backup {outcome.backup_id}")
    why = host_push.automatic_cause(pending or outcome.run_id, "smoke", report.failed.level, report.failed.detail)
    try:
        if held is not None:  # under the push's own lock: no other run acts between the switch and its undoing
            undone = held.rollback(outcome.backup_id, release=True, progress=progress, automatic=why)
        else:
            undone = host_push.rollback(host, make_transport(), to=outcome.backup_id, progress=progress, automatic=why)
    except DeployError as exc:
        return AfterPush(report, rollback_error=clause(exc, host.name), host=host.name)
    return AfterPush(report, rollback=undone, host=host.name, phase=Phase.ROLLED_BACK)


def smoke_host(host, make_transport: Callable[[], Any], *, levels: Sequence[str] | None = None,
               patches_dir=None, log_dir=None, progress: Progress = quiet,
               heartbeat: Heartbeat | None = None) -> smoke_report.SmokeReport:
    """``ddtree-deploy smoke``: the levels against what the host's journal says is deployed.

    A host in phase ``switched`` (files patched, smoke never passed) is smoke-tested the
    same way; when every level passes its journal moves to ``deployed`` (the report's
    ``note`` says so), and a failed level is recorded there, the phase staying ``switched``.
    """
    settings = smoke_settings.parse_settings(host.smoke, source=host.source)
    smoke_plan.choose_levels(settings, levels, source=host.source)  # bad input stops here, before any connection
    try:  # nothing below changes the host until its journal is marked
        doc, series, report = _smoke_levels(host, make_transport, settings, levels, patches_dir, log_dir, progress,
                                            heartbeat)
    except DeployError as exc:  # read-only up to here: whatever failed, the host is as it was
        raise exc.known(changed=Changed.NO, step="smoke") from exc
    if doc["phase"] != Phase.SWITCHED:
        return report
    run_id = doc["series"]["run_id"]
    if report.ok and host.serve:  # [serve]: only a push marks it, once the server restarted healthy
        return replace(report, note=f"phase stays switched (run {run_id}): the server has not been restarted "
                                    f"healthy on these files; run {next_step.push(host.name)}")
    if report.ok:
        host_push.mark(host, make_transport(), run_id, Phase.DEPLOYED, progress=progress)
        return replace(report, note=f"phase switched -> deployed (run {run_id}): the smoke passed")
    failed = report.failed
    host_push.mark(host, make_transport(), run_id, Phase.SWITCHED, progress=progress,
                smoke={"failed": failed.level, "detail": failed.detail[:500]} if failed else None)
    return replace(report, note=f"phase stays switched (run {run_id}): roll back with "
                                f"{next_step.rollback(host.name)}")


def _smoke_levels(host, make_transport, settings, levels, patches_dir, log_dir, progress, heartbeat):
    """Read the host's journal, load the series it names, run the levels: (status, series, report)."""
    from ddtree_deploy.engine.series import known_family, load_family, no_such_family

    progress("read the host's journal")
    doc = host_status.status(host, make_transport())
    if doc["phase"] not in (Phase.DEPLOYED, Phase.SWITCHED) or not doc["series"]:
        raise DeployError(f"{host.name}: no series is deployed (phase {doc['phase']}): the smoke checks a "
                          "deployed series", code=Code.NOT_DEPLOYED,
                          hint=f"push first: {next_step.push(host.name)}")
    # The name comes from the host: only ever a key among the known families, never a path.
    name = doc["series"]["name"]
    # (the toolkit's families and the user's own, unless the caller names a folder)
    folder = known_family(name, Path(patches_dir) if patches_dir else None)
    if folder is None:
        raise DeployError(f"{host.name}: the host's journal names a series that is not here: "
                          f"{no_such_family(str(name), Path(patches_dir) if patches_dir else None)}",
                          code=Code.UNKNOWN_FAMILY, hint="smoke it from a checkout that has that family under patches/")
    series = load_family(folder)
    touched, flags = smoke_plan.series_inputs(series)
    deployed = [f["path"] for f in doc["files"]]
    plan = smoke_plan.plan_smoke(settings, touched_paths=deployed or touched, flags=flags, levels=levels,
                            source=host.source, log_path=smoke_plan.host_log_path(host.state_dir, uuid.uuid4().hex[:12]),
                            family=smoke_settings.family_smoke(series))
    report = smoke_run.run_on_host(host, make_transport(), plan, log_dir=log_dir, progress=progress, heartbeat=heartbeat)
    return doc, series, report


# ---------------------------------------------------------------- how a host ended (typed, not from JSON)


def push_kind(outcome: host_push.Outcome, after: AfterPush | None, *, dry_run: bool = False) -> Kind:
    """A push that returned (errors are ``fleet.outcome_of_error``'s).

    A host whose journal ends ``switched`` (files patched, the smoke never passed) is
    never ok: ``failed, NOT rolled back`` when its smoke failed, else ``switched``.
    """
    smoked = after is not None and after.smoked
    phase = after.phase if after is not None and after.phase is not None else outcome.phase
    ok = outcome.ok and (after is None or after.ok)
    if after is not None and after.serve is not None:
        return after.serve.kind()
    if not outcome.changed and not smoked:
        if dry_run and outcome.plan is not None and outcome.plan.changes:
            return Kind.PLANNED
        if not dry_run and phase == Phase.SWITCHED:
            return Kind.SWITCHED
        return Kind.ALREADY if ok else Kind.FAILED_UNCHANGED
    if ok:
        return Kind.PUSHED
    failed_smoke = after is not None and after.report is not None and not after.report.ok
    if failed_smoke and after.rollback is not None:
        return Kind.FAILED_ROLLED_BACK
    if not failed_smoke and phase == Phase.SWITCHED:
        return Kind.SWITCHED
    return Kind.FAILED_NOT_ROLLED_BACK


def push_detail(outcome: host_push.Outcome, after: AfterPush | None, kind: Kind) -> str:
    """One line for the outcome table: the summary, or why a pushed host did not stay deployed."""
    if after is not None and after.serve is not None:
        return f"{outcome.summary}; {after.serve.detail()}"
    if kind is Kind.SWITCHED:
        why = (f"the smoke could not run: {after.error}" if after is not None and after.error
               else f"the smoke passed but marking it deployed failed: {after.mark_error}"
               if after is not None and after.mark_error else "the smoke has not passed")
        return (f"files switched by run {outcome.smoke_pending or outcome.run_id}, not deployed: {why}; "
                f"{next_step.smoke_or_rollback(outcome.host)}")
    bad = after.report.failed if after is not None and after.report is not None else None
    if kind.ok or bad is None:
        return outcome.summary
    why = f"smoke failed at {bad.level}: {bad.detail}"
    if after.rollback is not None:
        return f"{why}; rolled back: {after.rollback.summary}"
    if after.kept:
        return f"{why}; new files KEPT (--no-rollback)"
    return f"{why}; the automatic rollback FAILED: {after.rollback_error}"


def rollback_kind(outcome: host_push.Outcome, *, dry_run: bool = False) -> Kind:
    if outcome.changed:
        return Kind.ROLLED_BACK
    return Kind.PLANNED if dry_run and outcome.plan is not None and outcome.plan.changes else Kind.ALREADY_ROLLED_BACK


def _result(host: str, kind: Kind, doc: dict, message: str, lines: list[str]) -> HostResult:
    return HostResult(host, kind, doc, message, 0 if kind.ok else 1, tuple(lines))


def _plan_lines(outcome: host_push.Outcome) -> list[str]:
    if outcome.plan is None:
        return []
    return [f"  {s.action:<8} {s.path}  {s.state.value}  {(s.current or 'absent')[:12]} -> {(s.want or 'absent')[:12]}"
            for s in outcome.plan.steps]


def _summary_lines(outcome: host_push.Outcome, show_plan: bool) -> list[str]:
    return [f"{outcome.host}: {outcome.summary}"] + (_plan_lines(outcome) if show_plan else []) + _drift_kept(outcome)


def _drift_kept(outcome: host_push.Outcome) -> list[str]:
    """--replace-drifted: the files edited outside ddtree-deploy it replaced, where their bytes
    are kept, and what they held against what the series expects (after the plan)."""
    d = outcome.drifted
    if not d or not d.get("files"):
        return []
    where = f"kept in {d['folder']}" if d.get("folder") else "to be kept in a backup of their own on the host"
    head = f"{outcome.host}: {len(d['files'])} drifted file(s) replaced, their edited bytes {where}"
    return [head + (":" if d.get("diff") else " (no diff: the series for this host did not load)"),
            *(d.get("diff") or "").splitlines()]


def _warn_broken_lock(outcome: host_push.Outcome, listener: Listener) -> None:
    """What the operator must see of a push or rollback that went through: a lock it broke,
    an audit line the host could not write."""
    if outcome.broke_lock:
        listener(Event(EventKind.WARNING, outcome.host, f"broke the lock of run {outcome.broke_lock.get('run_id')} "
                                                       f"({outcome.broke_lock.get('holder')})"))
    if outcome.history_warning:
        # The agent's warning says it ("the audit history was not written: ...").
        listener(Event(EventKind.WARNING, outcome.host, outcome.history_warning))


# ---------------------------------------------------------------- the commands


@dataclass(frozen=True)
class PushOptions:
    family: str | None = None
    dry_run: bool = False
    break_lock: bool = False
    smoke: bool = True  # False: --no-smoke (switch only)
    levels: tuple[str, ...] = ()  # () : the host's [smoke] levels
    auto_rollback: bool = True
    canary: str | None = None
    parallel: int | None = None
    max_failures: int = 0
    log_dir: Any = None  # where a failed launch's server log is copied (tests)
    diff: bool = False  # --diff: each host's unified diff (from its current files) in its result
    replace_drifted: bool = False  # --replace-drifted: drifted files replaced, their bytes kept on the host
    force_driver: bool = False  # --force-driver: push where the host's driver cannot run its release
    analysis: bool = True  # False: --no-analysis (the speed gate skipped, said in the outcome)
    analysis_overrides: tuple = ()  # --analysis KEY=VALUE pairs, laid over each host's [analysis]


def _fleet(command: str, hosts: Sequence[Host], policy: Policy, one: Callable[[Host, Progress], HostResult],
           listener: Listener) -> FleetReport:
    from ddtree_deploy.release import releases

    by_name = {h.name: h for h in hosts}

    def downloading(file, received: int) -> None:
        # The series check fetches a release wheel it needs (once per fleet, before any lock).
        listener(Event(EventKind.DOWNLOAD, "", file.filename, received=received, total=file.size))

    with releases.reporting_downloads(downloading):
        return run_fleet(command, [h.name for h in hosts], policy,
                         lambda name, progress: one(by_name[name], progress), _Relay(listener))


def push_policy_for(hosts: Sequence[Host], options: PushOptions) -> Policy:
    names = [h.name for h in hosts]
    # Hosts that restart their server roll in waves (each waits for its hosts' health).
    waves = any(h.serve for h in hosts)
    policy = push_policy(names, canary=options.canary, parallel=options.parallel, max_failures=options.max_failures,
                         waves=waves)
    if options.dry_run:  # it changes nothing: every host's plan is shown, none waits for a canary
        return spread_policy(names, parallel=options.parallel)
    return policy


def push(hosts: Sequence[Host], connect: Connect, options: PushOptions = PushOptions(), *,
         on_event: Listener = _ignore) -> FleetReport:
    """Lock, check, back up, switch, smoke, then mark deployed or roll back: on every host.

    Bad input (a [smoke] table, --level, --canary, --parallel) raises ``BadInput`` before
    any connection. Anything a host does becomes its ``HostResult``.
    """
    policy = push_policy_for(hosts, options)
    levels = list(options.levels) or None
    # Every host's [smoke] and [serve] tables are checked here, before any connection and for a
    # dry run too (host_check: the check `hosts list` makes), so a typo never surfaces only after
    # the switch. [serve]: the push ends with the server restarted on the new files, healthy,
    # before the host is marked deployed.
    serves = {h.name: check_tables(h, smoke=options.smoke) for h in hosts}
    # [analysis] with the --analysis overrides (the speed gate after the restart): checked here too.
    analyses = {h.name: analysis_settings(h, options.analysis_overrides) for h in hosts}
    for h in hosts:  # [analysis] on a host without [serve] measures nothing: said before anything runs
        unused = unused_analysis(h, options.analysis_overrides) if options.analysis else None
        if unused is not None:
            on_event(Event(EventKind.WARNING, h.name, unused))
    if options.analysis:  # [analysis.load]: its prompt file read now (bad input: exit 2, nothing sent)
        from ddtree_deploy.serve.loadstep import sample_of

        for h in hosts:
            if h.container is None and serves[h.name] is not None:
                sample_of(h, analyses[h.name])
    # Will smoke levels run after the switch? Then the switch journals `switched`, and only a
    # passed smoke makes it `deployed`.
    smokes = {h.name: options.smoke and bool(smoke_plan.choose_levels(smoke_plan.check_settings(h), levels,
                                                                      source=h.source))
              and not options.dry_run for h in hosts}
    # The family, the paths, the shared check: before any connection (and, per host on its first
    # read, the driver check: driver_gate.py).
    want = Want(options.family, force_driver=options.force_driver)

    def one(h: Host, progress: Progress) -> HostResult:
        if h.container is not None:  # [container]: the image is the unit (container_gate)
            return _container_push(h, connect, options, want, serves[h.name], progress, on_event,
                                   analyses[h.name] if options.analysis else None)

        def heartbeat(level: str, seconds: float) -> None:
            what = level if level.startswith("server ") else f"smoke {level}"  # serve_run's: "server health"
            on_event(Event(EventKind.HEARTBEAT, h.name, what, seconds=seconds))

        after: AfterPush | None = None
        # The series is resolved and checked (a release wheel downloaded, if one is needed)
        # before the host's lock is taken; a switch that awaits its smoke comes back with
        # the lock still held, so the smoke, the mark or the rollback follow here in order.
        serve = serves[h.name] if not options.dry_run else None
        speed = analyses[h.name] if serve is not None else None
        baseline = None
        if speed is not None and options.analysis:  # the old server's speed, just before the switch
            from ddtree_deploy.fleets.serve_gate import baseline_before_switch

            baseline = baseline_before_switch(h, serve, speed, connect, partial(want.resolve, h.name),
                                              progress=progress)
        with host_push.begin_push(h, connect(h), want.paths, partial(want.resolve, h.name),
                               dry_run=options.dry_run, break_lock=options.break_lock,
                               smoke=smokes[h.name] or serve is not None, diff=options.diff,
                               replace_drifted=options.replace_drifted, progress=progress) as pushed:
            outcome = pushed.outcome
            if pushed.locked:
                after = after_push(h, lambda: connect(h), outcome, want.chosen[h.name], levels=levels,
                                   auto_rollback=options.auto_rollback, log_dir=options.log_dir, progress=progress,
                                   held=pushed, heartbeat=heartbeat, serve=serve, smoke=options.smoke,
                                   analysis=speed, baseline=baseline, no_analysis=not options.analysis)
        _warn_broken_lock(outcome, on_event)
        doc = outcome.to_json()
        lines = _driver_lines(want, h.name, doc) + _summary_lines(outcome, show_plan=options.dry_run or outcome.changed)
        if outcome.diff:  # --diff: after the plan, before the smoke, as it happened
            lines += outcome.diff.splitlines()
        if not smokes[h.name] and (serve is None or after is None):
            if outcome.changed and not options.dry_run:
                skipped = "--no-smoke" if not options.smoke else "no smoke levels configured"
                doc["smoke_skipped"] = skipped
                lines.append(f"{h.name}: smoke: not run ({skipped}); journal phase {outcome.phase}")
        elif after is not None:
            doc.update(after.to_json(), ok=after.ok)
            lines += [f"{h.name}: {line}" if not line.startswith(" ") else line for line in after.lines()]
        kind = push_kind(outcome, after, dry_run=options.dry_run)
        if serve is not None and after is None and kind is Kind.ALREADY:
            return _ensure_serving(h, serve, connect, outcome, doc, lines, heartbeat, progress)
        result = _result(h.name, kind, doc, push_detail(outcome, after, kind), lines)
        return replace(result, down=bool(after is not None and after.serve is not None and after.serve.down))

    return _fleet("push", hosts, policy, one, on_event)


def rollback(hosts: Sequence[Host], connect: Connect, *, to: str | None = None, dry_run: bool = False,
             break_lock: bool = False, parallel: int | None = None, replace_drifted: bool = False,
             on_event: Listener = _ignore) -> FleetReport:
    """Restore each host's newest backup (or ``to``, one host only) through the verified switch.
    A host with a ``[serve]`` table whose files were switched back restarts its server on
    them and waits for its health (``serve_gate.after_rollback``), under the rollback's own
    lock: no push or restart acts between the switch and the restart."""
    if to is not None and len(hosts) > 1:  # backup ids are per host: one id cannot name a backup on each
        raise BadInput(f"--to {to}: a backup id belongs to one host; give it with a single --host",
                       hint="without --to, each host restores its own newest backup")
    policy = spread_policy([h.name for h in hosts], parallel=parallel)
    serves = _serve_settings(hosts)
    analyses = {h.name: analysis_settings(h) for h in hosts}  # [analysis]: the figures before/after, checked now
    want = _series_or_none(None, on_event) if replace_drifted else None  # what a drifted file's diff is against

    def one(h: Host, progress: Progress) -> HostResult:
        if h.container is not None:  # [container]: the kept image runs again (container_gate)
            return _container_rollback(h, connect, serves[h.name], dry_run, break_lock, progress, on_event)
        # [serve]: a rollback that switched files keeps its lock for the restart on them.
        serve = serves[h.name] if not dry_run else None
        speed = analyses[h.name] if serve is not None else None
        before = None
        if speed is not None:  # the server's figures before the switch back (the history's before/after)
            from ddtree_deploy.fleets.serve_gate import figures_before_rollback

            before = figures_before_rollback(h, serve, speed, connect, progress=progress)
        with host_push.begin_rollback(h, connect(h), to=to, dry_run=dry_run, break_lock=break_lock,
                                   keep_lock=serve is not None, replace_drifted=replace_drifted,
                                   expect=partial(want.expected, h.name) if want else None,
                                   progress=progress) as held:
            outcome = held.outcome
            kind = rollback_kind(outcome, dry_run=dry_run)
            result = _result(h.name, kind, outcome.to_json(), outcome.summary,
                             _summary_lines(outcome, show_plan=dry_run or outcome.changed))
            if held.locked:
                result = _after_rollback(h, serve, held, connect, result, progress, on_event, speed, before)
        _warn_broken_lock(outcome, on_event)
        if outcome.round_trips != result.doc.get("round_trips"):  # the restart's, on the same session
            result = replace(result, doc={**result.doc, "round_trips": outcome.round_trips})
        return result

    return _fleet("rollback", hosts, policy, one, on_event)


def status(hosts: Sequence[Host], connect: Connect, *, family: str | None = None, parallel: int | None = None,
           diff: bool = False, window_s: float = 0.0, on_event: Listener = _ignore) -> FleetReport:
    """Per host: version, phase, series, per-file state, backups, lock, serving processes. Reads only.
    ``diff`` (``status --diff``): each drifted file against what the series expects (drift.py).
    ``window_s`` (``status --window``): a host with ``[serve]`` gets its live DDTree line
    (``live``), its server's figures over that window (0: none)."""
    policy = spread_policy([h.name for h in hosts], parallel=parallel)
    serves = _serve_settings(hosts)  # a broken [serve] table stops here, before any connection
    want = _series_or_none(family, on_event)

    def one(h: Host, progress: Progress) -> HostResult:
        from ddtree_deploy.fleets.serve_gate import serving_of

        if h.container is not None:  # [container]: the container, its image, the sglang inside
            return _container_status(h, connect, want, serves[h.name], progress)
        progress("read state")
        with host_status.reading(h, connect(h), want.paths if want else [], content=diff, driver=True) as read:
            serving = serving_of(h, read)  # over the same connection
            if h.serve and window_s > 0:
                progress(f"the server's figures over {window_s:g} s")
            live = _live(h, read, serving, window_s)
        desired = want.expected(h.name, read.facts) if want else None
        doc = host_status.describe(h.name, read.facts, desired, read.round_trips)
        doc["serving"] = serving
        doc["driver"] = driver_gate.status_of(read.facts)  # its NVIDIA driver and the CUDA lane it allows
        if live is not None:
            doc["live"] = live.to_json()
        # A host that answered is not a host that is fine: what needs a person decides its
        # outcome (and the exit code); `status` says it last.
        journal = read.facts.get("journal") or {}
        restart = journal.get("serve") if isinstance(journal.get("serve"), dict) else None
        doc["attention"] = attention(doc, serve=bool(h.serve), restart=restart)
        lines = _drift_lines(h.name, doc, desired, read.facts) if diff else []
        if not doc["attention"]:
            return _result(h.name, Kind.READ, doc, "", lines)
        return _result(h.name, Kind.ATTENTION, doc, "; ".join(a["detail"] for a in doc["attention"]), lines)

    return _fleet("status", hosts, policy, one, on_event)


def _driver_lines(want: Want, host: str, doc: dict) -> list[str]:
    """A push's driver warning (no nvidia-smi on the host, or --force-driver past a refusal):
    its line first, and in the document as ``driver_warning``."""
    verdict = want.drivers.get(host)
    if verdict is None or verdict.warning is None:
        return []
    doc["driver_warning"] = verdict.warning
    return [verdict.warning]


def _series_or_none(family: str | None, on_event: Listener) -> Want | None:
    """What the series wants, for a command that reads a host whatever the series (status,
    a rollback's diffs): None, said as a warning, when it does not load."""
    try:
        return Want(family)
    except BadInput as exc:
        # A broken series must not hide a host's state: report what the journal knows.
        on_event(Event(EventKind.WARNING, "", f"series not loaded ({exc.message}); per-file states come from "
                                              "the host's journal"))
        return None


def _drift_lines(host: str, doc: dict, desired, facts: dict) -> list[str]:
    """``status --diff``: the drifted files' diffs (also the document's ``diff``), or why none."""
    from ddtree_deploy.session.drift import status_drift_diff

    bad = [f for f in doc["files"] if f["state"] in ("drifted", "missing")]
    if not bad:
        return []
    if desired is None:
        return [f"{host}: {len(bad)} drifted file(s); no diff: the series for this host did not load"]
    text = status_drift_diff(desired, facts, doc["files"])
    doc["diff"] = text
    return [f"{host}: {len(bad)} drifted file(s) against what {desired.series} expects:",
            *text.splitlines()]


# ---------------------------------------------------------------- serving ([serve]: issue 25)
# The work is serve_gate's; here only what needs this module (events, the fleet runner).


def _serve_settings(hosts: Sequence[Host]) -> dict:
    """Every host's ``[serve]`` (None: none), checked before any connection."""
    from ddtree_deploy.fleets.serve_gate import settings_of

    return {h.name: settings_of(h) for h in hosts}


def _live(h: Host, read, serving: dict, window_s: float):
    """status: the host's live DDTree line (serve_gate.live_of), or None."""
    from ddtree_deploy.fleets.serve_gate import live_of

    return live_of(h, read, serving, window_s=window_s)


def _beats(h: Host, on_event: Listener) -> Heartbeat:
    return lambda what, s: on_event(Event(EventKind.HEARTBEAT, h.name, what, seconds=s))


def _after_rollback(h: Host, settings, held: host_push.PushSession, connect: Connect, result: HostResult,
                    progress: Progress, on_event: Listener, analysis=None, before=None) -> HostResult:
    from ddtree_deploy.fleets import serve_gate

    restart = serve_gate.after_rollback(h, settings, held, connect, progress=progress, heartbeat=_beats(h, on_event),
                                        measure=serve_gate.figures_measure(h, connect, settings, analysis),
                                        before=before)
    return serve_gate.restarted_result(result, restart)


def _ensure_serving(h: Host, settings, connect: Connect, outcome: host_push.Outcome, doc: dict, lines: list[str],
                    heartbeat, progress: Progress) -> HostResult:
    from ddtree_deploy.fleets import serve_gate

    return serve_gate.ensure_result(_result(h.name, Kind.ALREADY, doc, outcome.summary, lines), h, settings, connect,
                                    outcome, progress=progress, heartbeat=heartbeat)


# ---------------------------------------------------------------- [container] hosts (issue 32)
# The work is container_gate's: push builds and switches the image, rollback runs the kept one.


def _container_push(h: Host, connect: Connect, options: PushOptions, want: Want, serve, progress: Progress,
                    on_event: Listener, analysis=None) -> HostResult:
    from ddtree_deploy.fleets import container_gate

    return container_gate.push_host(h, connect, want, serve, dry_run=options.dry_run, break_lock=options.break_lock,
                                    progress=progress, heartbeat=_beats(h, on_event), analysis=analysis)


def _container_rollback(h: Host, connect: Connect, serve, dry_run: bool, break_lock: bool, progress: Progress,
                        on_event: Listener) -> HostResult:
    from ddtree_deploy.fleets import container_gate

    return container_gate.rollback_host(h, connect, serve, dry_run=dry_run, break_lock=break_lock,
                                        progress=progress, heartbeat=_beats(h, on_event))


def _container_status(h: Host, connect: Connect, want: Want | None, serve, progress: Progress) -> HostResult:
    from ddtree_deploy.fleets import container_gate

    return container_gate.status_host(h, connect, want, serve, progress=progress)


def restart_policy_for(hosts: Sequence[Host], *, canary: str | None, parallel: int | None,
                       max_failures: int) -> Policy:
    """Restarts roll in waves: the canary alone, then ``parallel`` hosts at a time, each wave
    waiting for its hosts to be healthy; never more than ``parallel`` servers down."""
    return push_policy([h.name for h in hosts], canary=canary, parallel=parallel, max_failures=max_failures,
                       waves=True)


def restart(hosts: Sequence[Host], connect: Connect, *, canary: str | None = None, parallel: int | None = None,
            max_failures: int = 0, break_lock: bool = False, on_event: Listener = _ignore) -> FleetReport:
    """``ddtree-deploy restart``: each host's server through its ``[serve]`` table, under the
    deploy lock, then its health (and the DDTree proof where the journal says DDTree is in
    place), recorded in the journal and the history. Fleets roll in waves (canary first)."""
    from ddtree_deploy.fleets import serve_gate

    for h in hosts:
        refuse_container(h, "restart")
    serves = serve_gate.require_serve(hosts)
    analyses = {h.name: analysis_settings(h) for h in hosts}  # [analysis]: the figures before/after, checked now
    policy = restart_policy_for(hosts, canary=canary, parallel=parallel, max_failures=max_failures)

    def one(h: Host, progress: Progress) -> HostResult:
        result, held = serve_gate.restart_result(h, serves[h.name], connect, break_lock=break_lock,
                                                 progress=progress, heartbeat=_beats(h, on_event),
                                                 analysis=analyses[h.name])
        _warn_broken_lock(held, on_event)
        return result

    return _fleet("restart", hosts, policy, one, on_event)


def smoke_hosts(hosts: Sequence[Host], connect: Connect, *, levels: Sequence[str] | None = None,
                parallel: int | None = None, log_dir=None, on_event: Listener = _ignore) -> FleetReport:
    """``ddtree-deploy smoke`` on every host (``parallel`` at a time; no canary and no stop:
    it changes no file, and each host's result must be known). Every host's ``[smoke]``
    table and ``levels`` are checked before any connection. A host ends ``smoke passed``,
    ``smoke failed`` (a level failed; its report says which), or as its error says (e.g.
    nothing deployed: ``failed, host unchanged``). Its document is the one-host smoke report."""
    levels = list(levels or []) or None
    for h in hosts:
        refuse_container(h, "smoke")
        smoke_plan.choose_levels(smoke_settings.parse_settings(h.smoke, source=h.source), levels, source=h.source)
    policy = spread_policy([h.name for h in hosts], parallel=parallel)

    def one(h: Host, progress: Progress) -> HostResult:
        report = smoke_host(h, lambda: connect(h), levels=levels, log_dir=log_dir, progress=progress,
                            heartbeat=lambda lvl, s: on_event(Event(EventKind.HEARTBEAT, h.name, f"smoke {lvl}",
                                                                    seconds=s)))
        kind = Kind.SMOKE_PASSED if report.ok else Kind.SMOKE_FAILED
        bad = report.failed
        lines = [f"{h.name}: smoke {'passed' if report.ok else 'FAILED'}"] + ["  " + line for line in report.lines()]
        return _result(h.name, kind, report.to_json(), "" if bad is None else f"{bad.level}: {bad.detail}", lines)

    return _fleet("smoke", hosts, policy, one, on_event)


def smoke_one(host: Host, connect: Connect, *, levels: Sequence[str] | None = None,
              on_event: Listener = _ignore) -> smoke_report.SmokeReport:
    """``ddtree-deploy smoke`` on one host (raises its ``DeployError``)."""
    refuse_container(host, "smoke")
    return smoke_host(host, lambda: connect(host), levels=levels or None,
                      progress=lambda step: on_event(Event(EventKind.STEP, host.name, step)),
                      heartbeat=lambda lvl, s: on_event(Event(EventKind.HEARTBEAT, host.name, f"smoke {lvl}",
                                                              seconds=s)))


__all__ = ["AfterPush", "Event", "EventKind", "Listener", "PushOptions", "after_push", "push", "push_detail", "push_policy_for",
           "push_kind", "restart", "restart_policy_for", "rollback", "rollback_kind", "select_hosts",
           "smoke_host", "smoke_hosts", "smoke_one", "status"]
