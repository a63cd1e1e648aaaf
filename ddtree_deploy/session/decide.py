"""The push's (and rollback's) decide stage, pure: the facts read under the lock -> a
``Decision``, every request and every sentence of each way the switch can end.

Today's journal-phase logic lives here: a host left ``switching`` by a run killed after its
last rename is completed, one left ``switched`` by a run whose smoke never passed is smoked
again (or marked deployed without a smoke, unless a level failed on it), a rollback over a
host stopped while ``staged``/``switching`` completes its journal. No connection, no clock:
tests/unit/test_decide.py runs it on facts written by hand. A dry run stops after this stage.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass
from typing import Any

from ddtree_deploy.base import next_step
from ddtree_deploy.base.codes import Code, Phase
from ddtree_deploy.base.errors import BadInput, DeployError
from ddtree_deploy.engine.patch_write import diff_hunks
from ddtree_deploy.session.host_facts import hashes, refuse_unsafe, state_folder
from ddtree_deploy.session.plan import Desired, FileState, Plan, plan_push, plan_rollback
from ddtree_deploy.settings.inventory import Host


@dataclass(frozen=True)
class Decision:
    """What the switch stage will send and say: the plan, and the words and requests of each
    way it ends (push and rollback differ only here)."""

    plan: Plan
    noop: str  # summary when nothing changes
    dry: str  # summary of a dry run
    step: str  # progress label of the apply
    apply: dict[str, Any] | None  # the apply request (None: nothing to switch)
    done: str  # summary of a done apply; ``{backup_id}``: the backup the agent made
    noop_request: dict[str, Any] | None = None  # sent with the unlock when nothing switches (push: a mark)
    # push, nothing to switch: the journal of the run still ``switched``, whose smoke the caller runs
    pending: dict[str, Any] | None = None
    # Nothing to switch but the journal says ``switching`` (the agent was killed after its last
    # rename): sent first, it moves the journal to where that run would have ended.
    complete: dict[str, Any] | None = None
    diff: str | None = None  # push --diff: what the plan changes, as a unified diff
    drifted_diff: str = ""  # --replace-drifted: each drifted file it replaces, against what was expected there
    # push: the journal of an earlier run that switched these files and awaits its smoke
    earlier: dict[str, Any] | None = None


def mark_request(run_id: str | None, phase: str, smoke: dict[str, Any] | None = None,
                 expect: str = Phase.SWITCHED) -> dict[str, Any]:
    return {"op": "mark", "run_id": run_id, "expect": expect, "phase": phase, "smoke": smoke}


def decide_push(host: Host, desired: Desired, facts: dict[str, Any], run_id: str, *, smoke: bool, dry_run: bool,
                diff: bool = False, replace_drifted: bool = False) -> Decision:
    """The push's decision from the host's facts (read under the lock) and the series'
    ``desired``: the drift check and the plan (plan.py), then what the journal's phase
    makes of a plan with nothing to switch. ``smoke``: the switch ends ``switched`` (the
    caller smokes and marks), else ``deployed``."""
    refuse_unsafe(host.name, facts)
    drift_diff = None
    if diff:  # --diff: a drift refusal says what differs, not only which files (drift.py)
        from ddtree_deploy.session.drift import push_drift_diff

        drift_diff = push_drift_diff(desired, facts)
    plan = plan_push(host.name, desired, hashes(facts), facts["journal"], replace_drifted=replace_drifted,
                     folder=state_folder(facts), drift_diff=drift_diff)
    name = f"{desired.series} ({desired.series_id[:12]})"
    journal = dict(facts["journal"] or {})
    earlier: dict[str, Any] | None = None
    noop, noop_request, complete = f"already deployed: {name}; nothing changed", None, None
    if plan.noop and journal.get("phase") == Phase.SWITCHING and journal.get("series_id") == desired.series_id:
        # A run killed after its last rename, before its journal: every file is switched.
        # Finish that run as it would have ended: `switched` (and the smoke runs) or
        # `deployed` without a smoke; never "already deployed" with no smoke at all.
        complete = mark_request(journal.get("run_id"), Phase.SWITCHED if smoke else Phase.DEPLOYED,
                                expect=Phase.SWITCHING)
        stopped = f"run {journal.get('run_id')} of {name} stopped after switching every file"
        if dry_run:
            noop = f"dry run: {stopped}; a push would complete its journal; nothing changed"
        elif smoke:
            journal["phase"] = Phase.SWITCHED
            earlier = dict(journal)
            noop = f"{stopped}: journal completed (switched); its smoke runs now"
        else:
            noop = f"{stopped}: journal completed and marked deployed without a smoke"
    if plan.noop and journal.get("phase") == Phase.SWITCHED and complete is None:
        earlier = dict(journal)
        noop = f"nothing to switch: {name} was switched by run {journal.get('run_id')}, whose smoke never passed"
        failed = (journal.get("smoke") or {}).get("failed")
        if failed:
            noop = (f"nothing to switch: {name} was switched by run {journal.get('run_id')}, whose smoke "
                    f"failed at {failed}")
        if not smoke and not dry_run:
            if failed:  # a level failed on these files: only a smoke that passes may mark them
                noop += f"; NOT marked deployed without a smoke: {next_step.smoke_or_rollback(host.name)}"
            else:
                noop_request = mark_request(journal.get("run_id"), Phase.DEPLOYED)
                noop += "; marked deployed without a smoke"
    return Decision(
        plan,
        noop=noop,
        dry=f"dry run: would switch {len(plan.changes)} of {len(plan.steps)} file(s); nothing changed",
        step=f"back up + stage + switch {len(plan.changes)} file(s)",
        apply=None if plan.noop else apply_push_request(host, run_id, desired, plan,
                                                       Phase.SWITCHED if smoke else Phase.DEPLOYED),
        drifted_diff=replaced_diff(desired, facts, plan),
        done=f"pushed {name}: {len(plan.changes)} file(s) switched, backup {{backup_id}}",
        noop_request=noop_request,
        pending=dict(journal) if plan.noop and journal.get("phase") == Phase.SWITCHED and smoke else None,
        complete=complete,
        diff=plan_diff(plan, desired, facts) if diff else None,
        earlier=earlier,
    )


def decide_rollback(host: Host, facts: dict[str, Any], run_id: str, *, to: str | None = None,
                    replace_drifted: bool = False, expected: Desired | None = None,
                    automatic: dict[str, Any] | None = None) -> Decision:
    """The rollback's decision (the ``rollback`` command and a push's own rollback under its
    lock alike): which backup, the plan back to it, and a journal left ``staged`` or
    ``switching`` completed. ``expected`` (``--replace-drifted``): what the drifted files'
    diff is shown against."""
    refuse_unsafe(host.name, facts)
    if not facts["backups"] and not facts["journal"] and to is None:
        # Never pushed (no journal, no backup): it is where a rollback leaves a host, so a
        # fleet rollback over a host a stopped push skipped is no failure there.
        return Decision(Plan("rollback", host.name, ()), noop="nothing to roll back: no push ever switched a "
                        "file on this host (no journal, no backup)", dry="dry run: nothing to roll back (never "
                        "pushed)", step="", apply=None, done="")
    manifest = choose_backup(host, facts["backups"], to)
    plan = plan_rollback(host.name, manifest, hashes(facts), facts["journal"], replace_drifted=replace_drifted,
                         folder=state_folder(facts))
    bid = manifest["id"]
    journal = facts["journal"] or {}
    complete, noop = None, f"already at backup {bid}; nothing changed"
    if plan.noop and journal.get("phase") in (Phase.STAGED, Phase.SWITCHING):
        # Every file is already at the backup (a rollback killed after its last rename, or
        # a push killed before its first): the journal must not stay `switching`.
        complete = mark_request(journal.get("run_id"), Phase.ROLLED_BACK, expect=str(journal.get("phase")))
        noop = (f"completed: every file is at backup {bid} (run {journal.get('run_id')} stopped "
                f"while {journal.get('phase')}); journal marked rolled-back")
    return Decision(
        plan,
        complete=complete,
        noop=noop,
        dry=f"dry run: would restore {len(plan.changes)} file(s) from {bid}; nothing changed",
        step=f"stage + switch {len(plan.changes)} file(s) from backup {bid}",
        apply=None if plan.noop else apply_rollback_request(host, run_id, manifest, plan, facts["journal"],
                                                           automatic),
        done=f"rolled back {len(plan.changes)} file(s) to backup {bid} (sha256 verified)",
        drifted_diff=replaced_diff(expected, facts, plan),
    )


def plan_diff(plan: Plan, desired: Desired, facts: dict[str, Any]) -> str:
    """Pure: the unified diff from each host file the plan changes (its bytes in ``facts``,
    read with ``content``) to the file the push writes; "" when nothing changes. Like
    ``ansible-playbook --check --diff``: what each host would get, per file."""
    by_path = {t.path: t for t in desired.targets}
    out: list[str] = []
    for step in plan.changes:
        info = (facts.get("files") or {}).get(step.path)
        old = base64.b64decode(info["data"]) if info and info.get("data") is not None else None
        new = by_path[step.path].data
        # Text for people: bytes that are not UTF-8 show as U+FFFD, never fail the push.
        old_text = "" if old is None else old.decode("utf-8", errors="replace")
        hunks = diff_hunks(old_text, new.decode("utf-8", errors="replace"))
        if not hunks:
            continue
        out.append(f"--- {'/dev/null' if old is None else 'a/' + step.path}\n+++ b/{step.path}\n")
        out.extend(text for _line, text in hunks)
    return "".join(out)


def replaced_diff(desired: Desired | None, facts: dict[str, Any], plan: Plan) -> str:
    """--replace-drifted: each drifted file the plan replaces, from what the series expects
    there to the host's bytes (drift.py); "" when none, or the series is unknown here."""
    if not plan.drifted or desired is None:
        return ""
    from ddtree_deploy.session.drift import expected_diff

    return expected_diff(desired, facts, plan.drifted)


def apply_push_request(host: Host, run_id: str, desired: Desired, plan: Plan, final_phase: str = Phase.DEPLOYED
                       ) -> dict[str, Any]:
    by_path = {t.path: t for t in desired.targets}
    # A drifted or missing file the plan replaces: its original may be nowhere on the host
    # (drift on a host never pushed to), so the snapshot's pristine bytes travel for its backup.
    replaced = {s.path for s in plan.steps if s.state in (FileState.DRIFTED, FileState.MISSING)}
    files: list[dict[str, Any]] = []
    for step in plan.changes:
        t = by_path[step.path]
        files.append({"path": t.path, "expect": step.current, "want": t.patched, "mode": t.mode,
                      "data": base64.b64encode(t.data).decode("ascii")})
    meta = {"series": desired.series, "series_id": desired.series_id, "sglang_version": desired.sglang_version}
    return {
        "op": "apply",
        "kind": "push",
        "run_id": run_id,
        "files": files,
        "make_backup": True,
        # Back up every target, not only the changing ones: a rollback restores the whole set.
        "backup": [{"path": t.path, "pristine": t.pristine, "mode": t.mode}
                   | ({"data": base64.b64encode(t.original).decode("ascii")}
                      if t.path in replaced and t.original is not None else {}) for t in desired.targets],
        "backup_meta": meta,
        "keep_drifted": list(plan.drifted),
        "journal": dict(meta, snapshot=desired.snapshot,
                        files={t.path: {"pristine": t.pristine, "patched": t.patched} for t in desired.targets}),
        "final_phase": final_phase,
        "keep_backups": host.keep_backups,
    }


def apply_rollback_request(host: Host, run_id: str, manifest: dict[str, Any], plan: Plan,
                           journal: dict[str, Any] | None, automatic: dict[str, Any] | None = None) -> dict[str, Any]:
    journal = dict(journal or {})
    journal.pop("phase", None)
    journal.pop("automatic", None)  # an earlier automatic rollback's cause says nothing about this one
    if automatic is not None:
        journal["automatic"] = automatic
    return {
        **({"automatic": automatic} if automatic is not None else {}),
        "op": "apply",
        "kind": "rollback",
        "run_id": run_id,
        "files": [{"path": s.path, "expect": s.current, "want": s.want,
                   "mode": manifest["files"][s.path].get("mode") or 0o644} for s in plan.changes],
        "from_backup": manifest["id"],
        "backup_id": manifest["id"],
        "make_backup": False,
        "journal": journal,  # the series stays recorded: status can still tell patched from pristine
        "final_phase": Phase.ROLLED_BACK,
        "keep_drifted": list(plan.drifted),
        "keep_backups": host.keep_backups,
    }


def choose_backup(host: Host, backups: list[dict[str, Any]], to: str | None) -> dict[str, Any]:
    if not backups:
        raise DeployError(f"{host.name}: no backups on the host to restore from", code=Code.NO_BACKUP,
                          hint=f"see what the files are with {next_step.status(host.name)}")
    if to is None:
        return backups[-1]  # ids start with a UTC timestamp: the last is the newest
    for b in backups:
        if b["id"] == to:
            return b
    raise BadInput(f"{host.name}: no backup {to!r}; on the host: {', '.join(b['id'] for b in backups)}")


__all__ = ["Decision", "apply_push_request", "apply_rollback_request", "choose_backup", "decide_push",
           "decide_rollback", "mark_request", "plan_diff", "replaced_diff"]
