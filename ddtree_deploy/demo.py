"""The demo: the whole job against a sandbox host built on this machine, then cleaned up.

    python -m ddtree_deploy.demo      # from a checkout (`make demo`) or an installed wheel
    python -m ddtree_deploy.demo --release 0.5.12.post1   # the v1 family's demo (make demo RELEASE=0.5.12.post1)

1. Which SGLang: the newest release on PyPI that a DDTree family covers (the listing is
   cached, so the demo runs offline after its first run), or the one --release names, and
   the family covering it; both said on screen with why. Today: SGLang 0.5.23 and the v2
   family (patches/sglang-0.5.20).
2. A sandbox "GPU host" without the GPU: a Python environment holding that release's real
   files from its PyPI wheel (cached after the first download), importing the rest of
   SGLang's CPU dependencies (the ``demo`` extra: torch, transformers, ..., and for the v2
   family xgrammar) from the environment running the demo: a checkout's .venv, or an
   installed toolkit's own (``pipx install '.[demo]'``; checked first: one line naming the
   ``pipx inject`` or ``pip install`` command that installs what is missing). It is
   reached through a real OpenSSH sshd on loopback when one can be started here, else
   through the local transport (said on screen).
3. The real commands, each printed before it runs, with their real output: check -> push
   (then the smoke levels the sandbox supports: compile, import, cli; launch needs a GPU)
   -> status -> history -> rollback -> status.
4. Everything it made (sshd, sandbox, snapshots) lives in one temporary folder, removed
   at the end whatever happened; the repository (or the installed package) is left as it
   was, and the commands run in that folder, so nothing depends on the current directory.

The sandbox pieces are ddtree_deploy.sandbox (shared with the tests and benchmarks); the
tiny model configs come from the checkout's tests/data/models, or from the copy the wheel
carries under ddtree_deploy/_data/models (setup.py).
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path

from ddtree_deploy.base.errors import BadInput, DeployError
from ddtree_deploy.base.locations import PACKAGE_DATA, REPO_ROOT, in_checkout
from ddtree_deploy.release import releases
from ddtree_deploy.release.cuda_lanes import lane_words
from ddtree_deploy.sandbox import SSHServer, make_host_env

# Tiny model CONFIGS (no weights): enough for the cli level's validation.
MODELS = REPO_ROOT / "tests" / "data" / "models" if in_checkout() else PACKAGE_DATA / "models"
#: SGLang's CPU dependencies the sandbox host shares from this environment are the ``demo``
#: extra's (pyproject.toml; base/install.py reads them): every one, but for a release older
#: than 0.5.20 those only the v2 DFlash worker imports (requirements/sglang-v2-cpu.txt's:
#: tests/e2e/test_demo.py keeps the two lists equal).
V2_ONLY = ("xgrammar",)
V2_SINCE = "0.5.20"
#: v1 families on 0.5.12/0.5.13: their patched dflash_worker and scheduler import sgl_kernel
#: (CUDA) at module level, so the sandbox's import level leaves them out. The v2 family's
#: modules all import on CPU.
NO_CUDA = {"sglang-0.5.12": ("sglang.srt.speculative.dflash_worker", "sglang.srt.managers.scheduler"),
           "sglang-0.5.13": ("sglang.srt.speculative.dflash_worker", "sglang.srt.managers.scheduler")}


@dataclass(frozen=True)
class Choice:
    """The release the demo deploys onto, the family covering it, and why (for the screen)."""

    version: str
    family: object  # series.FamilyInfo
    why: str


def say(text: str = "") -> None:
    """A line of the demo's own, broken between words at the terminal's width (as the CLI's
    result lines: a pipe without COLUMNS keeps lines whole)."""
    width = shutil.get_terminal_size((0, 0)).columns
    lines = text.split("\n")
    if width > 20:
        lines = [textwrap.fill(line, width, subsequent_indent="    ", break_long_words=False,
                               break_on_hyphens=False) if line else line for line in lines]
    print("\n".join(lines), flush=True)


def run(args: list[str], env: dict[str, str], cwd: Path) -> int:
    say(f"\n$ {shlex.join(['ddtree-deploy', *args])}")
    # The console script of this interpreter's environment (a venv, pipx), else the module.
    exe = Path(sys.executable).parent / "ddtree-deploy"
    argv = [str(exe)] if exe.is_file() else [sys.executable, "-m", "ddtree_deploy"]
    return subprocess.run([*argv, *args], env=env, cwd=cwd).returncode


def choose(listed, infos, requested: str | None = None) -> Choice:
    """The release the demo deploys onto and the family covering it (pure).

    ``requested`` (``--release``): that release and the family covering it. Else the newest
    release in ``listed`` (PyPI's listing) that a family covers, counting only what a host
    would install (a wheel, not yanked, no pre-release: as ``matrix`` counts them); a newer
    release no family covers yet is named on screen, never deployed."""
    from ddtree_deploy.engine.series import pick_family
    from ddtree_deploy.release.matrix_run import select_releases

    infos = list(infos)
    if requested is not None:
        try:
            family = pick_family(requested, infos)
        except BadInput as exc:  # its hint (--family) is push's, not the demo's
            raise BadInput(exc.message, hint="give --release a version one of those families covers") from None
        why = f"SGLang {requested}: asked for with --release"
    else:
        usable = [r.version for r in select_releases(listed, None, None)]
        covered = [v for v in usable if any(f.covers(v) for f in infos)]
        if not covered:
            raise BadInput("no SGLang release on PyPI is covered by a DDTree family here",
                           hint="name one with --release VERSION")
        version, newest = max(covered), max(usable)
        family = pick_family(str(version), infos)
        requested = str(version)
        pypi = ("the newest on PyPI" if version == newest
                else f"PyPI's newest, {newest}, is covered by no family yet")
        why = f"SGLang {requested}: the newest release a DDTree family covers ({pypi})"
    # The CUDA build line SGLang ships this release for, and the driver a GPU host needs for it.
    why += f"; CUDA lane {lane_words(requested)}"
    covers = ",".join(sorted(map(str, family.specifier), key=lambda spec: spec.startswith("<")))  # low end first
    why += (f"; family {family.name}, because it covers {covers} (as push picks it on a "
            f"real host, by the host's SGLang version): {family.description}")
    return Choice(requested, family, why)


def choose_release(requested: str | None) -> Choice:
    """:func:`choose` over PyPI's listing (the cached one when PyPI does not answer, so the
    demo runs offline after its first run); no listing at all with ``--release``."""
    from ddtree_deploy.engine.series import require_families
    from ddtree_deploy.release.matrix_run import list_sglang_releases

    listed = [] if requested is not None else list_sglang_releases(offline=False, warn=say)
    return choose(listed, require_families(), requested)


def smoke_table(choice: Choice) -> str:
    """The sandbox's [smoke]: the levels without a GPU; the cli level resolves the launch
    arguments as the family's own import probe does (its ``probe_args``: the v2 family needs
    ``--device cuda``, which builds ServerArgs without a GPU)."""
    import json

    from ddtree_deploy.settings.smoke import FAMILY_SMOKE_DEFAULT

    family_smoke = choice.family.smoke or FAMILY_SMOKE_DEFAULT
    exclude = json.dumps(list(NO_CUDA.get(choice.family.name, ())))
    extra = json.dumps([*family_smoke.probe_args, "--skip-tokenizer-init"])
    return textwrap.dedent(f"""
        [smoke]
        levels = ["compile", "import", "cli"]   # no GPU in the sandbox: no launch level
        import_exclude = {exclude}  # modules that need CUDA libraries (sgl_kernel) to import
        timeout_s = 300

        [smoke.launch]
        # Read by the cli level's validation (the launch level itself is not run here).
        model = "{MODELS / 'tiny-llama'}"
        draft_model = "{MODELS / 'tiny-dflash-draft'}"
        budget = 32
        extra_args = {extra}
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


def write_inventory(tmp: Path, python: Path, sshd, choice: Choice) -> Path:
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
    path.write_text(head + host + smoke_table(choice))
    return path


def _installed(name: str) -> bool:
    from importlib.metadata import PackageNotFoundError, distribution

    try:
        distribution(name)
        return True
    except PackageNotFoundError:
        return False


def missing_cpu_deps(version: str) -> list[str]:
    """The ``demo`` extra's requirements (SGLang's CPU dependencies, which the sandbox host
    shares from this environment) for ``version`` that are not installed here."""
    from packaging.requirements import Requirement
    from packaging.version import Version

    from ddtree_deploy.base.install import extra_requirements

    v1 = Version(version) < Version(V2_SINCE)
    names = [(req, Requirement(req).name) for req in extra_requirements("demo")]
    return [req for req, name in names if not (v1 and name in V2_ONLY) and not _installed(name)]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m ddtree_deploy.demo",
        description="check, push + smoke, status, history, rollback on a sandbox host (no GPU needed)")
    parser.add_argument("--release", metavar="VERSION",
                        help="the SGLang release to deploy onto (default: the newest one a family covers, "
                             "today 0.5.23 and the v2 family; 0.5.12.post1 is the v1 demo)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.monotonic()
    say("ddtree-deploy demo: deploy the DDTree series into SGLang on a sandbox host, smoke it, "
        "roll it back.")
    try:
        choice = choose_release(args.release)
    except DeployError as exc:
        hint = f" ({exc.hint})" if exc.hint else ""
        say(f"demo: cannot tell which SGLang release to use: {exc.message}{hint}")
        return exc.exit_code
    say(choice.why)
    missing = missing_cpu_deps(choice.version)
    if missing:
        from ddtree_deploy.base.install import add_extra

        how = ("`make demo` installs them (`make install`)" if in_checkout() else
               f"install them (the demo extra) where ddtree-deploy runs: {add_extra('demo')}")
        say(f"demo: {', '.join(missing)} not installed here; the sandbox host imports SGLang's CPU dependencies "
            f"from this Python environment: {how}, then run the demo again")
        return 2
    try:
        wheel = releases.ensure_wheel(choice.version)
    except DeployError as exc:
        say(f"demo: cannot get the SGLang {choice.version} wheel: {exc.message}")
        return 1
    say(f"SGLang wheel: {wheel}")
    with tempfile.TemporaryDirectory(prefix="ddtree-demo-") as name:
        tmp = Path(name)
        env = make_host_env(tmp / "sandbox-env", version=choice.version)
        say(f"sandbox host: {env.python} (SGLang {choice.version} files in {env.site_packages})")
        sshd, why = start_sshd(tmp / "sshd")
        try:
            if sshd is None:
                say(f"transport: LOCAL (no loopback sshd here: {why})")
            else:
                say(f"transport: SSH to a real sshd on 127.0.0.1:{sshd.port} (loopback, its own keys)")
            inventory = str(write_inventory(tmp, env.python, sshd, choice))
            # Snapshots go to the sandbox too: the repository's snapshot/ is left alone.
            cli_env = {**os.environ, "DDTREE_DEPLOY_SNAPSHOT": str(tmp / "snapshot")}
            say("push runs the sandbox's smoke levels after its switch (compile, import, cli; "
                "launch needs a GPU), and rolls back by itself if one fails")
            steps = [
                ["check", "--release", choice.version],
                ["push", "--host", inventory],
                ["status", "--host", inventory],
                ["history", "--host", inventory],
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
