"""What a container host's state means, and what a push or rollback does about it. Pure.

The container program's ``inspect`` answer (the container, its image, the sglang inside and
the sha256 of the series' files there, the journal of this container, the lock) is read
here into:

- ``describe``: ``status``'s document: one sentence saying where the host stands and what to
  run next, and the ``attention`` items that make it "needs attention" (a container
  recreated outside ddtree-deploy: another image than the journal's; a run that stopped
  between its switch and its end; a container that is not running or not healthy);
- ``plan_push``: what a push does: nothing (already deployed), finish an interrupted run,
  or build FROM the image before the series (the kept one when the container runs ours);
- ``plan_rollback``: which image a rollback runs (the kept previous one) or which switch it undoes.
"""

from __future__ import annotations

from dataclasses import dataclass

from ddtree_deploy.base import next_step
from ddtree_deploy.base.codes import Code, Phase
from ddtree_deploy.base.errors import BadInput, DeployError
from ddtree_deploy.session.plan import Desired
from ddtree_deploy.settings.container import ContainerSettings

SERIES_LABEL = "io.ddtree-deploy.series"
SERIES_ID_LABEL = "io.ddtree-deploy.series.sha256"


def short(image_id: str | None) -> str:
    return str(image_id or "?").split(":", 1)[-1][:12]


def require_container(host: str, answer: dict, settings: ContainerSettings) -> dict:
    """The container, or the refusal: none of that name (the names there listed)."""
    found = answer.get("container")
    if found is None:
        names = ", ".join(answer.get("names") or ()) or "none"
        raise DeployError(f"{host}: no container named {settings.name} ({settings.engine} on the host lists: "
                          f"{names}); nothing was changed", code=Code.NO_CONTAINER,
                          hint="set container.name to the serving container's name (`docker ps` shows it)")
    return found


def sglang_of(host: str, answer: dict, settings: ContainerSettings) -> dict:
    """The sglang inside the container, or the refusal: the container is not SGLang."""
    probe = answer.get("probe") or {}
    found = probe.get("sglang")
    if not found:
        why = probe.get("error") or f"{settings.python} in the container finds no sglang package"
        raise DeployError(f"{host}: container {settings.name} ({short((answer.get('container') or {}).get('image'))})"
                          f" is not an SGLang container: {why}; nothing was changed", code=Code.NOT_SGLANG,
                          hint="set container.name to the container that runs SGLang, and container.python to "
                          "the image's interpreter that imports sglang")
    if not found.get("version"):
        raise DeployError(f"{host}: cannot tell the SGLang version in container {settings.name} (at "
                          f"{found.get('package_root')})", code=Code.NO_VERSION)
    return found


def uncovered(host: str, version: str, exc: BadInput) -> BadInput:
    """No family covers the image's SGLang: said for the container (exit 2, nothing sent)."""
    return BadInput(f"{host}: the container's image runs SGLang {version}, a release no family covers: "
                    f"{exc.message}", hint=exc.hint, code=Code.UNCOVERED)


def file_states(found: dict, desired: Desired | None) -> list[dict]:
    files = found.get("files") or {}
    out = []
    for path in sorted(files):
        have = files[path]
        state = "unknown"
        if desired is not None:
            target = next((t for t in desired.targets if t.path == path), None)
            if target is not None:
                state = ("patched" if have == target.patched else "pristine" if have == target.pristine
                         else "missing" if have is None else "drifted")
        out.append({"path": path, "sha256": have, "state": state})
    return out


def _ours(answer: dict) -> bool:
    """The container runs the image the journal says ddtree-deploy left it with."""
    journal = answer.get("journal") or {}
    found = answer.get("container") or {}
    return bool(journal.get("image")) and found.get("image") == (journal.get("image") or {}).get("id")


def describe(host: str, answer: dict, settings: ContainerSettings, desired: Desired | None) -> dict:
    """``status`` of a container host: the document, with ``explanation`` and ``attention``."""
    found = answer.get("container")
    image = answer.get("image") or {}
    journal = answer.get("journal")
    probe = (answer.get("probe") or {}).get("sglang") or {}
    labels = image.get("labels") or {}
    attention: list[dict] = []
    doc = {"host": host, "kind": "container", "engine": settings.engine, "container": found,
           "image": image or None, "sglang_version": probe.get("version"), "package_root": probe.get("package_root"),
           "image_series": ({"name": labels.get(SERIES_LABEL), "id": labels.get(SERIES_ID_LABEL)}
                            if labels.get(SERIES_ID_LABEL) else None),
           "files": file_states(probe, desired), "journal": journal, "lock": answer.get("lock"),
           "aside": answer.get("aside"), "health": answer.get("health"), "phase": (journal or {}).get("phase")
           or Phase.NEVER_DEPLOYED, "series": None}
    if journal and journal.get("series"):
        doc["series"] = {"name": journal.get("series"), "id": journal.get("series_id"), "run_id": journal.get("run_id"),
                         "updated": journal.get("updated")}
    phase = doc["phase"]
    run = (journal or {}).get("run_id")
    sw = (journal or {}).get("switch") or {}
    if phase in (Phase.SWITCHING, Phase.SWITCHED):
        serve = (journal or {}).get("serve") or {}
        checked = (f"; its health check at {serve.get('time')} said {serve.get('state')}"
                   + (f" ({serve.get('detail')})" if serve.get("state") != "healthy" else "")) if serve else \
            "; not checked healthy yet"
        if phase == Phase.SWITCHING:
            what = (f"a {sw.get('kind', 'push')} (run {run}) stopped during its switch of container {settings.name} "
                    f"from image {short(sw.get('from_image'))} to {short(sw.get('to_image'))}")
        else:
            what = (f"a {sw.get('kind', 'push')} (run {run}) switched container {settings.name} to image "
                    f"{short(sw.get('to_image'))} and never ended{checked}")
        kept = answer.get("aside")
        where = (f"; the old container is kept aside, stopped, as {kept['name']}" if kept
                 else "; the old container is gone: rollback recreates it from the recorded configuration")
        doc["explanation"] = (f"{what}{where}: run {next_step.push(host)} to finish it, or "
                              f"{next_step.rollback(host)} to put the old image back")
        attention.append({"kind": "interrupted", "detail": f"a {sw.get('kind', 'push')} (run {run}) never ended"})
    elif found is None:
        names = ", ".join(answer.get("names") or ()) or "none"
        doc["explanation"] = f"no container named {settings.name} on the host ({settings.engine} lists: {names})"
        attention.append({"kind": "no-container", "detail": doc["explanation"]})
    elif journal and journal.get("image") and not _ours(answer):
        left = journal["image"]
        doc["explanation"] = (f"container {settings.name} runs image {short(found.get('image'))}, not "
                              f"{short(left.get('id'))} that ddtree-deploy left it with (run {run}, {phase}): it "
                              f"was recreated outside ddtree-deploy; {next_step.push(host)} builds on the image it "
                              "runs now")
        attention.append({"kind": "recreated", "detail": f"container recreated outside ddtree-deploy (image "
                          f"{short(found.get('image'))}, not {short(left.get('id'))})"})
    elif phase == Phase.DEPLOYED:
        prev = journal.get("previous") or {}
        doc["explanation"] = (f"deployed {journal.get('series')} by run {run}: container {settings.name} runs image "
                              f"{short(found.get('image'))}; {next_step.rollback(host)} runs the kept image "
                              f"{prev.get('tag') or short(prev.get('id'))}")
    elif phase == Phase.ROLLED_BACK:
        auto = (journal.get("automatic") or {})
        how = (f"automatically after push run {auto.get('push_run')} ({auto.get('cause')} failed at "
               f"{auto.get('step')})" if auto else f"by run {run}")
        doc["explanation"] = (f"rolled back {how}: container {settings.name} runs image "
                              f"{short(found.get('image'))}, the image before the series")
    else:
        carried = doc["image_series"]
        doc["explanation"] = (f"never deployed by ddtree-deploy: container {settings.name} runs image "
                              f"{short(found.get('image'))}" + (f", which carries {carried['name']} "
                                                                 f"({short(carried['id'])}) by its labels"
                                                                 if carried else ""))
    if found is not None and not found.get("running"):
        attention.append({"kind": "not-running", "detail": f"container {settings.name} is not running "
                          f"({found.get('status')}, exit code {found.get('exit_code')})"})
    health = answer.get("health")
    if found is not None and found.get("running") and health and health.get("status") != 200:
        attention.append({"kind": "unhealthy", "detail": f"health {health.get('url')}: {health.get('status')}"})
    if found is not None and not (answer.get("probe") or {}).get("sglang"):
        attention.append({"kind": "not-sglang", "detail": (answer.get("probe") or {}).get("error")
                          or "no sglang in the container"})
    drifted = [f["path"] for f in doc["files"] if f["state"] in ("drifted", "missing")]
    if drifted:
        attention.append({"kind": "drift", "detail": f"{len(drifted)} file(s) in the container match neither the "
                          f"pristine nor the patched version: {', '.join(drifted)}"})
    doc["attention"] = attention
    return doc


@dataclass(frozen=True)
class PushPlan:
    """What a push does on a container host: ``action`` is ``already`` (nothing), ``finish``
    (a switch of an earlier run stands: verify it and keep it), ``undo-first`` (a switch that
    stopped half-way: put the old container back, then build), or ``build``; ``base``: the
    image to build FROM (the one before the series)."""

    action: str
    base: str | None
    reason: str


def plan_push(host: str, answer: dict, desired: Desired) -> PushPlan:
    journal = answer.get("journal") or {}
    found = answer.get("container") or {}
    labels = (answer.get("image") or {}).get("labels") or {}
    phase = journal.get("phase")
    sw = journal.get("switch") or {}
    if phase == Phase.SWITCHED and journal.get("series_id") == desired.series_id and found.get("id") == \
            sw.get("to_container"):
        return PushPlan("finish", None, f"run {journal.get('run_id')} switched the container to the new image and "
                        "never ended: it is checked and kept now")
    if phase in (Phase.SWITCHING, Phase.SWITCHED):
        return PushPlan("undo-first", sw.get("from_image"), f"run {journal.get('run_id')} stopped during its "
                        "switch: the old container is put back first")
    if _ours(answer) and phase == Phase.DEPLOYED and journal.get("series_id") == desired.series_id:
        return PushPlan("already", None, f"already deployed: {desired.series} ({desired.series_id[:12]}) by run "
                        f"{journal.get('run_id')}, image {short(found.get('image'))}")
    if not journal and labels.get(SERIES_ID_LABEL) == desired.series_id:
        return PushPlan("already", None, f"the image already carries {desired.series} ({desired.series_id[:12]}) "
                        "(by its labels)")
    if _ours(answer) and phase == Phase.DEPLOYED:
        prev = journal.get("previous") or {}
        if not (answer.get("kept") or {}).get(prev.get("id")):
            raise DeployError(f"{host}: the image before the deployed series ({prev.get('tag') or prev.get('id')}) "
                              "is gone from the host: a new series cannot be built on it; nothing was changed",
                              code=Code.NO_BACKUP, hint=f"{next_step.rollback(host)} is not possible either: recreate "
                              "the container from the original image, then push")
        return PushPlan("build", prev.get("id"), f"the container runs {journal.get('series')}: the new series is "
                        f"built on the image before it ({prev.get('tag') or short(prev.get('id'))})")
    return PushPlan("build", found.get("image"), f"built FROM the image the container runs ({short(found.get('image'))})")


@dataclass(frozen=True)
class RollbackPlan:
    """``undo`` (a switch that never ended: put the old container back), ``switch`` (run the
    kept previous image), or ``nothing`` (never deployed, or rolled back already)."""

    action: str
    image: dict | None
    reason: str


def plan_rollback(host: str, answer: dict) -> RollbackPlan:
    journal = answer.get("journal") or {}
    phase = journal.get("phase")
    if phase in (Phase.SWITCHING, Phase.SWITCHED):
        return RollbackPlan("undo", None, f"run {journal.get('run_id')} never ended its switch: the old container "
                            "is put back")
    if phase != Phase.DEPLOYED:
        return RollbackPlan("nothing", None, "nothing to roll back: " + (
            f"already rolled back (run {journal.get('run_id')})" if phase == Phase.ROLLED_BACK
            else "ddtree-deploy never deployed to this container"))
    if not _ours(answer):
        raise DeployError(f"{host}: the container was recreated outside ddtree-deploy (image "
                          f"{short((answer.get('container') or {}).get('image'))}, not "
                          f"{short((journal.get('image') or {}).get('id'))}): rollback would replace what someone "
                          "else put there; nothing was changed", code=Code.CHANGED,
                          hint=f"{next_step.status(host)} shows it; push builds on what it runs now")
    prev = journal.get("previous") or {}
    if not (answer.get("kept") or {}).get(prev.get("id")):
        raise DeployError(f"{host}: the kept image {prev.get('tag') or prev.get('id')} is gone from the host: "
                          "nothing to roll back to; nothing was changed", code=Code.NO_BACKUP)
    return RollbackPlan("switch", prev, f"runs the kept image {prev.get('tag') or short(prev.get('id'))}")


__all__ = ["PushPlan", "RollbackPlan", "describe", "file_states", "plan_push", "plan_rollback", "require_container",
           "sglang_of", "short", "uncovered"]
