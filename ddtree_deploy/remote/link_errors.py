"""Why a link could not be made, or died, in one line with what to check: the connection errors.

Classified by the exception's type wherever the type says it (paramiko's
AuthenticationException, NoValidConnectionsError and its errno per address, socket's timeout
and gaierror, EOFError); by its text only where paramiko gives no type of its own (a peer
that does not answer with an SSH banner is a bare SSHException). Pure: tested with the
exceptions a real sshd, resolver and socket give (tests/integration/test_connect_errors.py).
"""

from __future__ import annotations

import errno
import shlex
import socket

from ddtree_deploy.base import next_step
from ddtree_deploy.base.codes import Code
from ddtree_deploy.base.errors import Changed, DeployError
from ddtree_deploy.settings.inventory import Host, key_error


def connection_lost(label: str, exc: BaseException, step: str | None = None, *,
                    state: str | None = None) -> DeployError:
    """One line for a connection that died: what was under way (``step``, e.g. "while
    starting the host program"), why in words (an EOFError from paramiko says nothing by
    itself: the peer or the network closed it), and, when the caller knows it, what that
    leaves on the host (``state``)."""
    if isinstance(exc, EOFError) or not str(exc):
        why = "the connection was closed"
    elif isinstance(exc, OSError) and exc.strerror:
        why = exc.strerror
    else:
        why = str(exc)
    return link_lost(label, why, step, state=state)


def link_lost(label: str, why: str, step: str | None = None, *, state: str | None = None,
              changed: Changed | None = None) -> DeployError:
    """``connection_lost``'s line from its facts: ``why`` (in words) is the error's evidence,
    so that a caller that knows the step and the host's state says the line again whole."""
    during = f" {step}" if step else ""
    tail = f"; {state}" if state else ""
    return DeployError(f"{label}: connection lost{during} ({why}){tail}", code=Code.CONNECTION_LOST,
                       hint=f"run {next_step.status()} to see where the host stands, then rerun",
                       step=step, changed=changed, evidence={"why": why})


def connect_error(label: str, host: Host, conn, exc: BaseException, jump: str | None = None) -> DeployError:
    """Why a connection could not be made, in one line, with a hint saying what to check or
    run (pure: tested with the exceptions a real sshd, resolver and socket give). ``jump``:
    ``conn`` is that hop of ssh.jump (as written), not the target: the line names the hop."""
    import paramiko

    t = host.ssh
    where = f"{conn.user}@{conn.host}:{conn.port}"
    what = f"jump host {jump} ({where})" if jump else where
    key = "ssh.jump" if jump else "ssh.host"
    inv = host.source or "the inventory"
    verbose = f"`ssh -v -p {conn.port} {shlex.quote(conn.user)}@{shlex.quote(conn.host)} true` shows each step"
    unchanged = "nothing was sent to the host"
    transport = getattr(conn.client, "get_transport", lambda: None)()
    closed = transport is not None and not transport.is_active()
    if closed and _a_cut(exc, paramiko):
        # A link that died under paramiko surfaces as whatever it was doing next: "Authentication
        # failed." from a refused-or-cut try, "No existing session" from an authentication that
        # began after the cut, EOFError, a broken pipe from a write after the peer's close...
        # A refused key leaves the connection open (the server waits for another try); a closed
        # transport was cut, or closed by the host. Whether the key exchange had finished says
        # which step it was.
        if getattr(transport, "initial_kex_done", True):
            return DeployError(f"{label}: the connection to {what} was closed during the authentication "
                               f"(by the network or the host); {unchanged}", code=Code.CONNECTION_LOST,
                               hint=f"check the link and rerun; if it persists, the host may refuse this key "
                               f"after too many tries: check ssh.user and ssh.identity_file in {inv}; {verbose}",
                               changed=Changed.NO, evidence={"why": str(exc)})
        return _closed_in_handshake(label, what, unchanged, verbose)
    if isinstance(exc, paramiko.AuthenticationException):
        return DeployError(f"{label}: authentication failed for {what} ({exc})", code=Code.AUTH,
                           hint=f"check ssh.user and ssh.identity_file in {inv} (the key must be in the "
                           f"user's authorized_keys on the host); {verbose}")
    if isinstance(exc, (socket.timeout, TimeoutError)):
        return DeployError(f"{label}: timed out connecting to {what} after {t.connect_timeout:g} s", code=Code.CONNECT,
                           hint=f"is the host up and its port {conn.port} reachable from here (firewall, VPN)? "
                           f"Raise ssh.connect_timeout in {inv} for a slow link; {verbose}")
    if isinstance(exc, socket.gaierror):
        name = conn.host
        lookup = f"`getent hosts {shlex.quote(name)}` shows what this machine resolves"
        if exc.errno in _NO_SUCH_NAME:
            # The resolver says the name does not exist: the inventory (or the ssh config it
            # uses) is wrong, not the network.
            written = jump if jump else t.host
            via = f" (HostName {name!r} in the ssh config)" if not jump and name != t.host else ""
            return key_error(host, key, f"{'hop ' if jump else ''}{written!r}{via} does not resolve "
                             f"({exc.strerror or exc})", f"fix the name ({lookup})")
        return DeployError(f"{label}: cannot resolve the host name {name!r}{' of jump host ' + jump if jump else ''} "
                           f"({exc.strerror or exc})", code=Code.CONNECT,
                           hint=f"check {key} in {inv} (a name, an address, or a Host alias of the ssh "
                           f"config) and this machine's resolver; {lookup}")
    if isinstance(exc, paramiko.ssh_exception.NoValidConnectionsError) and exc.errors:
        codes = {getattr(e, "errno", None) for e in exc.errors.values()}  # one error per address tried
    else:
        codes = {exc.errno} if isinstance(exc, OSError) else set()
    if codes == {errno.ECONNREFUSED}:
        return DeployError(f"{label}: connection refused by {'jump host ' + jump + ' ' if jump else ''}{conn.host} "
                           f"port {conn.port} (nothing listens there)", code=Code.CONNECT,
                           hint=f"check {'ssh.jump' if jump else 'ssh.port'} in {inv} and that sshd runs on the "
                           f"host; {verbose}")
    if codes & {errno.EHOSTUNREACH, errno.ENETUNREACH}:
        return DeployError(f"{label}: no route to {conn.host} ({what})", code=Code.CONNECT,
                           hint=f"check ssh.host / ssh.jump in {inv} and this machine's network (VPN?); {verbose}")
    if isinstance(exc, paramiko.SSHException) and "banner" in str(exc):
        # paramiko has no type of its own for a missing banner (a bare SSHException): its text
        # is all there is. It says the same when a link is cut before the server's banner
        # arrived as when something else listens: either way before the authentication.
        return DeployError(f"{label}: {what} does not answer as an SSH server ({exc}); {unchanged}", code=Code.CONNECT,
                           hint=f"check {'ssh.jump' if jump else 'ssh.port'} in {inv}: something else listens "
                           f"there; {verbose}")
    if isinstance(exc, EOFError) or not str(exc):
        return _closed_in_handshake(label, what, unchanged, verbose)
    return DeployError(f"{label}: cannot connect to {what}: {exc}; {unchanged}", code=Code.CONNECT, hint=verbose)


def _a_cut(exc: BaseException, paramiko) -> bool:
    """What a link closed under paramiko raises (on a transport that is no longer active): its
    own errors but the missing banner (that one is said as such, below), an EOF, or the
    socket errors of a write after the peer's close."""
    if isinstance(exc, paramiko.SSHException):
        return "banner" not in str(exc)
    return isinstance(exc, EOFError) or (isinstance(exc, OSError) and exc.errno in _CUT_ERRNOS)


_CUT_ERRNOS = frozenset({errno.EPIPE, errno.ECONNRESET, errno.ECONNABORTED})


def _closed_in_handshake(label: str, what: str, unchanged: str, verbose: str) -> DeployError:
    return DeployError(f"{label}: the connection to {what} was closed during the SSH handshake (by the "
                       f"network or the host); {unchanged}", code=Code.CONNECT, hint=f"rerun; {verbose}")


# getaddrinfo's "this name does not exist" (not "try again": EAI_AGAIN is a resolver outage).
_NO_SUCH_NAME = frozenset(getattr(socket, n) for n in ("EAI_NONAME", "EAI_NODATA") if hasattr(socket, n))


__all__ = ["connect_error", "connection_lost", "link_lost"]
