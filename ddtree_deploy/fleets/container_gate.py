"""A ``[container]`` host's push, rollback and status: the image is the unit of rollback.

push: inspect the container (engine, container, sglang inside, the host's NVIDIA driver:
refusals before any change) -> the driver check (session/driver_gate.py: the host's driver
against the CUDA of the image the container runs) -> the series checked against the image's
release (the family by its version) -> under the deploy lock: build the patched image on
the host FROM the image before the series (tagged and kept) with ``ddtree-deploy image``'s
own context, its CUDA label the running image's -> switch (the old container stopped and
kept aside, a twin with the same run configuration created from the new image and started)
-> health + DDTree proof on the real server -> [the speed analysis: ``analysis_gate``,
against ``analysis_baseline`` taken before the switch] -> keep (the aside removed, journal
``deployed``). A failure at any step after the switch puts the
old container back (the same container, so the same configuration) and waits for its health.

rollback: the same switch to the kept previous image, health only, keep (``rolled-back``); an
interrupted run's switch is undone instead. status: ``container_plan.describe``.

Calls go down: rollout -> container_gate -> containers (session, plan, context) -> transport.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Callable

from ddtree_deploy.base import hooks, next_step
from ddtree_deploy.base.codes import Phase
from ddtree_deploy.base.errors import BadInput, DeployError, clause
from ddtree_deploy.base.progress import Heartbeat, Progress, quiet
from ddtree_deploy.containers import plan as cplan
from ddtree_deploy.containers.session import SWITCH_S, ContainerSession, context_request
from ddtree_deploy.containers.image_context import context_files
from ddtree_deploy.fleets.fleet import HostResult, Kind
from ddtree_deploy.hostprog.engine_cli import built_tag, kept_tag
from ddtree_deploy.release.cuda_lanes import image_cuda
from ddtree_deploy.remote import inflight
from ddtree_deploy.serve import metrics_run, plan as serve_plan
from ddtree_deploy.serve.bake import NONE, Bake, Baseline, bake, measure_baseline
from ddtree_deploy.session import driver_gate
from ddtree_deploy.session.agent_link import holder_name, new_run_id
from ddtree_deploy.session.driver_gate import ImageCuda
from ddtree_deploy.session.push import automatic_cause
from ddtree_deploy.session.desired import Want
from ddtree_deploy.settings.analysis import AnalysisSettings
from ddtree_deploy.settings.serve import ServeSettings
from ddtree_deploy.settings.smoke import family_smoke

Connect = Callable[[Any], Any]
VERIFY_SLACK_S = 120.0


def analysis_baseline(host, serve: ServeSettings, *, analysis: AnalysisSettings | None = None,
                      connect: Connect | None = None, release: str | None = None,
                      progress: Progress = quiet) -> Baseline | None:
    """The speed gate's baseline: the OLD container's served figures, measured before the switch
    (issue 29, the same bake as a [serve] host's: ``bake.measure_baseline`` through the serve
    program's scrape of ``serve.url`` from the host). None: no ``[analysis]`` (or
    ``--no-analysis``). A baseline that cannot be read is one of source ``none``, said in the
    verdict (inconclusive: the push is not promoted on an unmeasured speed)."""
    if analysis is None or connect is None:
        return None
    not_driven = None
    if analysis.load is not None:  # said, not silently ignored
        not_driven = ("the load step is not run on a [container] host: SGLang's benchmark would run with the "
                      "host's interpreter, which has not the container's SGLang")
        progress(f"load step: {not_driven}")
    try:
        sample = metrics_run.sampler(host, connect, url=serve.url, release=release)
        return measure_baseline(sample, analysis, progress=progress, not_driven=not_driven)
    except DeployError as exc:
        if inflight.cancelled.is_set():
            raise
        return Baseline((), NONE, f"the old container's figures could not be read: {clause(exc, host.name)}")


def analysis_gate(host, serve: ServeSettings, baseline: Baseline | None, verified: dict, *,
                  analysis: AnalysisSettings | None = None, connect: Connect | None = None,
                  release: str | None = None, progress: Progress = quiet) -> tuple[str | None, Bake | None]:
    """THE SPEED ANALYSIS of a container push, between its proof and its keep (issue 29).

    The new container bakes (``bake.bake``) against ``baseline`` (``analysis_baseline``'s; a
    finishing run, whose old container is aside, has none: inconclusive, so it is not kept on
    an unmeasured speed). -> (a failure as one line (the caller puts the old container back,
    cause ``analysis``) or None when it passes, the bake for the history: ``record_verdict``);
    (None, None) when no ``[analysis]`` asks for it."""
    if analysis is None or connect is None:
        return None, None
    baseline = baseline or Baseline((), NONE, "no baseline: this run did not sample the old container")
    try:
        sample = metrics_run.sampler(host, connect, url=serve.url, release=release)
        speed = bake(sample, analysis, baseline, progress=progress)
    except DeployError as exc:
        if inflight.cancelled.is_set():
            raise
        speed = Bake(baseline, died=f"the new container's figures could not be read: {clause(exc, host.name)}")
        return speed.died, speed
    verified["analysis"] = speed.to_json()
    return (None if speed.ok else speed.why()), speed


def record_verdict(h, session: ContainerSession, speed: Bake | None, lines: list[str]) -> None:
    """The bake's verdict as the host's history ``speed`` line, as a [serve] host's push writes
    it (``Bake.record``, the program's ``speed`` op: history.py's, shared with the agent), once
    the outcome is the container's (kept: ``deployed``; put back: ``rolled-back``), under the
    push's lock. A line that cannot be written is said, never the push's failure."""
    if speed is None:
        return
    try:
        said = session.call({"op": "speed", "speed": speed.record()})
        warning = said.get("history_warning")
    except DeployError as exc:
        warning = f"the speed verdict was not recorded in the history: {clause(exc, h.name)}"
    if warning:
        lines.append(f"{h.name}: warning: {warning}")


def _result(host: str, kind: Kind, doc: dict, message: str, lines: list[str], exc: DeployError | None = None
            ) -> HostResult:
    code = 0 if kind.ok else (exc.exit_code if exc is not None else 1)
    return HostResult(host, kind, doc, message, code, tuple(lines), hint=exc.hint if exc else None, error=exc)


def _open(h, connect: Connect, session_steps: Callable[[ContainerSession], HostResult]) -> HostResult:
    transport = connect(h)
    with transport, ContainerSession(transport, h, h.container) as session:
        init = {"op": "init", "state_dir": h.state_dir, "container": h.container.to_request()}
        if hooks.hooks():  # a test's faults (base/hooks.py): the container program's exit_after_rename
            init["hooks"] = hooks.hooks()
        session.call(init)
        return session_steps(session)


def _inspect(session: ContainerSession, paths: list[str], serve: ServeSettings | None, *,
             driver: bool = False) -> dict:
    """The container program's read-only look; ``driver``: with the HOST's NVIDIA driver
    (nvidia-smi run by the program on the host, never inside the container)."""
    request = {"op": "inspect", "paths": paths, "health_url": serve.health_url if serve else None}
    if driver:
        request["driver"] = True
    return session.call(request)


def image_of(answer: dict, release: str | None) -> ImageCuda:
    """The image the container runs and its CUDA (cuda_lanes.image_cuda: its CUDA_VERSION, its
    CUDA label, its tag, else the release's lane): what the host's driver must run."""
    container = answer.get("container") or {}
    image = answer.get("image") or {}
    ref = str(container.get("image_ref") or (image.get("tags") or ["?"])[0])
    cuda, source = image_cuda(image, ref, release)
    return ImageCuda(ref, cuda, source)


# ---------------------------------------------------------------- status


def status_host(h, connect: Connect, want: Want | None, serve: ServeSettings | None, *,
                progress: Progress = quiet) -> HostResult:
    def steps(session: ContainerSession) -> HostResult:
        answer = _inspect(session, want.paths if want else [], serve, driver=True)
        desired = None
        found = (answer.get("probe") or {}).get("sglang") or {}
        if want is not None and found.get("version"):
            desired = want.expected(h.name, {"sglang_version": found["version"], "package_root": found["package_root"],
                                              "files": {}})
        doc = cplan.describe(h.name, answer, h.container, desired)
        # The host's driver and the CUDA of the image its container runs (a container present).
        image = image_of(answer, found.get("version")) if answer.get("container") else None
        doc["driver"] = driver_gate.status_of({"driver": answer.get("driver"), "sglang_version": found.get("version")},
                                              image)
        doc["round_trips"] = session.round_trips
        kind = Kind.ATTENTION if doc["attention"] else Kind.READ
        return _result(h.name, kind, doc, "; ".join(a["detail"] for a in doc["attention"]), [])

    progress("read the container's state")
    return _open(h, connect, steps)


# ---------------------------------------------------------------- push


def push_host(h, connect: Connect, want: Want, serve: ServeSettings, *, dry_run: bool = False,
              break_lock: bool = False, progress: Progress = quiet,
              heartbeat: Heartbeat | None = None, analysis: AnalysisSettings | None = None) -> HostResult:
    """One container host's push (see the module doc). Raises the refusals (no container, not
    SGLang, no engine, a driver that cannot run the image's CUDA, a release no family covers)
    before any change."""
    s = h.container
    warned: list[str] = []  # the driver check's warning line (no nvidia-smi, --force-driver)

    def steps(session: ContainerSession) -> HostResult:
        progress("inspect the container")
        answer = _inspect(session, want.paths, serve, driver=True)
        journal = answer.get("journal") or {}
        if journal.get("phase") not in (Phase.SWITCHING, Phase.SWITCHED):
            cplan.require_container(h.name, answer, s)
        found = cplan.sglang_of(h.name, answer, s) if answer.get("container") else \
            {"version": journal.get("sglang_version"), "package_root": None}
        facts = {"sglang_version": found["version"], "package_root": found["package_root"], "files": {}}
        # The driver check, before the series is chosen: the HOST's driver against the CUDA
        # of the image the container runs (refused: BadInput, exit 2, nothing changed).
        progress("check the host's driver against the image's CUDA")
        verdict = driver_gate.check(h.name, {"driver": answer.get("driver"), "sglang_version": found["version"]},
                                    force=want.force_driver, image=image_of(answer, found["version"]))
        if verdict.warning:
            warned.append(verdict.warning)
        progress("resolve + check the series")
        try:
            series = want.series_for(facts)
        except BadInput as exc:
            raise cplan.uncovered(h.name, found["version"], exc) from None
        desired = want.resolve(h.name, facts)
        plan = cplan.plan_push(h.name, answer, desired)
        doc = {"host": h.name, "kind": "container", "command": "push", "series": desired.series,
               "series_id": desired.series_id, "sglang_version": desired.sglang_version, "plan": plan.action,
               "reason": plan.reason, "container": answer.get("container"), "image": answer.get("image")}
        run_id = _lock_unless_done(h, session, "push", doc, Kind.ALREADY if plan.action == "already" else None,
                                   plan.reason, dry_run=dry_run, break_lock=break_lock, progress=progress)
        if isinstance(run_id, HostResult):
            return run_id
        lines: list[str] = []
        if plan.action == "undo-first":
            progress("put the old container back (an earlier run stopped mid-switch)")
            undone = session.call({"op": "restore", "run_id": run_id, "command": "push"}, timeout_s=SWITCH_S)
            lines.append(f"{h.name}: {plan.reason}: {undone['how']}")
            answer = _inspect(session, want.paths, serve)
            plan = cplan.plan_push(h.name, answer, desired)
            if plan.action == "already":
                return _result(h.name, Kind.ALREADY, doc, plan.reason, lines + [f"{h.name}: {plan.reason}"])
        speed = (analysis, connect) if analysis is not None else None
        return _push_steps(h, session, serve, series, desired, plan, answer, run_id, doc, lines, progress, heartbeat,
                           speed)

    result = _open(h, connect, steps)
    if warned:  # said first, and in the document, as a venv host's push says it (rollout._driver_lines)
        result.doc["driver_warning"] = warned[0]
        result = replace(result, lines=(warned[0], *result.lines))
    return result


def _push_steps(h, session: ContainerSession, serve: ServeSettings, series, desired, plan: cplan.PushPlan,
                answer: dict, run_id: str, doc: dict, lines: list[str], progress: Progress,
                heartbeat: Heartbeat | None, speed: tuple | None = None) -> HostResult:
    s = h.container
    analysis, connect = speed if speed is not None else (None, None)
    if plan.action == "build":
        kept = kept_tag(s.name, plan.base)
        tag = built_tag(s.name, desired.series_id, run_id)
        # The build keeps the image's CUDA on what it builds (its label: what a driver must run),
        # read from the image itself: the kept tag FROM which it builds names no CUDA.
        image = image_of(answer, desired.sglang_version)
        files, _labels = context_files(series, desired, kept, python=s.python, cuda=(image.cuda, image.source))
        progress(f"build the image FROM {kept}")
        built = session.call(context_request(run_id, files, base=plan.base, kept_tag=kept, tag=tag,
                                             timeout_s=s.build_timeout_s, series=desired.series,
                                             series_id=desired.series_id),
                             timeout_s=s.build_timeout_s + VERIFY_SLACK_S, heartbeat=heartbeat)
        image = built["image"]
        lines.append(f"{h.name}: built {tag} ({cplan.short(image['id'])}) FROM {kept} ({cplan.short(plan.base)})")
        # ---- the speed analysis gate's baseline (issue 29 phase 2): the old container, before the switch ----
        baseline = analysis_baseline(h, serve, analysis=analysis, connect=connect,
                                     release=desired.sglang_version, progress=progress)
        progress("switch the container to the new image")
        session.call({"op": "switch", "run_id": run_id, "command": "push", "kind": "push",
                      "image": {"id": image["id"], "tag": tag}, "from_tag": kept,
                      "expect": answer["container"]["id"], "series": desired.series, "series_id": desired.series_id,
                      "sglang_version": desired.sglang_version}, timeout_s=SWITCH_S + s.stop_timeout_s)
        lines.append(f"{h.name}: container {s.name} recreated from {tag} with its run configuration; the old one "
                     "kept aside until the new one is proven")
    else:  # finish: an earlier run's switch stands, this run checks and keeps it
        baseline = None  # the old container is aside: its figures were the earlier run's to take
        run_id = (answer.get("journal") or {}).get("run_id") or run_id
        lines.append(f"{h.name}: {plan.reason}")
    proof = serve_plan.proof_spec(serve, family_smoke(series))
    progress("health + DDTree proof")
    verified = _verify(session, serve, proof, heartbeat)
    failed = None if verified["healthy"] else (verified["failed"], verified["detail"])
    if failed is None:
        progress("speed analysis")
        # ---- the speed analysis gate (issue 29 phase 2): its single call site ----
        why, speed_bake = analysis_gate(h, serve, baseline, verified, analysis=analysis, connect=connect,
                                        release=desired.sglang_version, progress=progress)
        if why is not None:
            failed = ("analysis", why)
    else:
        speed_bake = None
    doc["verify"] = verified
    if failed is None:
        progress("keep the new container")
        kept_doc = session.call({"op": "keep", "run_id": run_id, "phase": Phase.DEPLOYED})
        doc["journal"] = kept_doc["journal"]
        record_verdict(h, session, speed_bake, lines)  # after the keep: the line shows `deployed`
        lines.append(f"{h.name}: container {s.name} {verified['detail']}")
        lines.append(f"{h.name}: deployed: the old container removed; rollback runs the kept image "
                     f"{kept_doc['journal']['previous'].get('tag')}")
        return _result(h.name, Kind.PUSHED, doc, verified["detail"], lines)
    step, detail = failed
    progress(f"{step} failed: putting the old container back")
    why = automatic_cause(run_id, "analysis" if step == "analysis" else "serve", step, detail)
    try:
        undone, again = _undo(session, serve, run_id, "push", heartbeat, automatic=why)
    except DeployError as exc:
        doc["rollback_error"] = exc.message
        return _result(h.name, Kind.FAILED_NOT_ROLLED_BACK, doc, f"{step} failed: {detail}; the old container could "
                       f"NOT be put back: {clause(exc, h.name)}", lines, exc)
    doc.update(rolled_back=undone["journal"], verify_after_rollback=again)
    record_verdict(h, session, speed_bake, lines)  # after the old container is back: `rolled-back`
    said = (f"{step} failed: {detail}; rolled back: {undone['how']}; the old image serves again: "
            + ("healthy" if again["healthy"] else f"NOT healthy ({again['detail']})"))
    return _result(h.name, Kind.FAILED_ROLLED_BACK, doc, said, lines)  # its first line says it (shown_lines)


def _lock_unless_done(h, session: ContainerSession, command: str, doc: dict, done: Kind | None, reason: str, *,
                      dry_run: bool, break_lock: bool, progress: Progress) -> HostResult | str:
    """Nothing to do (``done``: the result), a dry run (its plan), else the run id once locked."""
    if done is not None:
        return _result(h.name, done, doc, reason, [f"{h.name}: {reason}"])
    if dry_run:
        return _result(h.name, Kind.PLANNED, doc, reason, [f"{h.name}: dry run: {reason}"])
    run_id = doc["run_id"] = new_run_id()
    progress("lock")
    session.call({"op": "lock", "run_id": run_id, "holder": holder_name(), "command": command,
                  "break_lock": break_lock})
    return run_id


def _undo(session: ContainerSession, serve: ServeSettings, run_id: str, command: str, heartbeat: Heartbeat | None,
          automatic: dict | None = None) -> tuple[dict, dict]:
    """Undo the journal's switch (the old container back), then its health: (restore's answer, verify's)."""
    undone = session.call({"op": "restore", "run_id": run_id, "command": command, "automatic": automatic},
                          timeout_s=SWITCH_S)
    return undone, _verify(session, serve, None, heartbeat, switched=False)


def _verify(session: ContainerSession, serve: ServeSettings, proof: dict | None, heartbeat: Heartbeat | None, *,
            switched: bool = True) -> dict:
    limit = serve.ready_timeout_s + (serve.probe_timeout_s if proof else 0) + VERIFY_SLACK_S
    # A copy of the program's (read-only) answer: analysis_gate adds the speed figures to it.
    return dict(session.call({"op": "verify", "health_url": serve.health_url, "url": serve.url, "proof": proof,
                         "ready_timeout_s": serve.ready_timeout_s, "poll_s": serve.poll_s, "switched": switched},
                        timeout_s=limit, heartbeat=heartbeat))


# ---------------------------------------------------------------- rollback


def rollback_host(h, connect: Connect, serve: ServeSettings, *, dry_run: bool = False, break_lock: bool = False,
                  progress: Progress = quiet, heartbeat: Heartbeat | None = None) -> HostResult:
    s = h.container

    def steps(session: ContainerSession) -> HostResult:
        progress("inspect the container")
        answer = _inspect(session, [], serve)
        plan = cplan.plan_rollback(h.name, answer)
        doc = {"host": h.name, "kind": "container", "command": "rollback", "plan": plan.action, "reason": plan.reason,
               "container": answer.get("container")}
        run_id = _lock_unless_done(h, session, "rollback", doc,
                                   Kind.ALREADY_ROLLED_BACK if plan.action == "nothing" else None, plan.reason,
                                   dry_run=dry_run, break_lock=break_lock, progress=progress)
        if isinstance(run_id, HostResult):
            return run_id
        if plan.action == "undo":
            progress("put the old container back")
            undone, again = _undo(session, serve, run_id, "rollback", heartbeat)
            doc.update(journal=undone["journal"], verify=again)
            line = f"rolled back: {undone['how']}; " + ("healthy" if again["healthy"] else f"NOT healthy ({again['detail']})")
            return _result(h.name, Kind.ROLLED_BACK if again["healthy"] else Kind.UNHEALTHY, doc, line,
                           [f"{h.name}: {line}"])
        journal = answer["journal"]
        progress(f"switch the container to the kept image {plan.image.get('tag')}")
        session.call({"op": "switch", "run_id": run_id, "command": "rollback", "kind": "rollback",
                      "image": plan.image, "from_tag": (journal.get("image") or {}).get("tag"),
                      "expect": answer["container"]["id"], "series": journal.get("series"),
                      "series_id": journal.get("series_id"), "sglang_version": journal.get("sglang_version")},
                     timeout_s=SWITCH_S + s.stop_timeout_s)
        progress("health")
        verified = _verify(session, serve, None, heartbeat)
        doc["verify"] = verified
        if verified["healthy"]:
            kept = session.call({"op": "keep", "run_id": run_id, "phase": Phase.ROLLED_BACK})
            doc["journal"] = kept["journal"]
            line = (f"rolled back: container {s.name} runs the kept image {plan.image.get('tag')} "
                    f"({cplan.short(plan.image.get('id'))}): {verified['detail']}")
            return _result(h.name, Kind.ROLLED_BACK, doc, line, [f"{h.name}: {line}"])
        undone, again = _undo(session, serve, run_id, "rollback", heartbeat)
        line = (f"the kept image was not healthy ({verified['detail']}): the deployed container is back: "
                f"{undone['how']}; " + ("healthy" if again["healthy"] else f"NOT healthy ({again['detail']})"))
        doc.update(journal=undone["journal"], verify_after_undo=again)
        return _result(h.name, Kind.UNHEALTHY, doc, line, [f"{h.name}: {line}",
                                                           f"{h.name}: next: {next_step.status(h.name)}"])

    return _open(h, connect, steps)


__all__ = ["analysis_baseline", "analysis_gate", "push_host", "rollback_host", "status_host"]
