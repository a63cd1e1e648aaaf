"""Sandbox host environments: a Python with a REAL SGLang release installed.

A "host environment" stands in for a GPU host's interpreter, minus the GPU: a venv
made from the base interpreter (no pip), whose site-packages holds the SGLang
release wheel's files exactly as pip would install them (``--no-deps``), optionally
overlaid with patched files, plus a ``.pth`` file that adds the running venv's
site-packages (torch, transformers, ... are shared, never reinstalled per host).
The host's own site-packages comes first on ``sys.path``, so its ``sglang`` wins.

Used by the demo (``python -m ddtree_deploy.demo``), the benchmarks and the tests:

    release_wheel(version)                      -> Path of the cached wheel (downloads once)
    pristine_files(version, paths=None)         -> {package-relative path: bytes}
    make_host_env(dest, *, overlay=None, version) -> HostEnv(python, site_packages)
    make_python_env(dest, files=None, version)  -> (python, site-packages): only some files,
                                                   no shared venv (for deploy tests: fast)
    write_kernel_standin(dest)                  -> folder to put on PYTHONPATH (see there)
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
    """The cached SGLang wheel for ``version``; fetched from PyPI on first use.

    Only the wheel itself (``--no-deps``): SGLang publishes wheels only from 0.5.11 on.
    """
    found = sorted(wheel_dir().glob(f"sglang-{version}-*.whl"))
    if found:
        return found[0]
    # Not cached yet: the toolkit's own downloader (sha256-verified against PyPI).
    from ddtree_deploy.releases import ensure_wheel

    return ensure_wheel(version)


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


_KERNEL_STANDIN = '''"""STAND-IN for SGLang's CUDA kernel package (sglang-kernel), for CPU test hosts only.

The real package is a CUDA build that cannot load on a machine without a GPU, yet
modules such as sglang.srt.mem_cache.memory_pool_host import names from it at module
top on every non-NPU/XPU/MPS device. Any sgl_kernel.<module>.<name> resolves to a
function that raises when called, so imports succeed and nothing pretends to compute.
"""
import importlib.abc
import importlib.machinery
import sys
import types

STANDIN = True


class _StandIn:
    """A missing kernel (or kernel-side constant): attributes give more stand-ins,
    calling one raises."""

    def __init__(self, name):
        self._name = name

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _StandIn(f"{self._name}.{name}")

    def __call__(self, *args, **kwargs):
        raise RuntimeError(
            f"{self._name}: CPU stand-in, the CUDA kernel is not available here"
        )

    def __repr__(self):
        return f"<sgl_kernel stand-in {self._name}>"


class _StandInModule(types.ModuleType):
    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _StandIn(f"{self.__name__}.{name}")


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname, path, target=None):
        if fullname.startswith(__name__ + "."):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        return _StandInModule(spec.name)

    def exec_module(self, module):
        module.__path__ = []


sys.meta_path.append(_Finder())
sys.modules[__name__].__class__ = _StandInModule
'''


def write_kernel_standin(dest: Path) -> Path:
    """Write a NAMED STAND-IN ``sgl_kernel`` package under ``dest``; return ``dest``.

    Put ``dest`` on PYTHONPATH (``run_python(..., extra_env={"PYTHONPATH": ...})``) only
    for probes that must IMPORT modules pulling in sgl_kernel (dflash_worker does, via
    the scheduler); every call into it raises. Never part of a host env by default.
    """
    pkg = Path(dest) / "sgl_kernel"
    pkg.mkdir(parents=True, exist_ok=True)
    (pkg / "__init__.py").write_text(_KERNEL_STANDIN)
    return Path(dest)


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
    reuse: bool = False,
) -> HostEnv:
    """Build a host environment in ``dest`` (a new or empty folder).

    ``overlay`` maps site-packages-relative paths (``sglang/srt/server_args.py``) to
    the bytes that replace (or add) that file after the release is installed.
    ``reuse``: when ``dest`` already holds a host environment of ``version`` (a marker file
    says so), only write the overlay again (the mutant runner, scripts/mutants_v2.py,
    rebuilds nothing between mutants of the payload).
    """
    dest = Path(dest)
    marker = dest / "ddtree-host-env.txt"
    python = dest / "bin" / "python"
    fresh = not (reuse and marker.is_file() and marker.read_text() == version)
    if fresh:
        subprocess.run(
            [_base_python(), "-m", "venv", "--without-pip", str(dest)], check=True
        )
    site_packages = Path(
        subprocess.run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            check=True, capture_output=True, text=True,
        ).stdout.strip()
    )
    if fresh:
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
    marker.write_text(version)
    return HostEnv(python=python, site_packages=site_packages)


def make_python_env(dest: Path, files: list[str] | None = None,
                    version: str = BASELINE_RELEASE) -> tuple[Path, Path]:
    """A bare venv at ``dest`` whose site-packages holds SGLang's real files and dist-info,
    without the shared venv (nothing there imports torch): what push/status/rollback need.

    ``files``: package-relative paths to extract (plus every ``__init__.py`` on their way
    and sglang/version.py); None extracts the whole package. Returns (python, site-packages).
    """
    dest = Path(dest)
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(dest)], check=True)
    (site,) = dest.glob("lib/python3*/site-packages")
    wanted = None
    if files is not None:
        wanted = set(files) | {"sglang/__init__.py", "sglang/version.py"}
        for f in files:
            parts = f.split("/")
            for i in range(1, len(parts)):
                wanted.add("/".join(parts[:i]) + "/__init__.py")
    with zipfile.ZipFile(release_wheel(version)) as whl:
        for name in whl.namelist():
            if ".dist-info/" in name or (name.startswith("sglang/") and (wanted is None or name in wanted)):
                whl.extract(name, site)
    return dest / "bin" / "python", site


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
    # (extra_env may set PYTHONPATH again, e.g. to a kernel stand-in folder.)
    # No GPU here: keep torch and SGLang from probing for one, and stay offline.
    environ.update({"CUDA_VISIBLE_DEVICES": "", "HF_HUB_OFFLINE": "1",
                    "TRANSFORMERS_OFFLINE": "1", "PYTHONDONTWRITEBYTECODE": "1"})
    environ.update(extra_env or {})
    return subprocess.run(
        [str(env.python), *args], capture_output=True, text=True,
        timeout=timeout, cwd=cwd, env=environ,
    )
