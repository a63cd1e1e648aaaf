"""The demo: the whole job against a sandbox host built on this machine, then cleaned up.

    python -m ddtree_deploy.demo      # from a checkout (`make demo`) or an installed wheel

1. A sandbox "GPU host" without the GPU: a Python environment holding the real SGLang
   0.5.12.post1 files from the PyPI wheel (cached after the first download, so the demo
   runs offline afterwards), importing the rest of SGLang's CPU dependencies (torch,
   transformers, ...) from the environment running the demo: a checkout's .venv, or
   whatever an installed toolkit has beside it (checked first: one line when missing). It is reached through a real OpenSSH sshd on loopback when one can be
   started here, else through the local transport (said on screen).
2. The real commands, each printed before it runs, with their real output:
   check -> push (then the smoke levels the sandbox supports: compile, import, cli;
   launch needs a GPU) -> status -> rollback -> status.
3. Everything it made (sshd, sandbox, snapshots) lives in one temporary folder, removed
   at the end whatever happened; the repository (or the installed package) is left as it
   was, and the commands run in that folder, so nothing depends on the current directory.

The sandbox pieces are ddtree_deploy.sandbox (shared with the tests and benchmarks); the
tiny model configs come from the checkout's tests/data/models, or from the copy the wheel
carries under ddtree_deploy/_data/models (setup.py).
"""

from __future__ import annotations

import importlib.util
import os
import shlex
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

from ddtree_deploy.base.errors import DeployError
from ddtree_deploy.base.locations import PACKAGE_DATA, REPO_ROOT, in_checkout
from ddtree_deploy.release import releases
from ddtree_deploy.sandbox import SSHServer, make_host_env

VERSION = "0.5.12.post1"  # the release the DDTree series is made against
# Tiny model CONFIGS (no weights): enough for the cli level's validation.
MODELS = REPO_ROOT / "tests" / "data" / "models" if in_checkout() else PACKAGE_DATA / "models"
# The import level skips the worker module: it imports sgl_kernel, which needs CUDA libraries.
# Patched modules that import sgl_kernel (CUDA) at module level: the sandbox cannot import them.
NO_CUDA = ", ".join(f'"{m}"' for m in (
    "sglang.srt.speculative.dflash_worker", "sglang.srt.managers.scheduler"))


def say(text: str = "") -> None:
    print(text, flush=True)


def run(args: list[str], env: dict[str, str], cwd: Path) -> int:
    say(f"\n$ {shlex.join(['ddtree-deploy', *args])}")
    # The console script of this interpreter's environment (a venv, pipx), else the module.
    exe = Path(sys.executable).parent / "ddtree-deploy"
    argv = [str(exe)] if exe.is_file() else [sys.executable, "-m", "ddtree_deploy"]
    return subprocess.run([*argv, *args], env=env, cwd=cwd).returncode


def smoke_table() -> str:
    return textwrap.dedent(f"""
        [smoke]
        levels = ["compile", "import", "cli"]   # no GPU in the sandbox: no launch level
        import_exclude = [{NO_CUDA}]  # need CUDA libraries (sgl_kernel) to import
        timeout_s = 120

        [smoke.launch]
        # Read by the cli level's validation (the launch level itself is not run here).
        model = "{MODELS / 'tiny-llama'}"
        draft_model = "{MODELS / 'tiny-dflash-draft'}"
        budget = 32
        extra_args = ["--device", "cpu", "--attention-backend", "triton", "--skip-tokenizer-init"]
        gpu = false
    """)


def start_sshd(workdir: Path):
    """A loopback sshd for the sandbox, or (None, why not)."""
    server = SSHServer(workdir)
    try:
        server.start()
    except (OSError, RuntimeError, subprocess.CalledProcessError) as exc:
        server.stop()
        return None, str(exc).strip().splitlines()[-1] if str(exc).strip() else type(exc).__name__
    return server, None


def write_inventory(tmp: Path, python: Path, sshd) -> Path:
    state = tmp / "host-state"
    host = f'[host]\npython = "{python}"\nstate_dir = "{state}"\n'
    if sshd is None:
        head = 'transport = "local"\n'
    else:
        head = textwrap.dedent(f"""
            [ssh]
            host = "127.0.0.1"
            user = "{sshd.user}"
            port = {sshd.port}
            identity_file = "{sshd.identity}"
            known_hosts = "{sshd.known_hosts}"
            ssh_config = "{sshd.ssh_config}"
            connect_timeout = 5
        """)
    path = tmp / "hosts" / "sandbox.toml"
    path.parent.mkdir()
    path.write_text(head + host + smoke_table())
    return path


def missing_cpu_deps() -> list[str]:
    """SGLang's heavy CPU dependencies the sandbox host shares from this environment."""
    return [m for m in ("torch", "transformers") if importlib.util.find_spec(m) is None]


def main() -> int:
    started = time.monotonic()
    say(f"ddtree-deploy demo: deploy the DDTree series into SGLang {VERSION} on a sandbox host, "
        "smoke it, roll it back.")
    missing = missing_cpu_deps()
    if missing:
        say(f"demo: {', '.join(missing)} not importable here; the sandbox host imports SGLang's CPU "
            f"dependencies from this Python environment: install them beside ddtree-deploy "
            f"(a checkout's `make demo` does), then run the demo again")
        return 2
    try:
        wheel = releases.ensure_wheel(VERSION)
    except DeployError as exc:
        say(f"demo: cannot get the SGLang {VERSION} wheel: {exc.message}")
        return 1
    say(f"SGLang wheel: {wheel}")
    with tempfile.TemporaryDirectory(prefix="ddtree-demo-") as name:
        tmp = Path(name)
        env = make_host_env(tmp / "sandbox-env")
        say(f"sandbox host: {env.python} (SGLang {VERSION} files in {env.site_packages})")
        sshd, why = start_sshd(tmp / "sshd")
        try:
            if sshd is None:
                say(f"transport: LOCAL (no loopback sshd here: {why})")
            else:
                say(f"transport: SSH to a real sshd on 127.0.0.1:{sshd.port} (loopback, its own keys)")
            inventory = str(write_inventory(tmp, env.python, sshd))
            # Snapshots go to the sandbox too: the repository's snapshot/ is left alone.
            cli_env = {**os.environ, "DDTREE_DEPLOY_SNAPSHOT": str(tmp / "snapshot")}
            say("push runs the sandbox's smoke levels after its switch (compile, import, cli; "
                "launch needs a GPU), and rolls back by itself if one fails")
            steps = [
                ["check", "--release", VERSION],
                ["push", "--host", inventory],
                ["status", "--host", inventory],
                ["rollback", "--host", inventory],
                ["status", "--host", inventory],
            ]
            for args in steps:
                rc = run(args, cli_env, tmp)
                if rc != 0:
                    say(f"\ndemo: `ddtree-deploy {args[0]}` exited {rc}")
                    return rc
        finally:
            if sshd is not None:
                sshd.stop()
    say(f"\ndemo: done in {time.monotonic() - started:.0f} s; the sandbox and its sshd are gone.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
