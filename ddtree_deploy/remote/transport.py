"""The transport for a host: SSH, or this machine for ``--host local``.

The transports themselves are ``link.py`` (the interface), ``local.py`` and ``ssh.py``; a
host program is started over one by ``program.py`` (``agent_session.py`` for the deploy
agent). This module only chooses, so that the commands need not know which.
"""

from __future__ import annotations

from ddtree_deploy.remote.link import Transport
from ddtree_deploy.remote.local import LocalTransport
from ddtree_deploy.remote.ssh import SSHTransport
from ddtree_deploy.settings.inventory import Host


def transport_for(host: Host, *, trust_new_host: bool = False) -> Transport:
    return LocalTransport() if host.is_local else SSHTransport(host, trust_new_host=trust_new_host)


__all__ = ["transport_for"]
