"""A real OpenSSH sshd on loopback, and the sandbox hosts it serves.

Used by the demo (``python -m ddtree_deploy.demo``), the benchmarks and the tests:

    with SSHServer(tmp) as sshd:                  # own host keys, port, authorized key
        host = sshd.add_host("h1", tmp / "h1")    # own venv + site-packages with SGLang 0.5.12.post1
        host.inventory()                          # writes <hosts dir>/h1.toml for the CLI

The client side never touches the user's ~/.ssh: each server has its own known_hosts,
identity file and (empty) ssh config, all named in the generated inventory.
Nothing here is a stand-in: sshd is OpenSSH, the SGLang files come from the release wheel.
sshd runs as the current user (no root needed), on 127.0.0.1 only.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from ddtree_deploy.sandbox.hostenv import make_python_env

SSHD = "/usr/sbin/sshd"
#: Ports tried before giving up (a port is lost only when someone binds it in between).
PORT_ATTEMPTS = 5


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _listener_pid_is(port: int, pid: int | None) -> bool:
    """Whether the socket listening on 127.0.0.1:``port`` belongs to process ``pid`` (None:
    whether any process listens there). Read from /proc: the listening socket's inode in
    /proc/net/tcp, and the process's file descriptors that point at it."""
    want = f"0100007F:{port:04X}"
    inodes = set()
    try:
        with open("/proc/net/tcp") as table:
            next(table)
            for line in table:
                fields = line.split()
                if fields[1] == want and fields[3] == "0A":  # 0A: LISTEN
                    inodes.add(f"socket:[{fields[9]}]")
    except OSError:
        return False
    if pid is None or not inodes:
        return bool(inodes)
    fd_dir = f"/proc/{pid}/fd"
    try:
        names = os.listdir(fd_dir)
    except OSError:
        return False
    for name in names:
        try:
            if os.readlink(f"{fd_dir}/{name}") in inodes:
                return True
        except OSError:
            continue
    return False


def require_openssh() -> None:
    """sshd and ssh-keygen are there, or one clear line naming the package (under pytest a
    plain failure without a traceback; the demo gets a RuntimeError it reports)."""
    missing = [name for name, path in (("sshd", SSHD), ("ssh-keygen", shutil.which("ssh-keygen")))
               if not path or not os.access(path, os.X_OK)]
    if not missing:
        return
    message = (f"{' and '.join(missing)} not found (sshd is looked for at {SSHD}): install openssh-server "
               f"(apt-get install -y openssh-server; `make test` does it when run as root)")
    if "pytest" in sys.modules:
        import pytest

        pytest.fail(message, pytrace=False)
    raise RuntimeError(message)


@dataclass
class SandboxHost:
    """One host served by an SSHServer: its own interpreter, package root and state dir."""

    __test__ = False  # never collected by pytest, whatever a test module names it

    name: str
    server: "SSHServer"
    python: Path
    site: Path  # the package root (holds sglang/)
    state_dir: Path
    extra: dict = field(default_factory=dict)

    def file(self, rel: str) -> Path:
        return self.site / rel

    def read(self, rel: str) -> bytes | None:
        p = self.file(rel)
        return p.read_bytes() if p.exists() else None

    def inventory(self, hosts_dir: Path | None = None, *, port: int | None = None,
                  smoke_levels: list[str] | None = None, **host_keys) -> Path:
        """Write ``<hosts_dir>/<name>.toml`` for this host and return its path.

        ``smoke_levels``: when given, a ``[smoke]`` table with those levels (``[]``: no smoke
        after push); else no table (the smoke's defaults apply, or append your own).
        """
        hosts_dir = hosts_dir or self.server.hosts_dir
        hosts_dir.mkdir(parents=True, exist_ok=True)
        s = self.server
        table = {"python": str(self.python), "state_dir": str(self.state_dir), **host_keys}
        lines = [
            "[ssh]",
            'host = "127.0.0.1"',
            f'user = "{s.user}"',
            f"port = {port or s.port}",
            f"identity_file = {_toml_str(s.identity)}",
            f"known_hosts = {_toml_str(s.known_hosts)}",
            f"ssh_config = {_toml_str(s.ssh_config)}",
            # A loopback handshake, but a loaded 2-core machine can take seconds over it: the
            # budget must not be what decides whether a test connects (issue 28 item 7).
            "connect_timeout = 30",
            "",
            "[host]",
        ]
        for k, v in table.items():
            lines.append(f"{k} = {_toml_value(v)}")
        if smoke_levels is not None:
            lines += ["", "[smoke]", "levels = [" + ", ".join(_toml_str(x) for x in smoke_levels) + "]"]
        path = hosts_dir / f"{self.name}.toml"
        path.write_text("\n".join(lines) + "\n")
        return path


def _toml_str(value) -> str:
    return '"' + str(value).replace("\\", "\\\\").replace('"', '\\"') + '"'


def _toml_value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    return _toml_str(v)


class SSHServer:
    """OpenSSH's sshd on 127.0.0.1:<free port>, with generated keys; killed on exit."""

    def __init__(self, workdir: Path, env: dict[str, str] | None = None):
        self.dir = Path(workdir)
        # Environment of every session (sshd's SetEnv): what a host's own login would set
        # (the container tests: podman's configuration files).
        self.env = dict(env or {})
        self.dir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.user = os.environ.get("USER") or __import__("getpass").getuser()
        self.identity = self.dir / "client_ed25519"
        self.known_hosts = self.dir / "known_hosts"
        self.ssh_config = self.dir / "ssh_config"
        self.hosts_dir = self.dir / "hosts"
        self.host_key = self.dir / "ssh_host_ed25519_key"
        self.proc: subprocess.Popen | None = None

    def __enter__(self) -> "SSHServer":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self) -> None:
        require_openssh()
        keygen = ["ssh-keygen", "-q", "-t", "ed25519", "-N", ""]
        subprocess.run([*keygen, "-f", str(self.host_key)], check=True)
        subprocess.run([*keygen, "-f", str(self.identity)], check=True)
        shutil.copy(f"{self.identity}.pub", self.dir / "authorized_keys")
        self.ssh_config.write_text("")  # never the user's own ~/.ssh/config
        Path("/run/sshd").mkdir(exist_ok=True)  # sshd's privilege-separation directory
        # free_port() only names a port that was free a moment ago: another process (a
        # parallel test worker's sshd or server) may bind it before our sshd does. Then
        # ours exits, or the banner we see is the other one's: take a new port and retry.
        for _attempt in range(PORT_ATTEMPTS):
            if self._start_on(self.port):
                return
            self.port = free_port()
        raise RuntimeError(f"sshd did not start: {PORT_ATTEMPTS} ports were taken before it could bind one")

    def _start_on(self, port: int) -> bool:
        """Start sshd on ``port``; False when the port was taken by someone else."""
        self.known_hosts.write_text("")
        self.trust()
        config = self.dir / "sshd_config"
        config.write_text(
            "\n".join([
                f"Port {port}",
                "ListenAddress 127.0.0.1",
                f"HostKey {self.host_key}",
                f"PidFile {self.dir / 'sshd.pid'}",
                f"AuthorizedKeysFile {self.dir / 'authorized_keys'}",
                "StrictModes no",
                "PubkeyAuthentication yes",
                "PasswordAuthentication no",
                "KbdInteractiveAuthentication no",
                "PermitRootLogin prohibit-password",
                "UsePAM no",
                "MaxStartups 50",
                "MaxSessions 50",
                "LogLevel ERROR",
                "Subsystem sftp internal-sftp",
                *([f"SetEnv {' '.join(f'{k}={v}' for k, v in sorted(self.env.items()))}"] if self.env else []),
                "",
            ])
        )
        self.log = open(self.dir / "sshd.log", "wb")
        self.proc = subprocess.Popen([SSHD, "-D", "-e", "-f", str(config)], stdout=self.log,
                                     stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + 10
        while True:
            if _listener_pid_is(port, self.proc.pid):
                try:
                    with socket.create_connection(("127.0.0.1", port), timeout=0.5) as s:
                        if s.recv(4).startswith(b"SSH-"):
                            return True
                except OSError:
                    pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                log = (self.dir / "sshd.log").read_text(errors="replace")
                if "Address already in use" in log or _listener_pid_is(port, None):
                    return False
                raise RuntimeError(f"sshd did not start: {log[-2000:]}")
            time.sleep(0.05)

    def host_key_line(self, port: int | None = None) -> str:
        pub = Path(f"{self.host_key}.pub").read_text().split()
        return f"[127.0.0.1]:{port or self.port} {pub[0]} {pub[1]}\n"

    def trust(self, port: int | None = None) -> None:
        """Record this server's key in the client's known_hosts (for ``port``, e.g. a proxy's)."""
        with open(self.known_hosts, "a") as f:
            f.write(self.host_key_line(port))

    def forget(self) -> None:
        self.known_hosts.write_text("")

    def stop(self) -> None:
        if self.proc is not None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)  # sshd and its session children
            except ProcessLookupError:
                pass
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
            self.proc = None
            self.log.close()

    def add_host(self, name: str, root: Path, files: list[str] | None = None) -> SandboxHost:
        """A new host on this server: its own venv, site-packages and state folder under ``root``."""
        python, site = make_python_env(Path(root) / "env", files)
        return SandboxHost(name=name, server=self, python=python, site=site, state_dir=Path(root) / "state")
