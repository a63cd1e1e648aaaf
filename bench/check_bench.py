"""How long the foundation's steps take on the real 0.5.12.post1 files.

    python -m bench check_bench

Measures, each as the median of several runs (first run discarded):
load a family (parse + path checks), snapshot a release from the cached wheel,
check_series (apply + byte-compile) in memory, and the whole
`ddtree-deploy check --release` command as a user runs it (a fresh process,
so Python and typer start-up are included). Uses the test series, plus the
real family when it is complete. Needs the wheel in the cache (or PyPI once).
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ddtree_deploy.base.errors import BadInput
from ddtree_deploy.engine.check import check_series
from ddtree_deploy.engine.series import families, load_family, pick_family
from ddtree_deploy.release import releases
from ddtree_deploy.release.snapshot import snapshot_from_release

REPO = Path(__file__).resolve().parent.parent
VERSION = "0.5.12.post1"
TEST_FAMILY = REPO / "tests" / "data" / "patches" / "test-0.5.12"


def _median_ms(fn, runs: int) -> float:
    fn()  # warm: imports, page cache
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t) * 1000)
    return statistics.median(times)


def _families():
    out = [("test-0.5.12 (tests/data)", TEST_FAMILY)]
    try:
        info = pick_family(VERSION, families())
        load_family(info.folder)
        out.append((f"{info.name} (patches/)", info.folder))
    except BadInput as exc:
        print(f"(real family skipped: {exc.message})")
    return out


def main() -> None:
    wheel = releases.ensure_wheel(VERSION)
    print(f"wheel: {wheel.name} ({wheel.stat().st_size / 1e6:.1f} MB)")
    rows = []
    for label, folder in _families():
        series = load_family(folder)
        paths = series.touched_paths()
        files = {}
        found = releases.read_wheel_files(wheel, paths)
        for p in paths:
            files[p] = found.get(p)
        size = sum(len(b) for b in files.values() if b)
        hunks = sum(len(fp.hunks) for e in series.entries for fp in getattr(e, "file_patches", ()))
        rows.append((label, "load_family", _median_ms(lambda: load_family(folder), 20)))
        with tempfile.TemporaryDirectory() as tmp:
            rows.append((label, "snapshot_from_release",
                         _median_ms(lambda: snapshot_from_release(VERSION, paths=paths, root=Path(tmp)), 10)))
        rows.append((label, f"check_series ({hunks} hunks, {size / 1e3:.0f} kB)",
                     _median_ms(lambda: check_series(series, files), 20)))
        with tempfile.TemporaryDirectory() as tmp:
            env = {**os.environ, "DDTREE_DEPLOY_SNAPSHOT": tmp,
                   "DDTREE_DEPLOY_PATCHES": str(folder.parent)}
            exe = str(Path(sys.executable).parent / "ddtree-deploy")
            cmd = [exe, "check", "--release", VERSION, "--family", str(folder), "--json"]
            rows.append((label, "ddtree-deploy check --release (process)",
                         _median_ms(lambda: subprocess.run(cmd, env=env, capture_output=True, check=True), 5)))
    width = max(len(r[0]) for r in rows)
    step_w = max(len(r[1]) for r in rows)
    for label, step, ms in rows:
        print(f"{label:<{width}}  {step:<{step_w}}  {ms:9.1f} ms")


if __name__ == "__main__":
    main()
