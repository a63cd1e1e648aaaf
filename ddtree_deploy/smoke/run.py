"""Running a smoke plan on a host (the edge): ship the smoke program over the host's
transport, stream its events to the caller's progress, read its report, and copy a
failed launch's server log back. What it runs was decided in ``smoke_plan``; this module
never calls ``deploy`` (what happens around a smoke is ``rollout``'s).
"""

from __future__ import annotations

import time
from pathlib import Path

from ddtree_deploy.base import next_step
from ddtree_deploy.base.codes import Code
from ddtree_deploy.base.errors import DeployError
from ddtree_deploy.base.progress import Heartbeat, Progress, quiet
from ddtree_deploy.remote.program import HostProgram, ProgramSession
from ddtree_deploy.smoke.plan import START_S, SmokePlan, heartbeat_s, silence_limit
from ddtree_deploy.smoke.report import SmokeReport, read_answer


# Never sudo: the smoke reads files and starts a server as the SSH user.
SMOKE_PROGRAM = HostProgram("ddtree_deploy.hostprog.smoke", "the smoke program", Code.SMOKE_AGENT)


def smoke_agent_source() -> bytes:
    return SMOKE_PROGRAM.source()


def run_on_host(host, transport, plan: SmokePlan, *, log_dir=None, progress: Progress = quiet,
                heartbeat: Heartbeat | None = None) -> SmokeReport:
    """Ship the smoke program to ``host`` over ``transport``, run ``plan``, read its report.

    The program streams one JSON line per event (level start, heartbeat, level result)
    and the whole answer last; a failed launch's server log comes back with it and is
    written under ``log_dir`` (default: the user's cache, ``smoke-logs/<host>/``).
    ``progress`` hears each level's start; ``heartbeat(level, seconds)``, when given,
    hears the host program's keep-alives during long levels.

    Every read has a deadline: the running level's (``plan.deadline``), and no more than
    ``silence_limit`` without a line while a level runs (it beats every 20 s). A missed
    one is one line naming the host, the level and the seconds; the program is left to
    finish on its own (it ignores the hangup and stops the server it started).
    """
    answer = None
    silence = silence_limit(plan.request)
    with transport, ProgramSession(transport, host, SMOKE_PROGRAM) as session:
        session.send(plan.request, during="while sending the smoke request")
        level, started, limit = None, time.monotonic(), START_S
        while answer is None:
            now = time.monotonic()
            quiet = silence if level is not None else limit
            deadline = min(started + limit, now + quiet)
            where = f"smoke level {level}" if level else "the smoke program's start"
            try:
                doc = session.read(deadline, what=f"{where}'s result" if level else "the smoke result",
                                   during=where)
            except TimeoutError:
                session.detach()
                raise _missed(host, plan, level, limit, silence, silent=time.monotonic() < started + limit) from None
            event = doc.get("event")
            # One progress step per level (a caller's step timer times it); the
            # results themselves are in the report.
            if event == "start":
                level, started, limit = doc["level"], time.monotonic(), plan.deadline(doc["level"])
                progress(f"smoke {doc['level']}")
            elif event == "wait" and heartbeat is not None:
                heartbeat(doc["level"], float(doc["seconds"]))
            elif event == "level":
                # Between levels and after the last one: the next start (or the answer) is due at once.
                level, started, limit = None, time.monotonic(), START_S
            elif event == "done":
                answer = doc
    report = read_answer(host.name, plan, answer)
    if answer.get("server_log") is not None:
        report = report.with_log_copy(str(_keep_log(host.name, answer["server_log"], log_dir)))
    return report


def _missed(host, plan: SmokePlan, level: str | None, limit: float, silence: float, *, silent: bool) -> DeployError:
    """One line for a missed deadline: host, level, seconds; the hint says what to check."""
    status = f"then {next_step.status(host.name)}"
    if level is None:
        return DeployError(f"{host.name}: the smoke program gave no answer within {limit:g} s (between levels)",
                           code=Code.TIMEOUT, hint=f"the host may be overloaded; {status}")
    if silent:
        return DeployError(
            f"{host.name}: smoke level {level}: no word from the host for {silence:g} s (the smoke program "
            f"sends a heartbeat every {heartbeat_s(plan.request):g} s): the link or the program is stuck",
            code=Code.TIMEOUT, hint=f"check the host answers (`ssh {_ssh_target(host)} true`), {status}")
    keys = {"import": "smoke.timeout_s", "cli": "smoke.timeout_s",
            "launch": "the [smoke.launch] timeouts (ready_timeout_s, probe_timeout_s, term_grace_s)"}
    fix = f"raise {keys[level]} in {host.source or 'the inventory'} if the host is just slow; " \
        if level in keys else ""
    return DeployError(f"{host.name}: smoke level {level} did not finish within {limit:g} s",
                       code=Code.TIMEOUT,
                       hint=f"{fix}the smoke program stops what it started by itself; {status}")


def _ssh_target(host) -> str:
    ssh = getattr(host, "ssh", None)
    if ssh is None:
        return host.name
    return f"{ssh.user + '@' if ssh.user else ''}{ssh.host}" + (f" -p {ssh.port}" if ssh.port and ssh.port != 22 else "")


def _keep_log(host_name: str, text: str, log_dir) -> Path:

    from ddtree_deploy.base.locations import cache_dir

    folder = Path(log_dir) if log_dir else cache_dir() / "smoke-logs" / host_name
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}-server.log"
    path.write_text(text, encoding="utf-8")
    return path

