"""Host environments for tests: a Python with a REAL SGLang release installed.

A "host environment" stands in for a GPU host's interpreter, minus the GPU: a venv
made from the base interpreter (no pip), whose site-packages holds the SGLang
release wheel's files exactly as pip would install them (``--no-deps``), optionally
overlaid with patched files, plus a ``.pth`` file that adds the project venv's
site-packages (torch, transformers, ... are shared, never reinstalled per test).
The host's own site-packages comes first on ``sys.path``, so its ``sglang`` wins.

Helpers for test modules (not a test module itself):

    release_wheel(version)                      -> Path of the cached wheel (downloads once)
    pristine_files(version, paths=None)         -> {package-relative path: bytes}
    make_host_env(dest, *, overlay=None, version) -> HostEnv(python, site_packages)
    run_python(env, code_or_args, ...)          -> subprocess.CompletedProcess
"""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Mapping

from ddtree_deploy.locations import cache_dir

#: The release the DDTree series was made against (the seeds' host ran it).
BASELINE_RELEASE = "0.5.12.post1"


@dataclass(frozen=True)
class HostEnv:
    python: Path  # the host interpreter (dest/bin/python)
    site_packages: Path  # where sglang/ lives for this host


def wheel_dir() -> Path:
    return cache_dir() / "wheels"


def release_wheel(version: str = BASELINE_RELEASE) -> Path:
    """The cached SGLang wheel for ``version``; fetched from PyPI with pip on first use.

    Only the wheel itself (``--no-deps``): SGLang publishes wheels only from 0.5.11 on.
    """
    folder = wheel_dir()
    found = sorted(folder.glob(f"sglang-{version}-*.whl"))
    if found:
        return found[0]
    folder.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "-q", "--no-deps",
         "--only-binary=:all:", f"sglang=={version}", "-d", str(folder)],
        check=True,
    )
    found = sorted(folder.glob(f"sglang-{version}-*.whl"))
    if not found:
        raise FileNotFoundError(f"pip download left no sglang-{version} wheel in {folder}")
    return found[0]


def pristine_files(
    version: str = BASELINE_RELEASE, paths: Iterable[str] | None = None
) -> dict[str, bytes]:
    """The release's files as shipped, keyed by site-packages-relative path.

    ``paths`` selects files (a missing one raises KeyError naming it); default: all
    regular files of the wheel, dist-info included.
    """
    with zipfile.ZipFile(release_wheel(version)) as zf:
        if paths is None:
            return {n: zf.read(n) for n in zf.namelist() if not n.endswith("/")}
        return {p: zf.read(p) for p in paths}


def _shared_site_packages() -> Path:
    # The interpreter running the tests is the project venv's; its purelib holds
    # torch, transformers and the rest of SGLang's CPU dependencies.
    return Path(sysconfig.get_paths()["purelib"])


def _base_python() -> str:
    # A venv must be made from a real interpreter, not from another venv's shim.
    return getattr(sys, "_base_executable", None) or sys.executable


def make_host_env(
    dest: Path,
    *,
    overlay: Mapping[str, bytes] | None = None,
    version: str = BASELINE_RELEASE,
) -> HostEnv:
    """Build a host environment in ``dest`` (a new or empty folder).

    ``overlay`` maps site-packages-relative paths (``sglang/srt/server_args.py``) to
    the bytes that replace (or add) that file after the release is installed.
    """
    dest = Path(dest)
    subprocess.run(
        [_base_python(), "-m", "venv", "--without-pip", str(dest)], check=True
    )
    python = dest / "bin" / "python"
    site_packages = Path(
        subprocess.run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            check=True, capture_output=True, text=True,
        ).stdout.strip()
    )
    with zipfile.ZipFile(release_wheel(version)) as zf:
        zf.extractall(site_packages)
    for rel, data in (overlay or {}).items():
        target = site_packages / rel
        if site_packages.resolve() not in target.resolve().parents:
            raise ValueError(f"overlay path escapes site-packages: {rel!r}")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
    # addsitedir (not a bare path line) so the shared venv's own .pth files run too.
    (site_packages / "zz_ddtree_shared_venv.pth").write_text(
        f"import site; site.addsitedir({str(_shared_site_packages())!r})\n"
    )
    return HostEnv(python=python, site_packages=site_packages)


def run_python(
    env: HostEnv,
    args: list[str],
    *,
    timeout: float = 300,
    cwd: Path | None = None,
    extra_env: Mapping[str, str] | None = None,
) -> subprocess.CompletedProcess:
    """Run the host interpreter with ``args`` (e.g. ``["-c", code]``), output captured."""
    environ = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    # No GPU here: keep torch and SGLang from probing for one, and stay offline.
    environ.update({"CUDA_VISIBLE_DEVICES": "", "HF_HUB_OFFLINE": "1",
                    "TRANSFORMERS_OFFLINE": "1", "PYTHONDONTWRITEBYTECODE": "1"})
    environ.update(extra_env or {})
    return subprocess.run(
        [str(env.python), *args], capture_output=True, text=True,
        timeout=timeout, cwd=cwd, env=environ,
    )
