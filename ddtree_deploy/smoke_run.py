"""Running a smoke plan on a host (the edge): ship the smoke program over the host's
transport, stream its events to the caller's progress, read its report, and copy a
failed launch's server log back. What it runs was decided in ``smoke_plan``; this module
never calls ``deploy`` (what happens around a smoke is ``rollout``'s).
"""

from __future__ import annotations

from typing import Callable

from ddtree_deploy.codes import Code
from ddtree_deploy.errors import DeployError
from ddtree_deploy.smoke_plan import SmokePlan
from ddtree_deploy.smoke_report import SmokeReport, read_answer

Progress = Callable[[str], None]


def _quiet(_step: str) -> None:
    pass


def smoke_agent_source() -> bytes:
    from importlib import resources

    return resources.files("ddtree_deploy").joinpath("smoke_agent.py").read_bytes()


def run_on_host(host, transport, plan: SmokePlan, *, log_dir=None, progress: Progress = _quiet,
                heartbeat: Callable[[str, float], None] | None = None) -> SmokeReport:
    """Ship the smoke program to ``host`` over ``transport``, run ``plan``, read its report.

    The program streams one JSON line per event (level start, heartbeat, level result)
    and the whole answer last; a failed launch's server log comes back with it and is
    written under ``log_dir`` (default: the user's cache, ``smoke-logs/<host>/``).
    ``progress`` hears each level's start; ``heartbeat(level, seconds)``, when given,
    hears the host program's keep-alives during long levels.
    """
    import json

    from ddtree_deploy.transport import BOOTSTRAP

    source = smoke_agent_source()
    answer = None
    # Never sudo: the smoke reads files and starts a server as the SSH user.
    with transport:
        proc = transport.start([host.python, "-c", BOOTSTRAP])
        try:
            proc.write(b"%d\n" % len(source) + source + json.dumps(plan.request).encode() + b"\n")
            while answer is None:
                line = proc.readline()
                if not line.endswith(b"\n"):
                    code, tail = proc.close()
                    proc = None
                    last = tail.strip().splitlines()[-1] if tail.strip() else "no output"
                    raise DeployError(f"{host.name}: the smoke program stopped without a result "
                                      f"(exit {code}; {last})", code=Code.SMOKE_AGENT)
                try:
                    doc = json.loads(line)
                except ValueError:
                    raise DeployError(f"{host.name}: the smoke program answered garbage: {line[:200]!r}",
                                      code=Code.SMOKE_AGENT) from None
                event = doc.get("event")
                # One progress step per level (a caller's step timer times it); the
                # results themselves are in the report.
                if event == "start":
                    progress(f"smoke {doc['level']}")
                elif event == "wait" and heartbeat is not None:
                    heartbeat(doc["level"], float(doc["seconds"]))
                elif event == "done":
                    answer = doc
        finally:
            if proc is not None:
                proc.close()
    report = read_answer(host.name, plan, answer)
    if answer.get("server_log") is not None:
        report = report.with_log_copy(str(_keep_log(host.name, answer["server_log"], log_dir)))
    return report


def _keep_log(host_name: str, text: str, log_dir) -> "Path":
    import time
    from pathlib import Path

    from ddtree_deploy.locations import cache_dir

    folder = Path(log_dir) if log_dir else cache_dir() / "smoke-logs" / host_name
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}-server.log"
    path.write_text(text, encoding="utf-8")
    return path

