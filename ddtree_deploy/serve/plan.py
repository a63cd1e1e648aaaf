"""What the host's serve program is asked to do, how long the controller waits for it, and
what its answers mean. Pure.

- ``check_request``: ``status``'s question: which SGLang server processes run from the
  package, did they start before the last switch, and (with ``[serve]``) the health.
- ``restart_request``: drain (optional), the inventory's restart command, the health wait,
  the DDTree proof (the launch smoke level's, ``hostprog.smoke.prove_served``, on the real
  server: ``proof = "tree"`` sends the probe and the tree prompts, ``"width"`` only reads
  ``/server_info``); none after a rollback (the files are pristine SGLang again).
- ``serving``: a discovery answer read into one state and one sentence for ``status``;
  a server that started before the last change of the files is judged by content where the
  host's history can tell (``loaded_now``: the bytes it started with vs the bytes now), by
  the times only where it cannot (and the sentence says so).

The host program is ``hostprog/serve.py``; running it is ``serve_run``'s.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from ddtree_deploy.base import next_step
from ddtree_deploy.hostprog import wire
from ddtree_deploy.settings.serve import ServeSettings
from ddtree_deploy.settings.smoke import DEFAULT_PROBE, FAMILY_SMOKE_DEFAULT, FamilySmoke
from ddtree_deploy.smoke.plan import (
    ALGORITHM,
    LEVEL_SLACK_S,
    SERVER_INFO_S,
    START_S,
    TREE_MAX_NEW_TOKENS,
    TREE_PROMPTS,
)

PACKAGE = "sglang"
HEALTH_GET_S = 10.0  # one health GET, at most
HEARTBEAT_S = wire.HEARTBEAT_S  # the host programs' beat, unless the request says


def check_request(python: str, files: Sequence[str], settings: ServeSettings | None) -> dict:
    """``status``: discover the serving processes (and GET the health when ``[serve]`` says where)."""
    request: dict[str, Any] = {"op": "check", "python": python, "package": PACKAGE, "files": list(files)}
    if settings is not None:
        request["health"] = {"url": settings.health_url, "timeout_s": HEALTH_GET_S}
    return request


def proof_spec(settings: ServeSettings, family: FamilySmoke = FAMILY_SMOKE_DEFAULT) -> dict:
    """The launch level's proof, for the serving server (``hostprog.smoke.prove_served``)."""
    tree = settings.proof == "tree"
    return {
        "probe": {"text": DEFAULT_PROBE, "max_new_tokens": 32} if tree else None,
        "probe_timeout_s": settings.probe_timeout_s,
        "expect_algorithm": ALGORITHM,
        "tree": {
            "budget": settings.budget,
            "budget_field": family.budget_field,
            "worker_class": family.worker_class,
            "prompts": list(TREE_PROMPTS) if tree else [],
            "max_new_tokens": TREE_MAX_NEW_TOKENS,
        },
    }


def restart_request(python: str, files: Sequence[str], settings: ServeSettings, *, proof: dict | None,
                    heartbeat_s: float = HEARTBEAT_S, record: Mapping[str, Any] | None = None) -> dict:
    """Drain, restart, wait for health, prove (``proof``: ``proof_spec``'s, or None: health only).
    ``record`` ({state_dir, restart_run, run_id, holder, command}): where and for which runs the
    serve program records the restart's end itself (hostprog/serve.record_end), so that a
    restart whose controller is gone does not stay ``restarting`` in the journal."""
    request = check_request(python, files, settings)
    request.update({
        "op": "restart",
        "url": settings.url,
        "drain": ({"argv": list(settings.drain), "timeout_s": settings.drain_timeout_s,
                   "wait_s": settings.drain_wait_s} if settings.drain else None),
        "restart": {"argv": list(settings.restart), "timeout_s": settings.restart_timeout_s},
        "ready_timeout_s": settings.ready_timeout_s,
        "poll_s": settings.poll_s,
        "proof": proof,
        "heartbeat_s": heartbeat_s,
        "record": dict(record) if record is not None else None,
    })
    return request


def restart_deadline(request: Mapping[str, Any]) -> float:
    """Seconds the controller waits for a restart's answer: the sum of every wait the host
    program has (each with its own deadline there), plus slack for the link and the start."""
    total = START_S + LEVEL_SLACK_S + float(request["restart"]["timeout_s"])
    drain = request.get("drain")
    if drain:
        total += float(drain["timeout_s"]) + float(drain.get("wait_s", 0))
    # The last poll may start just before the ready deadline: one more GET and one discovery.
    total += float(request["ready_timeout_s"]) + float(request["poll_s"]) + HEALTH_GET_S
    proof = request.get("proof")
    if proof:
        total += 2 * float(proof.get("probe_timeout_s", 300)) + SERVER_INFO_S
    return total


def silence_limit(request: Mapping[str, Any]) -> float:
    """No line for this long while a step runs (it beats every ``heartbeat_s``): the link or
    the program is stuck."""
    return max(3 * float(request.get("heartbeat_s", HEARTBEAT_S)), 10.0)


# ---------------------------------------------------------------- reading a discovery


STALE = "stale"  # a server that runs other bytes than the files hold now: restart it
CURRENT = "current"
NONE = "none"  # no server process found


def record_since(answer: Mapping[str, Any]) -> float | None:
    """The start of the oldest serving process that started before the last change of the
    files: the history since then decides whether the bytes it runs are still the files'
    (the agent's ``switches``). None: every process started after it (the times decide)."""
    starts = [p["started"] for p in answer.get("processes") or () if p.get("before_files")]
    return min(starts) if starts else None


def switches_request(since: float, files: Sequence[str]) -> dict:
    """The agent's ``switches`` (read-only): the record ``loaded_now`` reads."""
    return {"op": "switches", "since": since, "paths": list(files)}


def loaded_now(started: float, record: Mapping[str, Any]) -> tuple[bool | None, str]:
    """Whether a server that started at ``started`` (the host's clock) runs the bytes the
    files hold now, by content: (True / False, "") or (None, why the record cannot tell).

    ``record``: the agent's ``switches`` answer: ``current`` (each file's sha256 and ctime
    now), ``switches`` (the history's switches, oldest first, each with its per-file
    ``from``/``to`` sha256 and when its renames began and ended), ``before`` (each file's
    version after the newest switch that ended before the record's ``since``) and
    ``complete_since`` (from when the history holds every switch). The bytes the server
    loaded are the ``from`` of the first switch of each file after it started; a file no
    switch touched since is as it was. Anything the record cannot vouch for leaves the
    answer to the times: the history does not reach back to the start (rotated away), it
    started during a switch, a switch failed part-way, or a file changed after the start
    (its ctime) without a chain of recorded switches from the bytes before to the bytes now
    (a killed agent, an edit outside ddtree-deploy, a history line that was not written).
    """
    if record.get("error"):
        return None, f"the host's history could not be read ({record['error']})"
    complete = record.get("complete_since")
    if complete is None or complete > started:
        return None, "the host's history no longer reaches back to its start (rotated away)"
    current = record.get("current") or {}
    prior = dict(record.get("before") or {})  # path -> sha256 after the last switch before the start
    after: dict[str, list[tuple[str | None, str | None]]] = {}
    for w in record.get("switches") or ():
        began, ended = w.get("began"), w.get("ended")
        if began is None or ended is None:  # an older agent's line: only its (whole-second) time
            return None, f"a switch of {w.get('time')} is recorded without the times of its renames"
        if ended < started:
            for path, f in (w.get("files") or {}).items():
                if w.get("outcome") in ("ok", "failed-unchanged"):
                    prior[path] = f.get("to") if w.get("outcome") == "ok" else f.get("from")
                else:
                    prior.pop(path, None)
            continue
        if began <= started:
            return None, f"it started during the switch of {w.get('time')} (run {w.get('run_id')})"
        for path, f in (w.get("files") or {}).items():
            if w.get("outcome") == "ok":
                after.setdefault(path, []).append((f.get("from"), f.get("to")))
            elif w.get("outcome") == "failed-unchanged":  # switched back in the same op
                after.setdefault(path, []).append((f.get("from"), f.get("from")))
            else:
                return None, f"the switch of {w.get('time')} failed part-way ({w.get('outcome')})"
    changed = {p for p, info in current.items() if info and (info.get("ctime") or 0) > started}
    same = True
    for path in sorted(changed | set(after)):
        steps = after.get(path)
        now = (current.get(path) or {}).get("sha256")
        if not steps:
            return None, f"{path} changed after it started, and no switch in the history did that"
        chained = all(a[1] == b[0] for a, b in zip(steps, steps[1:])) and steps[-1][1] == now
        if path not in current or not chained or (path in prior and prior[path] != steps[0][0]):
            return None, f"{path} changed outside the switches the history records"
        same = same and steps[0][0] == now
    return same, ""


def serving(answer: Mapping[str, Any], host: str = "HOST", *, serve: bool = False,
            record: Mapping[str, Any] | None = None) -> dict:
    """A ``check`` answer -> {state, explanation, processes, files_changed, health}: what runs.

    ``serve``: the host has a ``[serve]`` table (the hint names ``restart``; without one,
    the operator restarts the server by hand). ``record``: the agent's ``switches`` since
    ``record_since`` (None: not asked): each process that started before the last change is
    judged by content (``loaded_now``), else by the times, and its entry says which
    (``stale``, ``decided_by``, ``undecided``: why the content could not decide)."""
    procs = [dict(p) for p in answer.get("processes") or ()]
    for p in procs:
        verdict, why = ((None, "the history's switches were not read") if record is None
                        else loaded_now(p["started"], record))
        if not p.get("before_files") or verdict is None:
            p.update(stale=p.get("before_files"), decided_by="time", undecided=why if p.get("before_files") else None)
        else:
            p.update(stale=not verdict, decided_by="content", undecided=None)
    old = [p for p in procs if p.get("stale")]
    how = (f"run {next_step.restart(host)}" if serve else
           "restart it (or add a [serve] table to the inventory so that push restarts it)")
    when = answer.get("files_changed_iso")
    if not procs:
        state = NONE
        text = (f"no SGLang server process found running {answer.get('python')} or from "
                f"{answer.get('package_root')}")
    elif old:
        state = STALE
        pids = ", ".join(str(p["pid"]) for p in old)
        by_time = [p for p in old if p["decided_by"] == "time"]
        why = ("the files no longer hold the bytes it started with" if not by_time else
               f"taken as older by the times alone: {by_time[0]['undecided']}")
        text = f"serving code older than the files: pid {pids} started before the last switch ({when}); {why}: {how}"
    else:
        state = CURRENT
        pids = ", ".join(str(p["pid"]) for p in procs)
        undone = [p for p in procs if p.get("before_files")]
        if undone:
            text = (f"pid {pids} started before the last switch ({when}), but the files hold again the bytes it "
                    "started with (the switches since were undone): serving the current files")
        else:
            text = f"pid {pids} started after the last switch ({when or 'no deployed file'}): serving the current files"
    health = answer.get("health")
    if health is not None:
        status = health.get("status")
        text += f"; health {health.get('url')}: {status if status is not None else 'no answer'}"
    own = list(answer.get("own") or ())
    if own:  # what ddtree-deploy's smoke or tune program runs (or left): never a server
        text += (f"; not servers: {len(own)} process(es) of ddtree-deploy's own host programs ("
                 + ", ".join(f"pid {p.get('pid')}: {p.get('program')}" for p in own[:5]) + ")")
    return {"state": state, "explanation": text, "processes": procs, "files_changed": answer.get("files_changed_iso"),
            "newest_file": answer.get("newest_file"), "health": health, "unreadable": answer.get("unreadable", 0),
            "own": own}


def process_line(p: Mapping[str, Any]) -> str:
    """One serving process as one line (unescaped: the CLI escapes host text)."""
    stale = p.get("stale", p.get("before_files"))
    when = ("BEFORE the last switch" if stale else
            "before the last switch, since undone" if p.get("before_files") else "after the last switch")
    kids = f", {len(p.get('children') or ())} child process(es)" if p.get("children") else ""
    cmd = " ".join(p.get("cmdline") or ())
    if len(cmd) > 160:
        cmd = cmd[:157] + "..."
    return f"pid {p.get('pid')} started {p.get('started_iso')} ({when}{kids}): {cmd}"


__all__ = ["CURRENT", "NONE", "STALE", "check_request", "loaded_now", "process_line", "proof_spec", "record_since",
           "restart_deadline", "restart_request", "serving", "silence_limit", "switches_request"]
