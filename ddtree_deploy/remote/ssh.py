"""The SSH transport: one connection per host per command, through fabric (ssh_config,
ProxyJump), strict host keys on every hop (host_keys.py), keepalives, and the program's
channel read in bounded lines. Only this module and host_keys.py import fabric/paramiko.
"""

from __future__ import annotations

import logging
import shlex
import socket
import time
from pathlib import Path

from ddtree_deploy.base.errors import BadInput, DeployError
from ddtree_deploy.base.fsutil import NotARegularFile, check_regular, read_regular
from ddtree_deploy.remote import inflight
from ddtree_deploy.remote.host_keys import HostKeyRefused, changed_key, load_host_keys, strict_policy
from ddtree_deploy.remote.link import DEFAULT_IO_TIMEOUT, LineReader, Process, Transport, process_age_s
from ddtree_deploy.remote.link_errors import connect_error, connection_lost
from ddtree_deploy.settings.inventory import (
    MAX_IDENTITY_BYTES,
    MAX_KNOWN_HOSTS_BYTES,
    MAX_SSH_CONFIG_BYTES,
    Host,
    SSHTarget,
    key_error,
)

_QUIET = logging.NullHandler()
KEEPALIVE_S = 15  # SSH keepalive interval: a dead peer is noticed, an idle NAT entry kept


def remote_command(argv: list[str]) -> str:
    """An argv as the one string an SSH exec request carries, every word quoted."""
    return shlex.join(argv)


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


class SSHTransport(Transport):
    """One SSH connection per host per command, through fabric (ssh_config, ProxyJump).

    Host keys are checked strictly against ``known_hosts``: an unknown key is refused
    with its fingerprint unless ``trust_new_host`` (then recorded); a changed key is
    always refused. Fabric's default (auto-add) is replaced on every hop.
    """

    def __init__(self, host: Host, *, trust_new_host: bool = False, io_timeout: float = DEFAULT_IO_TIMEOUT):
        if host.ssh is None:
            raise BadInput(f"host {host.name}: has no [ssh] table")
        super().__init__()
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
        t = self.target
        data = self._named_file("ssh.known_hosts", t.known_hosts, MAX_KNOWN_HOSTS_BYTES)
        if data is not None:
            load_host_keys(client.get_host_keys(), data)
        client.set_missing_host_key_policy(strict_policy(self.label, Path(t.known_hosts).expanduser(),
                                                         trust_new_host=self.trust_new_host))

    def open(self) -> None:
        if self.conn is not None:
            return
        inflight.check(self.label)
        age = process_age_s()
        if age is not None:
            self.timings.append(("cli start", age))  # the process's start up to this connect
        t0 = time.monotonic()
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
        self.timings.append(("connect", time.monotonic() - t0))
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
        return changed_key(self.label, conn.host, conn.port, Path(self.target.known_hosts).expanduser(), exc)

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


def _hops(conn) -> list:
    """``conn``'s jump hops, the first written first, then ``conn`` itself."""
    chain = []
    while conn is not None and not isinstance(conn, str):
        chain.append(conn)
        conn = conn.gateway or None
    return chain[::-1]


__all__ = ["KEEPALIVE_S", "SSHTransport", "remote_command"]
