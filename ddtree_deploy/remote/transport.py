"""Transports: start one program on a host and talk to it over stdin/stdout.

The whole toolkit needs exactly one remote primitive — start ``argv`` with pipes — because
everything host-side is done by the agent (``ddtree_deploy.hostprog.agent``) speaking JSON lines.
``SSHTransport`` (fabric + paramiko, one connection per host per command, strict
known_hosts) and ``LocalTransport`` (subprocess, for running on the GPU box itself)
implement it; only this module imports fabric/paramiko.

``ProgramSession`` is the one way to start a host program: a stdlib-only Python program
(the deploy agent, the smoke, serve and tune programs: a ``HostProgram``) shipped whole,
with the modules it imports (``hostprog.bundle``), over the transport to the host's
interpreter (``python -c BOOTSTRAP``), then JSON lines both ways. ``AgentSession`` is the deploy agent's: it counts round trips.
"""

from __future__ import annotations

import base64
import errno
import hashlib
import json
import logging
import os
import select
import shlex
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from ddtree_deploy.base import next_step
from ddtree_deploy.base.codes import Code, Phase
from ddtree_deploy.base.errors import BadInput, Changed, DeployError, prefixed
from ddtree_deploy.base.fsutil import NotARegularFile, check_regular, read_regular
from ddtree_deploy.hostprog import bundle
from ddtree_deploy.hostprog.lock import GUARD_WAIT_S
from ddtree_deploy.remote import inflight
from ddtree_deploy.settings.inventory import (
    MAX_IDENTITY_BYTES,
    MAX_KNOWN_HOSTS_BYTES,
    MAX_SSH_CONFIG_BYTES,
    Host,
    SSHTarget,
    key_error,
)

# Read the agent (source + a JSON-line loop) from stdin and run it. Short, fixed, and
# free of any inventory value: the interpreter path is the only thing that varies, and
# it is quoted by shlex.join in agent_argv.
BOOTSTRAP = (
    "import sys;b=sys.stdin.buffer;g={'__name__':'ddtree_agent'};"
    "exec(compile(b.read(int(b.readline())),'ddtree_agent.py','exec'),g);g['main']()"
)

#: Seconds one round trip with the agent may take when the inventory sets no op_timeout:
#: generous for a push's backup + switch of large files, short enough that a silent host
#: is reported in minutes, not left hanging.
DEFAULT_OP_TIMEOUT = 120.0
DEFAULT_IO_TIMEOUT = 600.0  # seconds one SSH read may wait when the caller gives no deadline (the tune sweep)
#: The largest reply line accepted from a host program: a pull of every target file is a
#: few MB; anything past this is a broken or hostile host, refused with a clear error.
MAX_REPLY_BYTES = 64 << 20
_QUIET = logging.NullHandler()
KEEPALIVE_S = 15  # SSH keepalive interval: a dead peer is noticed, an idle NAT entry kept
#: Seconds a failed write waits for the program's exit status (it is there already when the
#: program ended: the status comes before the channel's close).
EXIT_STATUS_WAIT_S = 2.0


class ReplyError(DeployError):
    """A host program's reply broke a bound (too large, too late)."""


def program_argv(host: Host, *, sudo: bool = False) -> list[str]:
    """The command that runs a shipped host program on ``host`` (pure; tested by equality)."""
    prefix = ["sudo", "-n", "--"] if sudo else []
    return [*prefix, host.python, "-c", BOOTSTRAP]


def agent_argv(host: Host) -> list[str]:
    """The deploy agent's command: under ``sudo -n`` when the inventory says so."""
    return program_argv(host, sudo=host.sudo)


def remote_command(argv: list[str]) -> str:
    """An argv as the one string an SSH exec request carries, every word quoted."""
    return shlex.join(argv)


@dataclass(frozen=True)
class HostProgram:
    """A stdlib-only Python program (``module``, in ddtree_deploy/hostprog/) shipped whole to
    a host, with every module it imports (``hostprog.bundle``), and run there.

    ``code`` is the error code of its failures; ``stopped_code`` / ``stopped_hint`` those of
    a program that ended without answering.
    """

    module: str
    name: str
    code: str
    stopped_code: str | None = None
    stopped_hint: str | None = None
    #: What a lost link leaves on the host once the program runs (ProgramSession.lost_state).
    lost_state: str = "the host program ends on its own and stops what it started"

    def source(self) -> bytes:
        return bundle.source(self.module)


AGENT = HostProgram("ddtree_deploy.hostprog.agent", "the agent", Code.AGENT, stopped_code=Code.CONNECTION_LOST,
                    stopped_hint=f"run {next_step.status()} to see where the host stands, then rerun")


#: A [container] host's program (hostprog/container.py): the engine CLI on the host, and the
#: lock, journal and history of the container (containers/container_session.py runs it).
CONTAINER_PROGRAM = HostProgram(
    "ddtree_deploy.hostprog.container", "the container program", Code.CONTAINER_AGENT,
    stopped_code=Code.CONNECTION_LOST, stopped_hint=f"run {next_step.status()} to see where the host stands",
    lost_state="the container program goes on alone: it completes the step it was given (the journal says how "
    "far) and releases the deploy lock")


def agent_source() -> bytes:
    return AGENT.source()


# ---------------------------------------------------------------- processes


class LineReader:
    """Lines from a byte stream in linear time, each bounded in size, with a deadline.

    ``recv(n, timeout)`` returns up to n bytes (b"" at EOF) or raises ``TimeoutError``.
    The buffer is scanned for a newline only from where the last scan stopped, so a
    32 MB reply costs one pass (paramiko's and io's line readers rescan or re-copy).
    """

    def __init__(self, recv, label: str, limit: int = MAX_REPLY_BYTES):
        self.recv, self.label, self.limit = recv, label, limit
        self.buf = bytearray()
        self.scanned = 0
        self.eof = False

    def readline(self, deadline: float | None = None, what: str = "a reply") -> bytes:
        while True:
            nl = self.buf.find(b"\n", self.scanned)
            if nl >= 0:
                line = bytes(self.buf[: nl + 1])
                del self.buf[: nl + 1]
                self.scanned = 0
                return line
            self.scanned = len(self.buf)
            if self.scanned > self.limit:
                raise ReplyError(f"{self.label}: {what} is over {self.limit >> 20} MiB; refusing to read more "
                                 "(a broken or hostile host program)", code=Code.REPLY_TOO_LARGE)
            if self.eof:
                line, self.buf = bytes(self.buf), bytearray()
                self.scanned = 0
                return line
            timeout = None if deadline is None else deadline - time.monotonic()
            if timeout is not None and timeout <= 0:
                raise TimeoutError
            chunk = self.recv(1 << 20, timeout)
            if not chunk:
                self.eof = True
            self.buf += chunk


class Process:
    """A started program: write to its stdin, read lines from its stdout."""

    def write(self, data: bytes) -> None:
        raise NotImplementedError

    def readline(self, deadline: float | None = None, what: str = "a reply") -> bytes:
        """One line (b"" or a line without its newline: the program ended). ``deadline``
        (time.monotonic): TimeoutError past it. Over MAX_REPLY_BYTES: ReplyError."""
        raise NotImplementedError

    def abort(self) -> None:
        """Stop waiting for the program: close the pipes/channel now (the agent sees EOF)."""
        self.close()

    def detach(self) -> None:
        """Stop listening and leave the program to finish by itself (never killed)."""
        self.abort()

    def ended(self, wait_s: float) -> tuple[int, str] | None:
        """(exit code, stderr tail) when the program has ended, waiting up to ``wait_s`` for
        its exit status; None when none came (it runs on, or the link died without one)."""
        return None

    def close(self) -> tuple[int | None, str]:
        """Close stdin, wait (bounded), return (exit code or None, stderr tail)."""
        raise NotImplementedError


class Transport:
    """Start programs on one host. Open once per command; ``close`` always."""

    label = "?"
    connections = 0  # how many network connections this transport opened

    def open(self) -> None:
        pass

    def start(self, argv: list[str]) -> Process:
        raise NotImplementedError

    def close(self) -> None:
        pass

    def __enter__(self):
        self.open()
        return self

    def __exit__(self, *exc):
        self.close()


class _LocalProcess(Process):
    def __init__(self, argv: list[str]):
        self._err = tempfile.TemporaryFile()
        try:
            self.p = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._err)
        except OSError as exc:
            raise DeployError(f"cannot start {argv[0]}: {exc.strerror}", code=Code.AGENT,
                              hint="set host.python in the inventory to an interpreter on this machine "
                              "that has sglang installed (`command -v python3` shows one)") from None

    def write(self, data: bytes) -> None:
        try:
            self.p.stdin.write(data)
            self.p.stdin.flush()
        except OSError:
            pass  # the agent exited; readline reports it with its stderr

    def _recv(self, n: int, timeout: float | None) -> bytes:
        fd = self.p.stdout.fileno()
        ready, _, _ = select.select([fd], [], [], timeout)
        if not ready:
            raise TimeoutError
        return os.read(fd, n)

    def readline(self, deadline: float | None = None, what: str = "a reply") -> bytes:
        if not hasattr(self, "_reader"):
            self._reader = LineReader(self._recv, "local")
        return self._reader.readline(deadline, what)

    def abort(self) -> None:
        self.p.kill()
        self.close()

    def ended(self, wait_s: float) -> tuple[int, str] | None:
        try:
            code = self.p.wait(timeout=wait_s)
        except subprocess.TimeoutExpired:
            return None
        self._err.seek(0)
        return code, self._err.read()[-2000:].decode(errors="replace")

    def detach(self) -> None:
        # Our ends closed, nothing waited for or killed: the program sees EOF / EPIPE.
        for stream in (self.p.stdin, self.p.stdout):
            try:
                stream.close()
            except OSError:
                pass
        self._err.close()

    def close(self):
        try:
            self.p.stdin.close()
        except OSError:
            pass
        try:
            code = self.p.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.p.kill()
            code = self.p.wait()
        self.p.stdout.close()
        self._err.seek(0)
        tail = self._err.read()[-2000:].decode(errors="replace")
        self._err.close()
        return code, tail


class LocalTransport(Transport):
    """Run on this machine (``--host local``): same agent, no network."""

    label = "local"

    def start(self, argv: list[str]) -> Process:
        return _LocalProcess(argv)


class _SSHProcess(Process):
    def __init__(self, channel, label: str, io_timeout: float = DEFAULT_IO_TIMEOUT):
        self.chan = channel
        self.label = label
        self.io_timeout = io_timeout
        self.reader = LineReader(self._recv, label)
        self.err = channel.makefile_stderr("rb")

    def _lost(self, exc: BaseException) -> DeployError:
        return connection_lost(self.label, exc)

    def write(self, data: bytes) -> None:
        try:
            self.chan.sendall(data)
        except (OSError, EOFError) as exc:
            raise self._lost(exc) from None
        except Exception as exc:  # paramiko.SSHException and friends
            raise self._lost(exc) from None

    def _recv(self, n: int, timeout: float | None) -> bytes:
        self.chan.settimeout(timeout if timeout is not None else self.io_timeout)
        try:
            return self.chan.recv(n)
        except socket.timeout:
            if timeout is None:  # no caller deadline: the transport's own io timeout
                raise self._lost(TimeoutError(f"no data for {self.io_timeout:g} s")) from None
            raise TimeoutError from None

    def readline(self, deadline: float | None = None, what: str = "a reply") -> bytes:
        try:
            return self.reader.readline(deadline, what)
        except (TimeoutError, DeployError):
            raise
        except (OSError, EOFError) as exc:
            raise self._lost(exc) from None
        except Exception as exc:  # paramiko.SSHException and friends
            raise self._lost(exc) from None

    def abort(self) -> None:
        try:
            self.chan.close()
        except Exception:
            pass

    def ended(self, wait_s: float) -> tuple[int, str] | None:
        # A channel the peer closed has its status event set: with an exit status (the
        # program ended), or -1 (the link went without one).
        if not self.chan.status_event.wait(wait_s) or self.chan.exit_status == -1:
            return None
        return self.chan.exit_status, self._stderr_tail()

    def close(self):
        try:
            self.chan.shutdown_write()
            if self.chan.status_event.wait(60):
                code = self.chan.recv_exit_status()
            else:
                code = None
            tail = self._stderr_tail() if code is not None else ""
        except Exception:
            code, tail = None, ""
        try:
            # On a cut connection paramiko's close raises EOFError (it tries to send the
            # channel-close message): the connection is gone, which is all close means.
            self.chan.close()
        except Exception:
            pass
        return code, tail


    def _stderr_tail(self) -> str:
        # Bounded: a host flooding stderr must not fill our memory either.
        self.chan.settimeout(5)
        kept = bytearray()
        try:
            while True:
                chunk = self.err.read(1 << 16)
                if not chunk:
                    break
                kept = (kept + chunk)[-2000:]
        except Exception:
            pass
        return bytes(kept).decode(errors="replace")


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


def load_host_keys(keys, data: bytes) -> None:
    """known_hosts' lines into paramiko's ``HostKeys`` (what ``HostKeys.load`` does, from bytes
    we read bounded: it opens the path itself, reads without a bound and decodes with the
    locale's codec). A line paramiko cannot parse is skipped, as ssh and paramiko do."""
    from paramiko.hostkeys import HostKeyEntry

    for lineno, line in enumerate(data.decode("utf-8", errors="replace").splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        try:
            entry = HostKeyEntry.from_line(line, lineno)
        except Exception:  # noqa: BLE001 - paramiko's SSHException, or a decoder's error on garbage
            continue
        if entry is None or entry.key is None:
            continue
        for name in entry.hostnames:
            keys.add(name, entry.key.get_name(), entry.key)


class HostKeyRefused(DeployError):
    code = Code.HOST_KEY


def fingerprint(key) -> str:
    """OpenSSH's SHA256 fingerprint of a paramiko key."""
    digest = hashlib.sha256(key.asbytes()).digest()
    return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")


class SSHTransport(Transport):
    """One SSH connection per host per command, through fabric (ssh_config, ProxyJump).

    Host keys are checked strictly against ``known_hosts``: an unknown key is refused
    with its fingerprint unless ``trust_new_host`` (then recorded); a changed key is
    always refused. Fabric's default (auto-add) is replaced on every hop.
    """

    def __init__(self, host: Host, *, trust_new_host: bool = False, io_timeout: float = DEFAULT_IO_TIMEOUT):
        if host.ssh is None:
            raise BadInput(f"host {host.name}: has no [ssh] table")
        self.host = host
        self.target: SSHTarget = host.ssh
        self.trust_new_host = trust_new_host
        self.io_timeout = io_timeout
        self.conn = None
        self.label = host.name
        self.connections = 0

    def _named_file(self, key: str, value: str | None, limit: int, *, required: bool = False) -> bytes | None:
        """A local file the inventory names (``key``), read bounded (``fsutil.read_regular``: a
        regular file, at most ``limit`` bytes), or one inventory line saying what is wrong
        with it. None: not set, or absent where that is allowed."""
        if not value:
            return None
        try:
            return read_regular(Path(value).expanduser(), limit)
        except FileNotFoundError:
            if required:
                raise key_error(self.host, key, f"{value}: no such file", "fix the path") from None
            return None
        except NotARegularFile as exc:
            raise key_error(self.host, key, str(exc), "name a regular file") from None
        except OSError as exc:
            raise key_error(self.host, key, f"{value}: cannot read ({exc.strerror or exc})",
                            "fix the path or its permissions") from None

    def _connection(self):
        import paramiko
        from fabric import Config, Connection

        t = self.target
        ssh_config = paramiko.SSHConfig()
        data = self._named_file("ssh.ssh_config", t.ssh_config, MAX_SSH_CONFIG_BYTES)
        if data is not None:
            try:
                ssh_config = paramiko.SSHConfig.from_text(data.decode("utf-8"))
            except UnicodeDecodeError:
                raise key_error(self.host, "ssh.ssh_config", f"{t.ssh_config} is not UTF-8 text",
                                "save it as UTF-8") from None
            except Exception as exc:
                raise key_error(self.host, "ssh.ssh_config", f"{t.ssh_config}: cannot parse ssh config ({exc})",
                                "fix that file") from None
        config = Config(ssh_config=ssh_config)
        connect_kwargs = {}
        if t.identity_file:
            self._named_file("ssh.identity_file", t.identity_file, MAX_IDENTITY_BYTES, required=True)
            connect_kwargs["key_filename"] = [str(Path(t.identity_file).expanduser())]
            connect_kwargs["look_for_keys"] = False
        # float: fabric leaves the connect without any timeout when this is 0 (int(0.5) was).
        timeout = float(t.connect_timeout)
        if t.jump:
            # Build the ProxyJump chain ourselves so every hop gets the same strict policy.
            gateway = None
            for hop in t.jump.split(","):
                gateway = Connection(hop.strip(), config=config.clone(), gateway=gateway or False,
                                     connect_timeout=timeout, connect_kwargs=dict(connect_kwargs))
                gateway.jump_hop = hop.strip()  # as written in ssh.jump, for messages
        else:
            gateway = None
        conn = Connection(t.host, user=t.user, port=t.port, config=config,
                          gateway=gateway if gateway is not None else None,
                          connect_timeout=timeout, connect_kwargs=connect_kwargs)
        hop = conn
        while hop is not None and not isinstance(hop, str):
            self._strict(hop.client)
            self._identity_files(hop)
            hop = hop.gateway or None
        return conn

    def _identity_files(self, conn) -> None:
        """The key files paramiko will read for ``conn`` (the inventory's, then the ssh config's
        IdentityFile lines): each bounded too, before paramiko reads it (a key file of
        /dev/zero would be read until memory runs out)."""
        for name in conn.connect_kwargs.get("key_filename") or ():
            if self.target.identity_file and name == str(Path(self.target.identity_file).expanduser()):
                continue  # read above, named by its key
            try:
                check_regular(Path(name).expanduser(), MAX_IDENTITY_BYTES)
            except FileNotFoundError:
                continue  # as ssh does: an IdentityFile that is not there is skipped
            except OSError as exc:
                why = str(exc) if isinstance(exc, NotARegularFile) else f"{name}: cannot read ({exc.strerror})"
                raise BadInput(f"{self.target.ssh_config or 'ssh config'}: IdentityFile {name}: {why}; "
                               "name a regular key file there") from None

    def _strict(self, client) -> None:
        import paramiko

        t = self.target
        known = Path(t.known_hosts).expanduser()
        data = self._named_file("ssh.known_hosts", t.known_hosts, MAX_KNOWN_HOSTS_BYTES)
        if data is not None:
            load_host_keys(client.get_host_keys(), data)
        transport = self

        class Policy(paramiko.MissingHostKeyPolicy):
            def missing_host_key(self, client, hostname, key):
                if not transport.trust_new_host:
                    raise HostKeyRefused(
                        f"{transport.label}: unknown host key for {hostname}: {key.get_name()} "
                        f"{fingerprint(key)} (not in {known})",
                        hint="check the fingerprint with the host's owner (on the host: "
                        "`ssh-keygen -lf /etc/ssh/ssh_host_ed25519_key.pub`), then rerun with --trust-new-host",
                    )
                client.get_host_keys().add(hostname, key.get_name(), key)
                # Append one line: rewriting the file through paramiko would drop what it
                # cannot parse (markers, comments) from the user's known_hosts.
                known.parent.mkdir(parents=True, exist_ok=True)
                line = paramiko.hostkeys.HostKeyEntry([hostname], key).to_line()
                with open(known, "a", encoding="utf-8") as fh:
                    fh.write(line)

        client.set_missing_host_key_policy(Policy())

    def open(self) -> None:
        if self.conn is not None:
            return
        inflight.check(self.label)
        conn = self._connection()
        # paramiko logs a failed handshake (a port that is not SSH) with a traceback on
        # stderr when nothing handles its logger; the one-line error below says it all.
        logging.getLogger("paramiko").addHandler(_QUIET)
        with inflight.waiting(self.label, lambda: f"interrupted while connecting to {self.target.host}: nothing "
                              "was sent to the host, it is unchanged",
                              lambda: [self._close_quietly(h) for h in _hops(conn)]):
            self._open_hops(conn)
        self.conn = conn
        self.connections += 1
        # Keepalives: a host that vanished (cable, reboot) fails the read instead of hanging it.
        conn.transport.set_keepalive(KEEPALIVE_S)

    def _open_hops(self, conn) -> None:
        import paramiko

        for hop in _hops(conn):  # the jump hops first, in order: a failure names the hop
            try:
                hop.open()
            except HostKeyRefused:
                raise
            except paramiko.BadHostKeyException as exc:
                raise self._changed_key(hop, exc) from None
            except (OSError, paramiko.SSHException, EOFError) as exc:
                for opened in _hops(conn):
                    self._close_quietly(opened)
                raise connect_error(self.label, self.host, hop, exc, jump=getattr(hop, "jump_hop", None)) from None

    def _changed_key(self, conn, exc) -> HostKeyRefused:
        name = exc.hostname
        if name == conn.host and conn.port != 22:
            # known_hosts keys a non-default port as [host]:port, and so must ssh-keygen -R.
            name = f"[{name}]:{conn.port}"
        return HostKeyRefused(
            f"{self.label}: HOST KEY CHANGED for {name}: got {fingerprint(exc.key)}, "
            f"known_hosts has {fingerprint(exc.expected_key)}; refusing to connect",
            hint=f"if the change is expected: ssh-keygen -f "
            f"{shlex.quote(str(Path(self.target.known_hosts).expanduser()))} -R {shlex.quote(name)}, then rerun "
            "with --trust-new-host",
        )

    @staticmethod
    def _close_quietly(conn) -> None:
        try:
            conn.close()
        except Exception:  # noqa: BLE001 - a half-open connection fails its own goodbye
            pass

    def start(self, argv: list[str]) -> Process:
        self.open()
        try:
            chan = self.conn.transport.open_session(timeout=self.target.connect_timeout)
            chan.settimeout(self.io_timeout)
            chan.exec_command(remote_command(argv))
        except Exception as exc:  # noqa: BLE001 - paramiko's EOFError / SSHException / socket errors
            raise connection_lost(self.label, exc, "while starting the host program",
                                  state="nothing was sent to the host: it is unchanged") from None
        return _SSHProcess(chan, self.label, self.io_timeout)

    def close(self) -> None:
        if self.conn is not None:
            conn, self.conn = self.conn, None
            for hop in reversed(_hops(conn)):  # the target first, then each jump hop
                self._close_quietly(hop)  # a cut connection fails its own goodbye (EOFError)


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
    if isinstance(exc, paramiko.AuthenticationException):
        transport = getattr(conn.client, "get_transport", lambda: None)()
        if transport is not None and not transport.is_active():
            # paramiko words a link that died during the authentication as "Authentication
            # failed." too: a refused key leaves the connection open (the server waits for
            # another try); a closed one was cut, or closed by the host.
            return DeployError(f"{label}: the connection to {what} was closed during the authentication "
                               f"(by the network or the host); {unchanged}", code=Code.CONNECTION_LOST,
                               hint=f"check the link and rerun; if it persists, the host may refuse this key "
                               f"after too many tries: check ssh.user and ssh.identity_file in {inv}; {verbose}")
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
    errors = getattr(exc, "errors", None)  # paramiko's NoValidConnectionsError: one per address tried
    codes = {getattr(e, "errno", None) for e in errors.values()} if isinstance(errors, dict) and errors else \
        {getattr(exc, "errno", None)}
    if codes == {errno.ECONNREFUSED}:
        return DeployError(f"{label}: connection refused by {'jump host ' + jump + ' ' if jump else ''}{conn.host} "
                           f"port {conn.port} (nothing listens there)", code=Code.CONNECT,
                           hint=f"check {'ssh.jump' if jump else 'ssh.port'} in {inv} and that sshd runs on the "
                           f"host; {verbose}")
    if codes & {errno.EHOSTUNREACH, errno.ENETUNREACH}:
        return DeployError(f"{label}: no route to {conn.host} ({what})", code=Code.CONNECT,
                           hint=f"check ssh.host / ssh.jump in {inv} and this machine's network (VPN?); {verbose}")
    if isinstance(exc, paramiko.SSHException) and "banner" in str(exc):
        # paramiko says the same when a link is cut before the server's banner arrived as when
        # something else listens: either way it came before the authentication.
        return DeployError(f"{label}: {what} does not answer as an SSH server ({exc}); {unchanged}", code=Code.CONNECT,
                           hint=f"check {'ssh.jump' if jump else 'ssh.port'} in {inv}: something else listens "
                           f"there; {verbose}")
    if isinstance(exc, EOFError) or not str(exc):
        return DeployError(f"{label}: the connection to {what} was closed during the SSH handshake (by the "
                           f"network or the host); {unchanged}", code=Code.CONNECT, hint=f"rerun; {verbose}")
    return DeployError(f"{label}: cannot connect to {what}: {exc}; {unchanged}", code=Code.CONNECT, hint=verbose)


# getaddrinfo's "this name does not exist" (not "try again": EAI_AGAIN is a resolver outage).
_NO_SUCH_NAME = frozenset(getattr(socket, n) for n in ("EAI_NONAME", "EAI_NODATA") if hasattr(socket, n))


def _hops(conn) -> list:
    """``conn``'s jump hops, the first written first, then ``conn`` itself."""
    chain = []
    while conn is not None and not isinstance(conn, str):
        chain.append(conn)
        conn = conn.gateway or None
    return chain[::-1]


def transport_for(host: Host, *, trust_new_host: bool = False) -> Transport:
    return LocalTransport() if host.is_local else SSHTransport(host, trust_new_host=trust_new_host)


# ---------------------------------------------------------------- the agent session


class AgentFailed(DeployError):
    """The agent refused or failed a request; ``reply`` (its evidence) holds its JSON answer.
    A reply that says ``unchanged`` (the agent switched back all it had switched) is
    ``Changed.NO`` whatever its code."""

    def __init__(self, message: str, reply: dict, **kw):
        if reply.get("unchanged") is True:
            kw.setdefault("changed", Changed.NO)
        super().__init__(message, evidence={"reply": reply}, **kw)

    @property
    def reply(self) -> dict:
        return dict(self.evidence["reply"])


class ProgramSession:
    """One host program on one host, started over ``transport`` (which the caller opens).

    ``__enter__`` starts ``python -c BOOTSTRAP`` (under ``sudo -n`` only when ``sudo``) and
    uploads the program; ``send`` writes JSON lines, ``read`` reads one JSON line within a
    deadline. A program that ends without a line is one error naming the step, its exit
    code and its last stderr line; one whose interpreter cannot even start (exit 126/127
    before any reply) says which ``host.python`` to fix.
    """

    def __init__(self, transport: Transport, host: Host, program: HostProgram, *, sudo: bool = False,
                 label: str | None = None):
        self.transport, self.host, self.program, self.sudo = transport, host, program, sudo
        self.label = label or host.name
        self.proc: Process | None = None
        self.received = 0  # lines read so far: none means the program may never have started
        self.uploaded = False  # the program's source was handed to the link whole
        self.waiting_for: str | None = None  # what the current read waits for (messages)
        self._wait: int | None = None  # its registration with inflight (Ctrl-C's line, link dropped)

    def __enter__(self):
        inflight.check(self.label)
        self.proc = self.transport.start(program_argv(self.host, sudo=self.sudo))
        self._wait = inflight.enter(self.label, self.interrupted_state, self.detach)
        try:
            source = self.program.source()
            self.write(b"%d\n" % len(source) + source, f"while uploading {self.program.name}")
            self.uploaded = True
        except BaseException as exc:
            self.__exit__(type(exc), exc, None)
            raise
        return self

    def __exit__(self, *exc):
        if self._wait is not None:
            # Ctrl-C in this thread: its line is noted and the link dropped (detach), so the
            # close below never waits on a silent host for the exit status.
            inflight.leave(self._wait, interrupted=len(exc) > 1 and isinstance(exc[1], KeyboardInterrupt))
            self._wait = None
        if self.proc is not None:
            self.proc.close()
            self.proc = None

    def interrupted_state(self) -> str:
        """Ctrl-C's line for this session: what it waited for, what that leaves, what to run."""
        during = f"waiting for {self.waiting_for}" if self.waiting_for else "between two requests"
        return (f"interrupted {during}: {self.lost_state()}; {next_step.status(self.host.name)} shows where the "
                "host stands")

    def write(self, data: bytes, during: str) -> None:
        """Write raw bytes; a lost connection says what was being sent (``during``)."""
        if self.proc is None:
            raise DeployError(f"{self.label}: {self.program.name} is not running", code=Code.CONNECTION_LOST)
        inflight.check(self.label)  # after Ctrl-C a woken worker sends nothing more
        try:
            self.proc.write(data)
        except DeployError as exc:
            if exc.code == Code.CONNECTION_LOST:
                # The interpreter may not even have started: the shell's exit 127 closes the
                # channel while the upload is still being written, and the write loses that race.
                raise self._no_interpreter() or self._lost_during(exc, during) from None
            raise

    def _lost_during(self, exc: DeployError, during: str) -> DeployError:
        """The link's loss (``exc``: its cause in words) said with what was under way and
        what that leaves on the host, which only this session knows."""
        return link_lost(self.label, str(exc.evidence.get("why") or "the connection was closed"), during,
                         state=self.lost_state(), changed=self.lost_changed())

    def _no_interpreter(self) -> DeployError | None:
        """The host's Python could not be run (the shell's exit 126/127 before any reply),
        when that is why the link closed; else None. Waits briefly for the exit status:
        OpenSSH sends it before it closes the channel, so a closed channel already has it."""
        if self.received or self.proc is None:
            return None
        ended = self.proc.ended(EXIT_STATUS_WAIT_S)
        if ended is None or ended[0] not in (126, 127):
            return None
        return self._python_error(*ended)

    def _python_error(self, code: int, tail: str) -> DeployError:
        """The shell could not run the interpreter (exit 126/127): nothing ran on the host."""
        detail = tail.strip().splitlines()[-1] if tail.strip() else "no output"
        return DeployError(
            f"{self.label}: cannot run the host's Python {self.host.python!r} (exit {code}; {detail})",
            code=Code.AGENT, hint=f"set host.python in {self.host.source or 'the inventory'} to an interpreter "
            "on the host that has sglang installed (`command -v python3` there shows one)")

    def send(self, *docs: dict, during: str = "while sending a request") -> None:
        """JSON lines, in one write."""
        self.write(b"".join(json.dumps(d).encode() + b"\n" for d in docs), during)

    def read(self, deadline: float | None = None, what: str = "a reply", during: str | None = None) -> dict:
        """One JSON line (``what``, read ``during`` a step: both for messages).
        ``deadline`` (time.monotonic): TimeoutError past it (the caller words it, it knows
        the step's limit); ReplyError for an oversized line."""
        if self.proc is None:
            raise DeployError(f"{self.label}: {self.program.name} is not running", code=Code.CONNECTION_LOST)
        during = during or what
        self.waiting_for = during
        try:
            line = self.proc.readline(deadline, what)
        except DeployError as exc:
            if exc.code == Code.CONNECTION_LOST and not isinstance(exc, ReplyError):
                raise self._no_interpreter() or self._lost_during(exc, f"waiting for {during}") from None
            raise
        if not line.endswith(b"\n"):
            raise self._stopped(during)
        self.waiting_for = None
        self.received += 1
        try:
            return json.loads(line)
        except (ValueError, RecursionError):  # RecursionError: nested past what json.loads can recurse
            raise DeployError(f"{self.label}: {self.program.name} answered garbage: {line[:200]!r}",
                              code=self.program.code) from None

    def _stopped(self, during: str) -> DeployError:
        proc, self.proc = self.proc, None
        code, tail = proc.close() if proc is not None else (None, "")  # None: dropped by a Ctrl-C meanwhile
        detail = tail.strip().splitlines()[-1] if tail.strip() else "no output"
        if code in (None, -1) and not tail.strip():
            # No exit status at all: the program did not stop, the link did (paramiko's -1
            # is "the channel closed without one").
            return DeployError(f"{self.label}: connection lost waiting for {during} (the link closed without an "
                               f"exit status from the host); {self.lost_state()}",
                               code=Code.CONNECTION_LOST, changed=self.lost_changed(), hint=f"run {next_step.status(self.host.name)} to see "
                               "where the host stands, then rerun")
        if self.received == 0 and code in (126, 127):
            return self._python_error(code, tail)
        return DeployError(f"{self.label}: {self.program.name} stopped during {during} (exit {code}; {detail}); "
                           f"{self.lost_state()}",
                           code=self.program.stopped_code or self.program.code, hint=self.program.stopped_hint)

    def lost_state(self) -> str:
        """What a link lost (or a program stopped) now leaves on the host, in words."""
        if not self.uploaded:
            return f"{self.program.name} never started: nothing on the host changed"
        return self.program.lost_state

    def lost_changed(self) -> Changed:
        """``lost_state`` as the error's ``changed``: a program that never started changed
        nothing; one that runs on alone may."""
        return Changed.NO if not self.uploaded else Changed.MAYBE

    def abort(self) -> None:
        """Stop waiting now: kill a local program, close an SSH channel."""
        if self.proc is not None:
            self.proc.abort()
            self.proc = None

    def detach(self) -> None:
        """Stop listening, leave the program running to finish on its own (it ignores the
        hangup, and every wait of its own has a deadline: the smoke program then stops
        the server it started)."""
        if self.proc is not None:
            self.proc.detach()
            self.proc = None


class AgentSession(ProgramSession):
    """The deploy agent's session: one agent process on one host for the whole command.

    ``call(*requests)`` pipelines the requests (one write) and reads one answer per
    request: one round trip however many requests or files.
    """

    def __init__(self, transport: Transport, host: Host, op_timeout: float | None = None):
        super().__init__(transport, host, AGENT, sudo=host.sudo, label=transport.label)
        self.round_trips = 0
        self.unanswered: list[str] = []  # the ops sent whose replies have not been read yet
        self.holds_lock = False  # a lock reply said ok, no unlock reply since
        # What this session's answered requests did on the host, for the line a lost link or
        # Ctrl-C leaves (lost_state): the apply that switched files (its kind and the journal
        # phase it left), and a server restart recorded as begun and not yet ended.
        self.switched: tuple[str, str] | None = None
        self.restarting = False
        # Seconds each round trip may take (None: the host's inventory op_timeout, else
        # DEFAULT_OP_TIMEOUT). A silent host fails the call, naming host and step.
        self.op_timeout = op_timeout

    def call(self, *requests: dict, timeout: float | None = None) -> list[dict]:
        """Send ``requests`` in one write, read one reply each, all within ``timeout`` seconds."""
        if self.proc is None:
            raise DeployError(f"{self.transport.label}: the agent session is closed", code=Code.CONNECTION_LOST)
        limit = timeout or self.op_timeout or self.host.op_timeout or DEFAULT_OP_TIMEOUT
        deadline = time.monotonic() + limit
        # The agent gives up on a guard another agent holds (and says which process) well
        # within this deadline, so that its answer arrives (lock.GUARD_WAIT_S at most).
        requests = tuple(dict(r, guard_wait_s=min(GUARD_WAIT_S, limit / 3)) if r.get("op") == "init" else r
                         for r in requests)
        ops = "+".join(str(r.get("op")) for r in requests)
        self.unanswered = [str(r.get("op")) for r in requests]
        self.send(*requests, during=f"while sending {ops}")
        self.round_trips += 1
        replies = []
        for request in requests:
            op = request.get("op")
            try:
                replies.append(self.read(deadline, f"the reply to {op}", during=op))
                self.unanswered.pop(0)
                self._note(request, replies[-1])
            except TimeoutError:
                self.abort()
                raise DeployError(
                    f"{self.transport.label}: no answer from the host agent during {op} after {limit:g} s",
                    code=Code.TIMEOUT, step=str(op), changed=self.lost_changed(),
                    hint=f"the host may be hung or overloaded; raise host.op_timeout in "
                    f"{self.host.source or 'the inventory'} if {op} is just slow there, then run "
                    f"{next_step.status(self.host.name)}") from None
            except ReplyError:
                self.abort()
                raise
        return replies

    def one(self, request: dict) -> dict:
        return self.call(request)[0]

    def _note(self, request: dict, reply: dict) -> None:
        """Keep what an answered request did (lost_state says it if the link goes next); give a
        refusal the hint only this session can word (it knows the host)."""
        if isinstance(reply, dict) and reply.get("code") == Code.NO_SGLANG:
            reply.setdefault("hint", next_step.python_that_imports_sglang(self.host.source, local=self.host.is_local))
        op, ok = request.get("op"), bool(reply.get("ok"))
        if op in ("lock", "unlock"):
            self.holds_lock = op == "lock" and ok
        elif op == "apply" and ok:
            self.switched = (str(request.get("kind") or "apply"), str(request.get("final_phase")))
        elif op == "mark" and ok and self.switched is not None:
            self.switched = (self.switched[0], str(request.get("phase")))
        elif op == "served" and ok:
            self.restarting = (request.get("serve") or {}).get("state") == "restarting"

    def interrupted_state(self) -> str:
        self.waiting_for = "+".join(self.unanswered) or None
        return super().interrupted_state()

    def lost_state(self) -> str:
        """A lost link during the ops in flight: what the agent (which ignores the hangup,
        finishes the request it has and releases its lock at EOF) leaves on the host."""
        if not self.uploaded:
            return super().lost_state()
        writing = [op for op in self.unanswered if op in WRITE_OPS]
        if writing:
            return (f"the host agent goes on alone: if it got the whole {writing[0]} request it completes it "
                    f"(the journal says how far), else nothing changed; {next_step.status(self.host.name)} "
                    "shows which")
        held = " (a deploy lock it took is released when the agent sees the link close)" \
            if self.holds_lock or "lock" in self.unanswered else ""
        restart = ("; a server restart is under way (the server may be down or restarting): the host's serve "
                   "program completes it and records its end" if self.restarting else "")
        if self.switched is None:
            return f"no file on the host was changed{restart}{held}"
        kind, phase = self.switched
        did = ("this run rolled the files back" if kind == "rollback" else f"this run's {kind} switched the files")
        did += f" (journal phase `{phase}`" + (": not deployed)" if phase == Phase.SWITCHED else ")")
        return f"{did}{restart}; nothing more was changed{held}"

    def lost_changed(self) -> Changed:
        """``lost_state`` as the error's ``changed``: a write in flight may have landed; a
        switch this session made, or a restart under way, changed the host; else nothing."""
        if not self.uploaded:
            return super().lost_changed()
        if any(op in WRITE_OPS for op in self.unanswered):
            return Changed.MAYBE
        if self.switched is not None or self.restarting:
            return Changed.YES
        return Changed.NO


class AgentRefusedInput(AgentFailed):
    """The agent refused the inventory's input (e.g. a state_dir that is not ours): exit 2."""

    exit_code = BadInput.exit_code


#: Agent ops that change the host (a link lost while one is in flight leaves it unknown).
WRITE_OPS = frozenset({"apply", "mark", "lock_release"})

#: Agent codes that mean "the inventory is wrong", not "the host failed".
BAD_INPUT_CODES = frozenset({Code.BAD_STATE_DIR})


def expect_ok(reply: dict, label: str, what: str) -> dict:
    """A reply's payload, or an AgentFailed carrying the agent's code and message."""
    if reply.get("ok"):
        return reply
    cls = AgentRefusedInput if reply.get("code") in BAD_INPUT_CODES else AgentFailed
    code = reply.get("code") or Code.AGENT
    # The inventory's python is not the one that imports sglang: say which one does.
    hint = (reply.get("hint") or next_step.python_that_imports_sglang()) if code == Code.NO_SGLANG else None
    raise cls(prefixed(str(reply.get("message")), label, what), reply, code=code, hint=hint, host=label, step=what)


__all__ = [
    "AGENT",
    "AgentFailed",
    "AgentSession",
    "BOOTSTRAP",
    "CONTAINER_PROGRAM",
    "HostKeyRefused",
    "HostProgram",
    "ProgramSession",
    "LocalTransport",
    "SSHTransport",
    "Transport",
    "agent_argv",
    "agent_source",
    "expect_ok",
    "fingerprint",
    "program_argv",
    "remote_command",
    "transport_for",
]
