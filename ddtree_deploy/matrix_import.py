"""``matrix --import``: install each release, patched, into a throwaway CPU virtualenv and smoke it.

For a release whose family applied cleanly, a venv is made from the base
interpreter (no pip, nothing downloaded), the release wheel's ``sglang`` package
and its ``.dist-info`` are unpacked into its site-packages as pip would install
them with ``--no-deps``, the patched files from ``check_series`` replace the
originals, and a ``.pth`` file appends this toolkit environment's site-packages
(torch, transformers and SGLang's other Python dependencies, as ``make install``
puts them there). The env's own site-packages comes first, so its ``sglang`` wins.

The host-side smoke program (``smoke_agent``) then runs the ``import`` and ``cli``
levels with the env's interpreter, exactly as it would on a GPU host; the request
comes from ``smoke.plan_smoke``. The env is deleted afterwards.
"""

from __future__ import annotations

import json
import subprocess
import sys
import sysconfig
import tempfile
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

from ddtree_deploy import releases
from ddtree_deploy.check import check_series
from ddtree_deploy.errors import DeployError
from ddtree_deploy.series import PatchEntry, Series
from ddtree_deploy.smoke import (
    SmokeSettings,
    module_name,
    plan_smoke,
    read_answer,
    series_flags,
    smoke_agent_source,
)

LEVELS = ("import", "cli")


@dataclass(frozen=True)
class ImportSmoke:
    """The smoke levels of one release: ``(level, status, detail)`` each."""

    version: str
    levels: tuple[tuple[str, str, str], ...]
    seconds: float

    @property
    def ok(self) -> bool:
        return all(status == "passed" for _, status, _ in self.levels)

    def short(self) -> str:
        failed = [level for level, status, _ in self.levels if status == "failed"]
        return "passed" if self.ok else f"{'/'.join(failed) or 'skipped'} failed"


def _site_packages(env: Path) -> Path:
    found = sorted(env.glob("lib/python*/site-packages"))
    if not found:
        raise DeployError(f"{env}: the new virtualenv has no lib/python*/site-packages")
    return found[0]


def make_env(dest: Path, wheel: Path) -> tuple[Path, Path]:
    """A venv at ``dest`` with the release installed (no deps): (its python, its site-packages)."""
    made = subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(dest)],
                          capture_output=True, text=True)
    if made.returncode != 0:
        raise DeployError(f"cannot create a virtualenv at {dest}: {made.stderr.strip()[-300:]}")
    site = _site_packages(dest)
    with zipfile.ZipFile(wheel) as zf:
        members = [n for n in zf.namelist()
                   if n.split("/", 1)[0] == "sglang" or n.split("/", 1)[0].endswith(".dist-info")]
        zf.extractall(site, members=members)
    # After the env's own site-packages: the dependencies, never a second sglang.
    deps = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    (site / "zz_ddtree_deploy_deps.pth").write_text("".join(f"{p}\n" for p in sorted(deps)))
    return dest / "bin" / "python", site


_PROBE = """
import importlib, json, sys
failed = {}
for name in sys.argv[1:]:
    try:
        importlib.import_module(name)
    except BaseException as exc:
        failed[name] = f"{type(exc).__name__}: {exc}"
print(json.dumps(failed))
"""


def unimportable(python: Path, modules: Sequence[str], timeout_s: float) -> dict[str, str]:
    """Modules of the *unpatched* release that this CPU env cannot import, with the error.

    Some SGLang modules import CUDA-only packages (sgl_kernel) at module level; a CPU
    env cannot import them patched or not. They are left out of the import level
    (and named in its detail), so the level tests what the series changed: a module
    that imported before the series must still import after it.
    """
    try:
        done = subprocess.run([str(python), "-c", _PROBE, *modules], capture_output=True, text=True,
                              timeout=timeout_s)
    except subprocess.TimeoutExpired:
        raise DeployError(f"importing the unpatched release timed out after {timeout_s:g} s") from None
    try:
        return json.loads(done.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        raise DeployError(f"the import probe failed (exit {done.returncode}): {done.stderr.strip()[-300:]}") from None


def smoke_release(version: str, wheel: Path, series: Series, *, fuzz: int = 0, timeout_s: float = 300.0,
                  work_dir: Path | None = None) -> ImportSmoke:
    """Patch ``version`` with ``series``, install it in a throwaway venv, run the import and cli levels."""
    started = time.perf_counter()
    wanted = series.touched_paths()
    found = releases.read_wheel_files(wheel, wanted)
    report = check_series(series, {p: found.get(p) for p in wanted}, fuzz=fuzz)
    if not report.ok:
        levels = tuple((level, "skipped", "the series does not apply cleanly") for level in LEVELS)
        return ImportSmoke(version, levels, time.perf_counter() - started)
    flags = series_flags(e.file.read_text(encoding="utf-8") for e in series.entries if isinstance(e, PatchEntry))
    with tempfile.TemporaryDirectory(prefix=f"ddtree-import-{version}-", dir=work_dir) as tmp:
        python, site = make_env(Path(tmp) / "env", wheel)
        existing = [module_name(p) for p in wanted if found.get(p) is not None and module_name(p)]
        cannot = unimportable(python, existing, timeout_s)
        for p in report.patched.values():
            target = site.joinpath(*p.path.split("/"))
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(p.patched)
        settings = SmokeSettings(levels=LEVELS, timeout_s=timeout_s, import_exclude=tuple(cannot))
        plan = plan_smoke(settings, touched_paths=wanted, flags=flags, log_path="-", levels=LEVELS)
        agent = Path(tmp) / "smoke_agent.py"
        agent.write_bytes(smoke_agent_source())

        def run(request: dict) -> dict:
            done = subprocess.run([str(python), str(agent)], input=json.dumps(request), capture_output=True,
                                  text=True, timeout=timeout_s * len(LEVELS) + 60)
            try:
                return json.loads(done.stdout.strip().splitlines()[-1])
            except (IndexError, ValueError):
                return {"error": f"exit {done.returncode}: {done.stderr.strip()[-300:]}"}

        result = read_answer(f"sglang {version} (throwaway venv)", plan, run(plan.request))
    levels = []
    for r in result.levels:
        detail = r.detail
        if r.level == "import" and cannot:
            # Say why a module was left out: the unpatched release fails the same way here.
            detail += "; unpatched, on this CPU env: " + "; ".join(f"{m}: {e}" for m, e in cannot.items())
        levels.append((r.level, r.status, detail))
    return ImportSmoke(version, tuple(levels), time.perf_counter() - started)


def smoke_releases(jobs: Sequence[tuple[str, Path, Series]], *, fuzz: int = 0,
                   progress: Callable[[str, int, int], None] | None = None) -> dict[str, ImportSmoke]:
    """One after the other: each level imports torch and SGLang, which wants the whole machine."""
    out = {}
    for n, (version, wheel, series) in enumerate(jobs, start=1):
        out[version] = smoke_release(version, wheel, series, fuzz=fuzz)
        if progress:
            progress("import", n, len(jobs))
    return out


__all__ = ["ImportSmoke", "make_env", "smoke_release", "smoke_releases"]
