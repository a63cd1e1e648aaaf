"""What every agent session of this room opens with: its first request, its round-trip
limit, the run id and the holder name a lock records."""

from __future__ import annotations

import getpass
import socket
import uuid

from ddtree_deploy.base import hooks
from ddtree_deploy.remote.agent_session import AgentSession
from ddtree_deploy.remote.link import Transport
from ddtree_deploy.settings.inventory import Host

#: Seconds one agent round trip may take unless the inventory's host.op_timeout says:
#: a push's apply backs up, stages and switches (large files on slow disks), a read is quick.
WRITE_OP_TIMEOUT = 120.0
READ_OP_TIMEOUT = 30.0


def new_run_id() -> str:
    return uuid.uuid4().hex[:12]


def holder_name() -> str:
    try:
        user = getpass.getuser()
    except Exception:
        user = "?"
    return f"{user}@{socket.gethostname()}"


def init_request(host: Host) -> dict:
    return {"op": "init", "state_dir": host.state_dir, "hooks": hooks.hooks()}  # base/hooks.py: {} but in a fault test


def agent_session(transport: Transport, host: Host, write: bool) -> AgentSession:
    return AgentSession(transport, host, host.op_timeout or (WRITE_OP_TIMEOUT if write else READ_OP_TIMEOUT))


__all__ = ["READ_OP_TIMEOUT", "WRITE_OP_TIMEOUT", "agent_session", "holder_name", "init_request", "new_run_id"]
