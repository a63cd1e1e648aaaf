"""An error message built from nested prefixes (``<host>: <step>: <the agent's reason>``, a
host's line embedding another error) says each segment once. A full state disk said
``h: lock: lock: No space left on device``: the agent named the op it was in, and the
controller named the step again. The real full-disk cases are in tests/e2e/test_deploy_safety.py
(a tmpfs); here every agent op's generic error path and the composition itself.
"""

from __future__ import annotations

import errno

import pytest

from ddtree_deploy.base.errors import DeployError, clause, prefixed
from ddtree_deploy.hostprog.agent import OPS as AGENT_OPS
from ddtree_deploy.hostprog.agent import Agent
from ddtree_deploy.hostprog.fileops import describe_os_error, located
from ddtree_deploy.remote.agent_session import AgentFailed, expect_ok

OPS = sorted(AGENT_OPS)  # every op the agent dispatches, each to the part that answers it


def repeated(message: str) -> list[str]:
    """Segments said twice in a row (``a: a: ...``)."""
    parts = message.split(": ")
    return [a for a, b in zip(parts, parts[1:]) if a == b]


def test_prefixed_says_each_part_once():
    assert prefixed("lock: No space left on device", "h", "lock") == "h: lock: No space left on device"
    assert prefixed("No space left on device", "h", "lock") == "h: lock: No space left on device"
    assert prefixed("apply needs the deploy lock", "h", "apply") == "h: apply: apply needs the deploy lock"
    assert clause(DeployError("h: apply: changed"), "h") == "apply: changed"
    assert clause(DeployError("other: apply: changed"), "h") == "other: apply: changed"


@pytest.mark.parametrize("op", OPS)
def test_an_os_error_in_any_agent_op_is_named_once(op, tmp_path, monkeypatch):
    """Whatever op an OSError without a file name escapes from, the controller's message is
    ``<host>: <op>: <reason> (errno X)``: the agent gives the reason, the controller the step."""

    def fails(request):
        raise OSError(errno.ENOSPC, "No space left on device")

    agent = Agent(str(tmp_path / "state"))
    part_name, method = AGENT_OPS[op]
    part = agent if part_name == "agent" else getattr(agent, part_name)
    monkeypatch.setattr(part, method, fails)  # this agent's part answers the op by failing
    reply = agent.handle({"op": op})
    with pytest.raises(AgentFailed) as e:
        expect_ok(reply, "h", op)
    assert e.value.message == f"h: {op}: No space left on device (errno ENOSPC)", e.value.message
    assert not repeated(e.value.message)


def test_an_os_error_names_the_users_file_not_our_temporary():
    tmp = OSError(errno.ENOSPC, "No space left on device", "/s/journal.json.ddtree-tmp-12")
    assert describe_os_error(located(tmp, "/s/journal.json")) == "/s/journal.json: No space left on device (errno ENOSPC)"
    named = OSError(errno.EACCES, "Permission denied", "/s/backups/x")
    assert describe_os_error(located(named, "/s/journal.json")) == "/s/backups/x: Permission denied (errno EACCES)"
    assert describe_os_error(OSError(errno.ENOSPC, "No space left on device")) == "No space left on device (errno ENOSPC)"
