"""Test hosts: a real sshd on loopback and per-host Python envs with real SGLang files.

Reusable by every end-to-end test (push, smoke, fleets):

    with SSHServer(tmp) as sshd:                  # own host keys, port, authorized key
        host = sshd.add_host("h1", tmp / "h1")    # own venv + site-packages with SGLang 0.5.12.post1
        host.inventory()                          # writes <hosts dir>/h1.toml for the CLI

The client side never touches the user's ~/.ssh: each server has its own known_hosts,
identity file and (empty) ssh config, all named in the generated inventory.
Nothing here is a stand-in: sshd is OpenSSH, the SGLang files come from the release wheel.
"""

from __future__ import annotations

import glob
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

SGLANG_VERSION = "0.5.12.post1"
SSHD = "/usr/sbin/sshd"

# The small real series the deploy tests push (tests/data/deploy_series): two patches, one add.
DEPLOY_SERIES = Path(__file__).resolve().parent / "data" / "deploy_series"
DEPLOY_FAMILY = DEPLOY_SERIES / "patches" / "sglang-0.5.12"
SPEC = "sglang/srt/speculative/spec_info.py"
UTILS = "sglang/srt/speculative/dflash_utils.py"
ADDED = "sglang/srt/speculative/ddtree_deploy_test_marker.py"


def sglang_wheel(version: str = SGLANG_VERSION) -> Path:
    """The cached release wheel (filled by the releases layer / `make install`)."""
    base = os.environ.get("DDTREE_DEPLOY_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "ddtree-deploy")
    hits = sorted(glob.glob(os.path.join(base, "wheels", f"sglang-{version}-*.whl")))
    if not hits:
        raise FileNotFoundError(f"no cached wheel for sglang {version} under {base}/wheels")
    return Path(hits[0])


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def make_python_env(dest: Path, files: list[str] | None = None, version: str = SGLANG_VERSION) -> tuple[Path, Path]:
    """A venv at ``dest`` whose site-packages holds SGLang's real files and dist-info.

    ``files``: package-relative paths to extract (plus every ``__init__.py`` on their way
    and sglang/version.py); None extracts the whole package. Returns (python, site-packages).
    """
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(dest)], check=True)
    site = Path(glob.glob(os.path.join(glob.escape(str(dest)), "lib", "python3*", "site-packages"))[0])
    wanted = None
    if files is not None:
        wanted = set(files) | {"sglang/__init__.py", "sglang/version.py"}
        for f in files:
            parts = f.split("/")
            for i in range(1, len(parts)):
                wanted.add("/".join(parts[:i]) + "/__init__.py")
    with zipfile.ZipFile(sglang_wheel(version)) as whl:
        for name in whl.namelist():
            if ".dist-info/" in name or (name.startswith("sglang/") and (wanted is None or name in wanted)):
                whl.extract(name, site)
    return dest / "bin" / "python", site


def require_openssh() -> None:
    """sshd and ssh-keygen are there, or one clear line naming the package (under pytest a
    plain failure without a traceback; scripts/demo.py gets a RuntimeError it reports)."""
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
class TestHost:
    """One host served by an SSHServer: its own interpreter, package root and state dir."""

    __test__ = False  # a helper, not a test class

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
            "connect_timeout = 5",
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

    def __init__(self, workdir: Path):
        self.dir = Path(workdir)
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
        self.trust()
        Path("/run/sshd").mkdir(exist_ok=True)  # sshd's privilege-separation directory
        config = self.dir / "sshd_config"
        config.write_text(
            "\n".join([
                f"Port {self.port}",
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
                "",
            ])
        )
        self.log = open(self.dir / "sshd.log", "wb")
        self.proc = subprocess.Popen([SSHD, "-D", "-e", "-f", str(config)], stdout=self.log,
                                     stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + 10
        while True:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as s:
                    if s.recv(4).startswith(b"SSH-"):
                        return
            except OSError:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"sshd did not start: {(self.dir / 'sshd.log').read_text()[-2000:]}")
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

    def add_host(self, name: str, root: Path, files: list[str] | None = None) -> TestHost:
        """A new host on this server: its own venv, site-packages and state folder under ``root``."""
        python, site = make_python_env(Path(root) / "env", files)
        return TestHost(name=name, server=self, python=python, site=site, state_dir=Path(root) / "state")


def deploy_series_oracle(server: SSHServer, work: Path) -> tuple[dict, dict]:
    """(pristine, patched) bytes per target of the small deploy series: the release files,
    and what GNU patch makes of them (plus the file the series adds)."""
    ref = server.add_host("oracle", work / "ref", files=[SPEC, UTILS])
    tree = work / "tree"
    shutil.copytree(ref.site / "sglang", tree / "sglang")
    for patch in sorted(DEPLOY_FAMILY.glob("*.patch")):
        subprocess.run(["patch", "-p1", "-s", "--no-backup-if-mismatch", "-i", str(patch)], cwd=tree, check=True)
    patched = {p: (tree / p).read_bytes() for p in (SPEC, UTILS)}
    patched[ADDED] = (DEPLOY_SERIES / "payload" / "ddtree_deploy_test_marker.py").read_bytes()
    return {SPEC: ref.read(SPEC), UTILS: ref.read(UTILS), ADDED: None}, patched
