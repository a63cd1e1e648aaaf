"""What the host's serve program is asked to do, how long the controller waits for it, and
what its answers mean. Pure.

- ``check_request``: ``status``'s question: which SGLang server processes run from the
  package, did they start before the last switch, and (with ``[serve]``) the health.
- ``restart_request``: drain (optional), the inventory's restart command, the health wait,
  the DDTree proof (the launch smoke level's, ``smoke_agent.prove_served``, on the real
  server: ``proof = "tree"`` sends the probe and the tree prompts, ``"width"`` only reads
  ``/server_info``); none after a rollback (the files are pristine SGLang again).
- ``serving``: a discovery answer read into one state and one sentence for ``status``.

The host program is ``serve_agent.py``; running it is ``serve_run``'s.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from ddtree_deploy import next_step
from ddtree_deploy.serve_settings import ServeSettings
from ddtree_deploy.smoke_plan import ALGORITHM, LEVEL_SLACK_S, SERVER_INFO_S, START_S, TREE_MAX_NEW_TOKENS, TREE_PROMPTS
from ddtree_deploy.smoke_settings import DEFAULT_PROBE, FAMILY_SMOKE_DEFAULT, FamilySmoke

PACKAGE = "sglang"
HEALTH_GET_S = 10.0  # one health GET, at most
HEARTBEAT_S = 20.0  # serve_agent.HEARTBEAT_S unless the request says


def check_request(python: str, files: Sequence[str], settings: ServeSettings | None) -> dict:
    """``status``: discover the serving processes (and GET the health when ``[serve]`` says where)."""
    request: dict[str, Any] = {"op": "check", "python": python, "package": PACKAGE, "files": list(files)}
    if settings is not None:
        request["health"] = {"url": settings.health_url, "timeout_s": HEALTH_GET_S}
    return request


def proof_spec(settings: ServeSettings, family: FamilySmoke = FAMILY_SMOKE_DEFAULT) -> dict:
    """The launch level's proof, for the serving server (``smoke_agent.prove_served``)."""
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
                    heartbeat_s: float = HEARTBEAT_S) -> dict:
    """Drain, restart, wait for health, prove (``proof``: ``proof_spec``'s, or None: health only)."""
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


STALE = "stale"  # a server started before the last switch: it runs the previous code
CURRENT = "current"
NONE = "none"  # no server process found


def serving(answer: Mapping[str, Any], host: str = "HOST", *, serve: bool = False) -> dict:
    """A ``check`` answer -> {state, explanation, processes, files_changed, health}: what runs.

    ``serve``: the host has a ``[serve]`` table (the hint names ``restart``; without one,
    the operator restarts the server by hand)."""
    procs = list(answer.get("processes") or ())
    old = [p for p in procs if p.get("before_files")]
    how = (f"run {next_step.restart(host)}" if serve else
           "restart it (or add a [serve] table to the inventory so that push restarts it)")
    if not procs:
        state = NONE
        text = (f"no SGLang server process found running {answer.get('python')} or from "
                f"{answer.get('package_root')}")
    elif old:
        state = STALE
        pids = ", ".join(str(p["pid"]) for p in old)
        text = (f"serving code older than the files: pid {pids} started before the last switch "
                f"({answer.get('files_changed_iso')}): {how}")
    else:
        state = CURRENT
        pids = ", ".join(str(p["pid"]) for p in procs)
        text = (f"pid {pids} started after the last switch ({answer.get('files_changed_iso') or 'no deployed file'})"
                ": serving the current files")
    health = answer.get("health")
    if health is not None:
        status = health.get("status")
        text += f"; health {health.get('url')}: {status if status is not None else 'no answer'}"
    return {"state": state, "explanation": text, "processes": procs, "files_changed": answer.get("files_changed_iso"),
            "newest_file": answer.get("newest_file"), "health": health, "unreadable": answer.get("unreadable", 0)}


def process_line(p: Mapping[str, Any]) -> str:
    """One serving process as one line (unescaped: the CLI escapes host text)."""
    when = "BEFORE" if p.get("before_files") else "after"
    kids = f", {len(p.get('children') or ())} child process(es)" if p.get("children") else ""
    cmd = " ".join(p.get("cmdline") or ())
    if len(cmd) > 160:
        cmd = cmd[:157] + "..."
    return f"pid {p.get('pid')} started {p.get('started_iso')} ({when} the last switch{kids}): {cmd}"


__all__ = ["CURRENT", "NONE", "STALE", "check_request", "process_line", "proof_spec", "restart_deadline",
           "restart_request", "serving", "silence_limit"]
