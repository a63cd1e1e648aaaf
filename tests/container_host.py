"""A ``[container]`` host for the end-to-end tests: Debian's podman (runc as its runtime), the
test image and a container of it serving the named STAND-IN server, driven over a real sshd
on loopback by the container program, as on a host whose SGLang runs in a container.

The image: a minimal Debian tree with python3 (ddtree_testkit/containers.py: debootstrap,
built once per machine and cached) plus SGLang 0.5.12.post1's real files from its wheel and
the STAND-IN server (ddtree_testkit/standin_server.py, NOT SGLang), which runs inside the
container as the serving process. Shared by tests/e2e/test_container_ssh.py and
tests/e2e/test_container_driver_ssh.py; each module has its own sshd (``sshd``: with
``engine``'s environment, and whatever PATH it needs) and, through ``engine``, its own podman
storage. podman is flaky when run in parallel: run these modules without xdist.

    from container_host import IMAGE, Box, cli  # the fixtures box, engine, cli_env: conftest.py's
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ddtree_deploy.sandbox import SSHServer, free_port
from ddtree_testkit import containers as ct
from serve_host import StandinProbes
from sshd_host import DEPLOY_SERIES, SPEC, UTILS

IMAGE = "localhost/ddtree-test/sglang:0.5.12.post1"
IMAGE13 = "localhost/ddtree-test/sglang:0.5.13"
BUDGET = 8


@pytest.fixture(scope="module")
def engine(tmp_path_factory, release_wheel):
    """podman with a storage of the module's own, the test image built in it; reset at the end."""
    ct.require_podman()
    work = tmp_path_factory.mktemp("engine")
    env = ct.engine_env(work / "podman")
    with pytest.MonkeyPatch.context() as mp:
        for k, v in env.items():
            mp.setenv(k, v)
        ct.build_images(env, release_wheel, [SPEC, UTILS], work, IMAGE)
        yield env
        ct.reset(env)


@pytest.fixture
def cli_env(sshd, tmp_path, monkeypatch):
    monkeypatch.setenv("DDTREE_DEPLOY_PATCHES", str(DEPLOY_SERIES / "patches"))
    monkeypatch.setenv("DDTREE_DEPLOY_SNAPSHOT", str(tmp_path / "snapshot"))
    monkeypatch.setenv("DDTREE_DEPLOY_HOSTS", str(sshd.hosts_dir))
    return dict(os.environ)


class Box(StandinProbes):
    """One container host: a container of the test image serving the stand-in, its inventory."""

    def __init__(self, sshd: SSHServer, env: dict, root: Path, name: str, *, image: str = IMAGE,
                 unhealthy_with: str | None = None, serve: dict | None = None, container: dict | None = None,
                 extra_argv: list[str] | None = None, tables: str = ""):
        self.sshd, self.env, self.name, self.image = sshd, env, name, image
        self.port = free_port()
        self.argv = ["python3", "/opt/standin/standin_server.py", "--model-path", "/models/target",
                     "--speculative-algorithm", "DDTREE", "--speculative-ddtree-budget", str(BUDGET),
                     "--port", str(self.port), "--package-file", SPEC]
        if unhealthy_with:
            self.argv += ["--unhealthy-with", unhealthy_with]
        self.argv += list(extra_argv or ())  # e.g. the speed model (test_a_slower_image_is_put_back_by_the_analysis)
        self.state_dir = root / "state"
        table = {"engine": "podman", "name": name, "stop_timeout_s": 5, **(container or {})}
        serve_table = {"url": f"http://127.0.0.1:{self.port}", "ready_timeout_s": 20, "poll_s": 0.2,
                       "budget": BUDGET, **(serve or {})}
        s = sshd
        lines = ["[ssh]", 'host = "127.0.0.1"', f'user = "{s.user}"', f"port = {s.port}",
                 f'identity_file = "{s.identity}"', f'known_hosts = "{s.known_hosts}"',
                 f'ssh_config = "{s.ssh_config}"', "connect_timeout = 30", "", "[host]",
                 f'python = "{sys.executable}"', f'state_dir = "{self.state_dir}"', "", "[container]"]
        lines += [f"{k} = {json.dumps(v)}" for k, v in table.items()]
        lines += ["", "[serve]"] + [f"{k} = {json.dumps(v)}" for k, v in serve_table.items()]
        s.hosts_dir.mkdir(parents=True, exist_ok=True)
        self.inventory = s.hosts_dir / f"{name}.toml"
        self.inventory.write_text("\n".join(lines) + "\n" + tables)

    def run(self, image: str | None = None) -> str:
        """`podman run` the serving container (its run configuration: what a push must carry)."""
        out = ct.podman(self.env, "run", "-d", "--init", "--name", self.name, "--network", "host",
                        "--label", "team=inference", "--env", "SGLANG_TEST=1", "--restart", "on-failure:2",
                        image or self.image, *self.argv)
        return out.stdout.decode().strip()

    def image_id(self) -> str:
        return ct.podman(self.env, "image", "inspect", "--format", "{{.Id}}", self.image).stdout.decode().strip()

    def inspect(self, name: str | None = None) -> dict | None:
        proc = ct.podman(self.env, "container", "inspect", name or self.name, check=False)
        return json.loads(proc.stdout)[0] if proc.returncode == 0 else None

    def remove(self) -> None:
        for n in (self.name, self.name + "-ddtree-prev"):
            ct.podman(self.env, "rm", "-f", n, check=False)


@pytest.fixture
def box(sshd, engine, tmp_path, cli_env):
    made: list[Box] = []

    def make(name: str, run: bool = True, **kw) -> Box:
        b = Box(sshd, engine, tmp_path / name, name, **kw)
        made.append(b)
        if run:
            b.run()
            if not kw.get("unhealthy_with"):
                b.wait_healthy()
        return b

    yield make
    for b in made:
        b.remove()


def cli(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """The console script, as a user runs it (its own process: Ctrl-C tests signal it)."""
    return subprocess.run([sys.executable, "-m", "ddtree_deploy", *args], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "COLUMNS": "200"})


__all__ = ["BUDGET", "Box", "IMAGE", "IMAGE13", "box", "cli", "cli_env", "engine"]
