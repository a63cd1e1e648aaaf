"""The serving step of push, rollback and restart: the new code serving and healthy is the
end of a deploy, not the files on disk.

- ``gate_push``: after a push's switch and smoke, with the deploy lock still held: record
  ``restarting``, restart the server (``serve_run``), wait for its health, prove DDTree
  through ``/server_info`` (the launch smoke's proof, on the real server), record the
  result; only then mark the journal ``deployed``. A server that is not healthy in time
  (or fails the proof) is rolled back: the files (``PushSession.rollback``: ``rollback``'s
  verified switch), then a restart on them, health only, all under the push's lock.
  ``--no-rollback`` keeps the files, the host ``switched``.
- ``after_rollback``: a ``rollback`` that switched files restarts the server the same way,
  under the rollback's lock.
- ``ensure_serving``: a push with nothing to switch still ends with the deployed files
  serving: a server older than them (or not healthy) is restarted.
- ``serving_of`` / ``look``: what ``status`` shows of the serving processes (judged by
  content where the host's history can tell: ``serve_plan.loaded_now``).

Calls go down: rollout -> serve_gate -> deploy, serve_run -> transport.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Callable

from ddtree_deploy.base import next_step
from ddtree_deploy.base.codes import Code, Phase
from ddtree_deploy.base.errors import EXIT_FAILED, BadInput, Changed, DeployError, clause
from ddtree_deploy.base.progress import Heartbeat, Progress, quiet
from ddtree_deploy.fleets.fleet import HostResult, Kind
from ddtree_deploy.remote import inflight
from ddtree_deploy.serve import bake as speed_bake
from ddtree_deploy.serve import loadstep, metrics_run, plan as serve_plan, run as serve_run
from ddtree_deploy.session import push, status
from ddtree_deploy.settings.analysis import AnalysisSettings
from ddtree_deploy.settings.serve import ServeSettings, parse_serve
from ddtree_deploy.settings.smoke import FAMILY_SMOKE_DEFAULT, family_smoke
from ddtree_deploy.tuning.run import bench_module


def settings_of(host) -> ServeSettings | None:
    """The host's ``[serve]`` (None: none), checked: bad input stops here, before any connection."""
    if host.container is not None:  # [container]: [serve] required, without restart (host_check)
        from ddtree_deploy.fleets.host_check import container_serve

        return container_serve(host)
    return parse_serve(host.serve, source=host.source)


@dataclass(frozen=True)
class ServeGate:
    """A push's serving step: the restart on the new files, and what followed it."""

    restart: serve_run.Restart
    marked: bool = False  # healthy and proven: the journal moved to `deployed`
    mark_error: str | None = None
    rollback: push.Outcome | None = None  # the files rolled back after a failed restart
    rollback_error: str | None = None
    again: serve_run.Restart | None = None  # the restart on the rolled-back files
    again_error: str | None = None  # that restart could not run (the connection lost), or its end not be recorded
    kept: bool = False  # --no-rollback: the new files stay, the host `switched`
    interrupted: bool = False
    speed: speed_bake.Bake | None = None  # the speed analysis ([analysis]): the bake after the proof

    @property
    def slower(self) -> bool:
        """Healthy and proven, but the speed analysis did not pass (slower, unproven, or died)."""
        return self.restart.ok and self.speed is not None and not self.speed.ok

    @property
    def ok(self) -> bool:
        return self.restart.ok and self.marked

    @property
    def down(self) -> bool:
        """The host's server is left not healthy (it counts against ``--parallel``)."""
        if self.restart.ok and not self.slower:
            return False
        if self.again is not None:
            return not self.again.ok
        return not self.restart.ok or self.speed.died is not None

    @property
    def unknown(self) -> bool:
        """How the restart ended is not known here (Ctrl-C, a lost link, a missed deadline)."""
        return self.interrupted or self.restart.state == serve_run.UNKNOWN

    def kind(self) -> Kind:
        if self.ok:
            return Kind.PUSHED
        if self.slower and not self.interrupted:  # the speed analysis failed: rolled back, or why not
            return Kind.FAILED_ROLLED_BACK if self.rollback is not None else Kind.FAILED_NOT_ROLLED_BACK
        if self.restart.ok:  # healthy, but the journal could not be marked
            return Kind.SWITCHED
        if self.unknown and self.rollback is None:
            return Kind.FAILED_UNKNOWN
        return Kind.FAILED_ROLLED_BACK if self.rollback is not None else Kind.FAILED_NOT_ROLLED_BACK

    def detail(self) -> str:
        r = self.restart
        if self.ok:
            return r.detail + (f"; {self.speed.line()}" if self.speed is not None else "")
        if self.slower and not self.interrupted:
            return f"speed analysis: {self.speed.why()}; {self._after_failure()}"
        if r.ok:
            return f"server healthy on the new files, but the host is not marked deployed: {self.mark_error}"
        if self.unknown:
            how = "interrupted (Ctrl-C)" if self.interrupted else "UNKNOWN"
            return (f"the server restart's outcome is {how}: {r.detail}; the files are switched (journal phase "
                    f"`switched`: not deployed) and the server may be down or restarting: {next_step.status(r.host)} "
                    f"shows how the restart ended, then {next_step.push_or_rollback(r.host)}")
        return f"server {r.state} after the restart ({r.failed}): {r.detail}; {self._after_failure()}"

    def _after_failure(self) -> str:
        """What followed a failed restart or a failed speed analysis: the rollback, or why none."""
        if self.rollback is not None:
            back = f"rolled back: {self.rollback.summary}"
            if self.again is not None:
                back += f"; restarted on the old files: {'healthy' if self.again.ok else 'NOT healthy'}"
                if not self.again.ok:
                    back += f" ({self.again.failed}: {self.again.detail})"
                if self.again_error:  # it ran, but its end is not in the journal
                    back += f"; {self.again_error}"
            elif self.again_error:
                back += f"; the restart on the old files could not run: {self.again_error}"
            return back
        if self.kept:
            return f"new files KEPT (--no-rollback): {next_step.push_or_rollback(self.restart.host)}"
        return f"the automatic rollback FAILED: {self.rollback_error}"

    def lines(self) -> list[str]:
        out = [self.restart.line()]
        if self.marked:
            out.append("server healthy on the new code: journal marked deployed")
            if self.speed is not None:  # the outcome line: the new figures against the old, promoted
                out.append(self.speed.line())
        elif not self.ok:
            out.append(self.detail())
        if self.again is not None:
            out.append("after the rollback: " + self.again.line())
        return out

    def to_json(self) -> dict:
        return {"restart": self.restart.to_json(), "marked": self.marked, "mark_error": self.mark_error,
                "rolled_back": self.rollback.to_json() if self.rollback is not None else None,
                "rollback_error": self.rollback_error,
                "restart_after_rollback": self.again.to_json() if self.again is not None else None,
                "restart_after_rollback_error": self.again_error, "kept_new_files": self.kept, "down": self.down,
                "analysis": self.speed.to_json() if self.speed is not None else None}


def gate_push(host, settings: ServeSettings, held: push.PushSession, connect: Callable[[Any], Any],
              outcome: push.Outcome, series, *, auto_rollback: bool = True, progress: Progress = quiet,
              heartbeat: Heartbeat | None = None, analysis: AnalysisSettings | None = None,
              baseline: speed_bake.Baseline | None = None, no_analysis: bool = False) -> ServeGate:
    """Restart, health, proof, [the speed analysis], then mark ``deployed`` through ``held``
    (the push's session, holding the lock); or roll back and restart on the old files, under
    that same lock (released when the session is left): no other run acts on the host in
    between. See the module doc.

    ``analysis`` (the host's ``[analysis]`` with the overrides): after the proof the new
    server bakes and is judged against ``baseline`` (sampled before the switch; where it is
    missing or idle, the baseline this run recorded before an interrupted bake, or the last
    promoted deploy's, from the host's history). A failed, unproven or dead bake rolls back
    through the same path as an unhealthy restart (cause ``analysis``). ``no_analysis``
    (``--no-analysis``): skipped, and said."""
    files = list(series.touched_paths()) if series is not None else []
    family = family_smoke(series) if series is not None else FAMILY_SMOKE_DEFAULT
    run_id = held.run_id or outcome.run_id
    if analysis is not None and not no_analysis:
        baseline = _settled_baseline(held, run_id, baseline, progress)
    restart, unrecorded = serve_run.restart_held(host, connect, settings, held, run_id, files,
                                                 proof=serve_plan.proof_spec(settings, family), progress=progress,
                                                 heartbeat=heartbeat)
    if unrecorded is not None and restart.ok:
        return ServeGate(restart, mark_error=clause(unrecorded, host.name))
    if restart.ok:
        speed = None
        if no_analysis and analysis is not None:
            speed = speed_bake.skipped()
        elif analysis is not None:
            try:
                sample = metrics_run.sampler(host, connect, url=settings.url, release=outcome.sglang_version,
                                             load=_bake_load(host, settings, analysis, baseline))
                speed = speed_bake.bake(sample, analysis, baseline, progress=progress)
            except DeployError as exc:
                if inflight.cancelled.is_set():  # Ctrl-C under the bake: switched, healthy, not promoted
                    return ServeGate(restart, interrupted=True,
                                     mark_error="the speed analysis was interrupted (Ctrl-C): the new server serves, "
                                                f"not promoted; {next_step.push(host.name)} bakes it again",
                                     speed=speed_bake.Bake(baseline))
                if isinstance(exc, (loadstep.LoadFailed, BadInput)):  # the load, not the server: not judged
                    speed = speed_bake.Bake(baseline, load_failed=clause(exc, host.name))
                else:
                    speed = speed_bake.Bake(baseline, died=f"its figures could not be read: {clause(exc, host.name)}")
        # The verdict's history line is written once its outcome is the host's: after the mark
        # (promoted: `deployed`), after the rollback (`rolled-back`), or now (kept: `switched`),
        # so the phase it shows is the one the host is in from that line on.
        if speed is None or speed.ok:
            try:
                held.mark(Phase.DEPLOYED, speed=speed.record() if speed is not None else None)
            except DeployError as exc:
                return ServeGate(restart, mark_error=clause(exc, host.name), speed=speed)
            return ServeGate(restart, marked=True, speed=speed)
        if not auto_rollback:
            _record_verdict(held, speed)
            return ServeGate(restart, kept=True, speed=speed)
        progress(f"speed analysis failed ({speed.cause}): rolling back to backup {outcome.backup_id}")
        why = push.automatic_cause(run_id, "analysis", speed.cause, speed.why())
        gate = _roll_back(host, settings, held, connect, outcome, files, restart, why, progress, heartbeat,
                          speed=speed)
        _record_verdict(held, speed)
        return gate
    if restart.failed == "interrupted" or inflight.cancelled.is_set():
        return ServeGate(restart, interrupted=True)
    if restart.state == serve_run.UNKNOWN:
        # Nobody knows how the server is (the link to the serve program was lost, or it missed
        # its deadline): rolling back would be a guess, and the serve program goes on alone
        # and records the restart's end itself (status shows it).
        return ServeGate(restart)
    if not auto_rollback:
        return ServeGate(restart, kept=True)
    progress(f"server {restart.state} after the restart ({restart.failed}): rolling back to backup "
             f"{outcome.backup_id}")
    why = push.automatic_cause(run_id, "serve", restart.failed, restart.detail)
    return _roll_back(host, settings, held, connect, outcome, files, restart, why, progress, heartbeat)


def _record_verdict(held: push.PushSession, speed: speed_bake.Bake) -> None:
    """The bake's verdict in the history (a ``speed`` line), under the push's lock while it holds
    it; a line that cannot be written is a history warning, never the push's failure."""
    try:
        warning = held.record_speed(speed.record())
    except DeployError as exc:
        warning = f"the speed verdict was not recorded in the history: {exc.message}"
    held.outcome.history_warning = held.outcome.history_warning or warning


def _roll_back(host, settings: ServeSettings, held: push.PushSession, connect: Callable[[Any], Any],
               outcome: push.Outcome, files: list[str], restart: serve_run.Restart, why: dict, progress: Progress,
               heartbeat: Heartbeat | None, *, speed: speed_bake.Bake | None = None) -> ServeGate:
    """The push's own rollback under its lock (``why``: ``automatic_cause``'s), then the
    server restarted on the old files (health only): the one path an unhealthy restart and a
    failed speed analysis share."""
    try:
        undone = held.rollback(outcome.backup_id, progress=progress, automatic=why)
    except DeployError as exc:
        return ServeGate(restart, rollback_error=clause(exc, host.name), speed=speed)
    progress("restart on the old files")
    try:
        again, unrecorded = serve_run.restart_held(host, connect, settings, held, undone.run_id, files, proof=None,
                                                   progress=progress, heartbeat=heartbeat)
    except DeployError as exc:
        return ServeGate(restart, rollback=undone, again_error=clause(exc, host.name), speed=speed)
    return ServeGate(restart, rollback=undone, again=again, speed=speed,
                     again_error=None if unrecorded is None else clause(unrecorded, host.name))


# ---------------------------------------------------------------- the speed analysis' measurements


def baseline_before_switch(host, settings: ServeSettings, analysis: AnalysisSettings, connect: Callable[[Any], Any],
                           resolve: Callable[[dict], Any], *, progress: Progress = quiet) -> speed_bake.Baseline | None:
    """The old server's windows, sampled just before a push takes the lock and switches
    (``bake.measure_baseline``). None when this push will switch nothing: the host's journal
    already holds the series ``resolve`` (facts -> ``Desired``) wants, deployed; or its files
    are switched and await their promotion (the new code serves: that run's own baseline, in
    the history, is the one). One read-only round trip decides, and it runs the push's own
    checks first (``resolve``: the driver check, then the series' choice and check), so a push
    they refuse is refused here, in the same words, before a second of measuring. With
    ``[analysis.load]`` one short window decides whether the load step drives the old server
    (``_load_plan``)."""
    progress("read state (for the speed baseline)")
    try:
        with status.reading(host, connect(host), [], driver=True) as read:
            facts = read.facts
    except DeployError as exc:  # read-only: nothing was changed
        raise exc.known(changed=Changed.NO, step="read state") from exc
    journal = facts.get("journal") or {}
    if journal.get("phase") == Phase.SWITCHED:
        return None  # the push finishes that run: its checks are its own, and nothing is measured here
    progress("check the driver + resolve + check the series (before the baseline)")
    desired = resolve(facts)  # a refusal (driver, series) ends the push here: nothing measured, nothing changed
    if journal.get("phase") == Phase.DEPLOYED and desired.series_id == journal.get("series_id"):
        return None
    release = facts.get("sglang_version")
    try:
        plan, not_driven = _load_plan(host, settings, analysis, connect, release, progress)
        sample = metrics_run.sampler(host, connect, url=settings.url, release=release, load=plan)
        baseline = speed_bake.measure_baseline(sample, analysis, progress=progress, load=plan, not_driven=not_driven)
    except DeployError as exc:  # the scrape (or the load step) could not run: before the lock, nothing was changed
        raise exc.known(changed=Changed.NO, step="speed baseline") from exc
    bare = speed_bake.without_metrics(baseline.windows)
    if bare is not None:  # the new server, launched the same way, could not be judged either
        raise DeployError(f"{host.name}: the speed analysis ([analysis]) cannot measure this server: {bare.why}; "
                          "nothing was changed", code=Code.FAILED_UNCHANGED,
                          hint=f"{bare.hint or 'launch the server with --enable-metrics'}, or push with --no-analysis")
    return baseline


def _load_plan(host, settings: ServeSettings, analysis: AnalysisSettings, connect: Callable[[Any], Any],
               release: str | None, progress: Progress) -> tuple[loadstep.Plan | None, str | None]:
    """The load step (``[analysis.load]``) for this push's baseline, decided on one short window
    of the old server (``loadstep.decide``): (the plan, None) to drive it; (None, why not)
    where the table has one and it is not run; (None, None) without one."""
    if analysis.load is None:
        return None, None
    sample = loadstep.sample_of(host, analysis)
    progress("load step: is the old server idle? (one window)")
    window, files = metrics_run.probe(host, connect, url=settings.url, release=release, interval_s=analysis.interval_s)
    decision = loadstep.decide(analysis.load, window)
    progress(f"load step: {decision.why}")
    if not decision.drive:
        return None, decision.why
    module = bench_module([path for path, there in files.items() if there])
    return loadstep.plan(analysis.load, sample, url=settings.url, module=module, why=decision.why), None


def _bake_load(host, settings: ServeSettings, analysis: AnalysisSettings,
               baseline: speed_bake.Baseline | None) -> loadstep.Plan | None:
    """The bake is driven exactly as its baseline was: this run's plan, or (a rerun after
    Ctrl-C, a recorded baseline) the same load rebuilt from the baseline's record."""
    if baseline is None or baseline.load is None:
        return None
    if baseline.plan is not None:
        return baseline.plan
    return loadstep.from_record(baseline.load, analysis.load, loadstep.sample_of(host, analysis), url=settings.url)


def _settled_baseline(held: push.PushSession, run_id: str | None, baseline: speed_bake.Baseline | None,
                      progress: Progress) -> speed_bake.Baseline:
    """The baseline the bake is judged against, under the push's lock: the live one sampled
    before the switch (recorded now, so that a rerun after Ctrl-C finds it); else the one
    this run recorded before an interrupted bake; else the last promoted deploy's; else NONE."""
    if baseline is not None and baseline.source == speed_bake.LIVE:
        try:
            warning = held.record_speed({"stage": "baseline", "push_run": run_id, "baseline": baseline.to_json()})
            held.outcome.history_warning = held.outcome.history_warning or warning
        except DeployError as exc:
            progress(f"the speed baseline could not be recorded: {exc.message}")
        return baseline
    try:
        entries = held.history()
    except DeployError:
        entries = []
    found = speed_bake.pending_baseline(entries, run_id) or speed_bake.recorded_baseline(entries)
    if found is not None:
        return found
    return baseline or speed_bake.Baseline((), speed_bake.NONE, "no baseline: the old server was not sampled and "
                                                                "the history holds no promoted deploy's figures")


def after_rollback(host, settings: ServeSettings, held: push.PushSession, connect: Callable[[Any], Any], *,
                   progress: Progress = quiet, heartbeat: Heartbeat | None = None,
                   measure: Callable[[str | None], Any] | None = None, before: Any = None) -> serve_run.Restart:
    """``rollback`` switched files back and still holds the lock (``held``,
    ``push.begin_rollback``): restart the server on them under it (health only: the files
    are SGLang's own again). A restart whose end could not be recorded raises that error.
    ``measure`` (``[analysis]``): the figures after the restart, recorded in the history
    with ``before`` (the window the caller took before the rollback's switch)."""
    progress("restart the server")
    journal_files = [s.path for s in held.outcome.plan.steps] if held.outcome.plan else []
    restart, unrecorded = serve_run.restart_held(host, connect, settings, held, held.outcome.run_id, journal_files,
                                                 proof=None, progress=progress, heartbeat=heartbeat)
    if unrecorded is not None:
        raise unrecorded
    if measure is not None and restart.ok:
        after = serve_run.measure_quietly(measure, held.outcome.sglang_version, progress, "after the rollback",
                                          restarted=True)
        restart = replace(restart, speed=serve_run.record_around(held, before, after, progress))
    return restart


def figures_measure(host, connect: Callable[[Any], Any], settings: ServeSettings,
                    analysis: AnalysisSettings | None) -> Callable[[str | None, bool], Any] | None:
    """With ``[analysis]``: (release, restarted) -> one window of ``interval_s`` of the host's
    server (the figures before/after a restart or a rollback, for the history); else None
    (none taken). After a restart (``restarted``) the window is the second of two: a server
    restarted a moment ago averages its gauges from zero in the first (the stand-in's first
    window after a restart read half its accept length)."""
    if analysis is None:
        return None

    def measure(release: str | None, restarted: bool):
        sample = metrics_run.sampler(host, connect, url=settings.url, release=release)
        return sample(analysis.interval_s, 3 if restarted else 2)[-1]
    return measure


def figures_before_rollback(host, settings: ServeSettings | None, analysis: AnalysisSettings | None,
                            connect: Callable[[Any], Any], *, progress: Progress = quiet) -> Any:
    """The server's figures just before a rollback switches (``[analysis]`` and ``[serve]``), or None."""
    measure = figures_measure(host, connect, settings, analysis) if settings is not None else None
    if measure is None:
        return None
    with status.reading(host, connect(host), []) as read:
        release = read.facts.get("sglang_version")
    return serve_run.measure_quietly(measure, release, progress, "before the rollback", restarted=False)


def ensure_serving(host, settings: ServeSettings, connect: Callable[[Any], Any], files, *,
                   progress: Progress = quiet, heartbeat: Heartbeat | None = None) -> tuple[str, serve_run.Restart | None]:
    """A push that switched nothing: restart the server if it runs other bytes than the
    deployed files (or is not healthy). -> (what was found, the restart or None)."""
    progress("check the serving processes")
    transport = connect(host)
    with transport:
        found = look(host, transport, files, settings, lambda request: status.ask(host, transport, request))
    healthy = (found.get("health") or {}).get("status") == 200
    if found["state"] == serve_plan.CURRENT and healthy:
        return found["explanation"], None
    why = found["explanation"] if found["state"] != serve_plan.CURRENT else "the server is not healthy"
    restart, _held = serve_run.restart_locked(host, connect, settings, prove=True, progress=progress,
                                              heartbeat=heartbeat)
    return why, restart


def look(host, transport, files, settings: ServeSettings | None, ask: Callable[[dict], dict]) -> dict:
    """The serving processes (``serve_plan.serving``) over an open ``transport``: the serve
    program's discovery and, when a process started before the last change of ``files``, the
    host's record of the switches since (``ask``: one read-only agent request), so that a
    server the files were switched back to is not called stale."""
    answer = serve_run.check(host, transport, serve_plan.check_request(host.python, files, settings))
    since = serve_plan.record_since(answer)
    record = None
    if since is not None:
        try:
            record = ask(serve_plan.switches_request(since, files))
        except DeployError as exc:  # said in the sentence; the times decide
            record = {"error": clause(exc, host.name)}
    return serve_plan.serving(answer, host.name, serve=settings is not None, record=record)


# ---------------------------------------------------------------- a host's result (fleet.HostResult)


def require_serve(hosts) -> dict:
    """``restart``: every host's ``[serve]``; a host without one is bad input (before any connection)."""
    serves = {h.name: settings_of(h) for h in hosts}
    for h in hosts:
        if serves[h.name] is None:
            raise BadInput(f"{h.source or h.name}: serve: no [serve] table: nothing says how this host's server "
                           "restarts", hint='add [serve] with restart = ["...", ...] and url = '
                           '"http://127.0.0.1:PORT" (docs/serving.md)')
    return serves


def _lines(host: str, restart: serve_run.Restart) -> tuple[str, ...]:
    said = (f"{host}: {restart.line()}",)
    if restart.speed and restart.speed.get("line"):  # [analysis]: the figures after, against before
        said += (f"{host}: serving {restart.speed['line']}",)
    return said


def unhealthy_next(host: str, phase: str | None) -> str:
    """What to do about a server left not healthy by a restart, by what the files are (the
    journal's phase): the next step a failed `restart` (or a rollback's restart) names."""
    if phase == Phase.SWITCHED:
        return (f"the files are a push's whose server never passed its restart: {next_step.rollback(host)} puts "
                f"the old code back, or fix the server and run {next_step.push(host)}")
    if phase == Phase.DEPLOYED:
        return (f"these files served healthy before: look at the server's own log; {next_step.rollback(host)} "
                f"puts the old code back, {next_step.restart(host)} tries again")
    return (f"the files are SGLang's own: look at the server's own log and the [serve] restart command; "
            f"{next_step.restart(host)} tries again")


def _unhealthy(result: HostResult, restart: serve_run.Restart, phase: str | None) -> HostResult:
    """``result`` as a host whose server a restart left not healthy: said, with the next step."""
    said = f"{restart.line()}; {unhealthy_next(result.host, phase)}"
    return replace(result, kind=Kind.UNHEALTHY, doc={**result.doc, "ok": False}, exit_code=EXIT_FAILED, down=True,
                   message=f"{result.message}; {said}" if result.message else said,
                   lines=result.lines + (f"{result.host}: next: {unhealthy_next(result.host, phase)}",))


def restarted_result(result: HostResult, restart: serve_run.Restart) -> HostResult:
    """A host's result after its server was restarted (a rollback's, or a push with nothing to
    switch): as it was when healthy, else ``server NOT healthy`` (and down) with the next step."""
    doc = {**result.doc, "serve": {"restart": restart.to_json(), "down": not restart.ok}}
    lines = result.lines + _lines(result.host, restart)
    result = replace(result, doc=doc, lines=lines)
    return result if restart.ok else _unhealthy(result, restart, result.doc.get("phase"))


def ensure_result(result: HostResult, host, settings: ServeSettings, connect: Callable[[Any], Any],
                  outcome: push.Outcome, *, progress: Progress = quiet,
                  heartbeat: Heartbeat | None = None) -> HostResult:
    """A push with nothing to switch on a deployed host (``result``): the server must run these files."""
    files = [f["path"] for f in ((outcome.plan.to_json() if outcome.plan else {}).get("files") or ())]
    why, restart = ensure_serving(host, settings, connect, files, progress=progress, heartbeat=heartbeat)
    result = replace(result, lines=result.lines + (f"{host.name}: server: {why}",))
    if restart is None:
        return replace(result, doc={**result.doc, "serve": {"restart": None, "serving": why, "down": False}})
    return restarted_result(result, restart)


def restart_result(host, settings: ServeSettings, connect: Callable[[Any], Any], *, break_lock: bool = False,
                   progress: Progress = quiet, heartbeat: Heartbeat | None = None,
                   analysis: AnalysisSettings | None = None) -> tuple[HostResult, push.Outcome]:
    """``restart`` on one host: (its result, the lock session's outcome: a broken lock, a history
    warning). With ``analysis`` (``[analysis]``) the figures before and after go to the history."""
    restart, held = serve_run.restart_locked(host, connect, settings, break_lock=break_lock, progress=progress,
                                             heartbeat=heartbeat,
                                             measure=figures_measure(host, connect, settings, analysis))
    doc = {"host": host.name, "command": "restart", "run_id": held.run_id, "ok": restart.ok, "phase": held.phase,
           "restart": restart.to_json()}
    result = HostResult(host.name, Kind.RESTARTED, doc, "", 0, _lines(host.name, restart))
    return (result if restart.ok else _unhealthy(result, restart, held.phase)), held


def serving_of(host, read: status.Reading) -> dict:
    """``status``: the serving processes over the status connection (``look``, asking the
    history on ``read``'s session); a failure to look is said in the document, never fatal."""
    files = list(((read.facts.get("journal") or {}).get("files") or {}))
    try:
        return look(host, read.transport, files, settings_of(host), read.ask)
    except DeployError as exc:
        return {"state": "unknown", "processes": [], "files_changed": None, "newest_file": None, "health": None,
                "explanation": f"could not look at the serving processes: {clause(exc, host.name)}",
                "unreadable": 0}


def live_of(host, read: status.Reading, serving: dict, *, window_s: float):
    """``status``'s live DDTree line (``serve/live.py``) over the status connection: two scrapes
    of the server's ``/metrics`` ``window_s`` apart (read-only on the host, no lock), and since
    when it runs its code. None: the host has no ``[serve]`` (nothing says where its server
    listens) or ``window_s`` is 0 (``--window 0``). A failure to scrape is said in the line,
    never fatal: status reads the host whatever its server does."""
    from ddtree_deploy.release.metric_names import names_for
    from ddtree_deploy.serve import live, metrics_run
    from ddtree_deploy.serve.figures import Unavailable

    settings = settings_of(host)
    if settings is None or window_s <= 0:
        return None
    journal = read.facts.get("journal") or {}
    release = read.facts.get("sglang_version") or journal.get("sglang_version")
    try:
        if not release:
            raise BadInput("the host's SGLang version is not known: no pinned metric names to read")
        names_for(release)  # an unpinned release is said, not scraped with guessed names
        figures = metrics_run.served_figures(host, read.transport, url=settings.url, release=release,
                                             window_s=window_s)
    except DeployError as exc:
        figures = Unavailable(f"the server's figures could not be read: {clause(exc, host.name)}")
    return live.Live(window_s=window_s, figures=figures, since=live.since_of(serving, journal), url=settings.url)


__all__ = ["ServeGate", "after_rollback", "baseline_before_switch", "ensure_result", "ensure_serving",
           "figures_before_rollback", "figures_measure", "gate_push", "live_of", "look", "require_serve",
           "restart_result", "restarted_result", "serving_of", "settings_of", "unhealthy_next"]
