"""The patch engine on the real series: in-memory check vs GNU patch --dry-run, same files, same run.

    python -m bench patchset_bench

Workload: every patch of patches/sglang-0.5.12, in series order, applied to SGLang
0.5.12.post1's own files (read from the cached wheel). Baseline: GNU patch --dry-run on
the same files in a temporary folder (one process per patch, as a shell loop would do).
A second line times the worst case the engine has: a hunk that fails on the largest file
(server_args.py), which scans the whole file for the nearest match.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
import zipfile
from pathlib import Path

from ddtree_deploy.locations import REPO_ROOT, cache_dir
from ddtree_deploy.patchset import apply_file_patch, parse_patch

RELEASE = "0.5.12.post1"
FAMILY = REPO_ROOT / "patches" / "sglang-0.5.12"


def _series() -> list[Path]:
    names = [ln.strip() for ln in (FAMILY / "series").read_text().splitlines()]
    return [FAMILY / n for n in names if n and not n.startswith("#") and not n.startswith("add ")]


def _release_files(paths: set[str]) -> dict[str, str]:
    wheel = next((cache_dir() / "wheels").glob(f"sglang-{RELEASE}-*.whl"))
    with zipfile.ZipFile(wheel) as zf:
        return {p: zf.read(p).decode() for p in paths}


def _engine(patches: list[tuple[str, str]], files: dict[str, str]) -> int:
    texts = dict(files)
    hunks = 0
    for name, text in patches:
        for fp in parse_patch(text, name=name):
            res = apply_file_patch(fp, texts[fp.path])
            hunks += len(res.hunks)
            texts[fp.path] = res.text if res.ok else texts[fp.path]
    return hunks


def _best(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def main() -> None:
    if shutil.which("patch") is None:
        print("GNU patch is not installed: no baseline, skipped")
        return
    patches = [(p.name, p.read_text()) for p in _series()]
    paths = {fp.path for name, text in patches for fp in parse_patch(text, name=name)}
    try:
        files = _release_files(paths)
    except (StopIteration, KeyError, OSError):
        print(f"no cached sglang {RELEASE} wheel under {cache_dir() / 'wheels'}: skipped")
        return
    hunks = _engine(patches, files)

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for path, text in files.items():
            (root / path).parent.mkdir(parents=True, exist_ok=True)
            (root / path).write_text(text)

        def gnu() -> None:
            for p in _series():
                subprocess.run(["patch", "--dry-run", "-s", "-p1", "-F0", "-N", "-i", str(p)],
                               cwd=root, check=False, capture_output=True)

        engine_s = _best(lambda: _engine(patches, files), 20)
        gnu_s = _best(gnu, 5)
    print(f"series check, {len(patches)} patches / {hunks} hunks / {len(files)} files:")
    print(f"  engine (parse + apply in memory) {engine_s * 1e3:8.2f} ms")
    print(f"  GNU patch --dry-run, per patch   {gnu_s * 1e3:8.2f} ms")
    print(f"  ratio engine / GNU patch          {engine_s / gnu_s:8.2f}")

    # Worst case: every hunk of the server_args patches fails (each line they expect was
    # edited), so each one scans the whole file for its nearest match.
    big = "sglang/srt/server_args.py"
    sections = [fp for name, text in patches for fp in parse_patch(text, name=name) if fp.path == big]
    expected = {t for fp in sections for h in fp.hunks for tag, t in h.lines if tag != "+"}
    broken = "".join(ln + "  # edited\n" if ln in expected else ln + "\n"
                     for ln in files[big].split("\n")[:-1])
    failed = sum(1 for fp in sections for h in apply_file_patch(fp, broken).hunks if not h.ok)
    fail_s = _best(lambda: [apply_file_patch(fp, broken) for fp in sections], 5)
    ok_s = _best(lambda: [apply_file_patch(fp, files[big]) for fp in sections], 5)
    lines = files[big].count("\n")
    print(f"{big} ({lines} lines), {failed} failing hunks with nearest-match scan:")
    print(f"  clean apply {ok_s * 1e3:8.2f} ms, all-fail {fail_s * 1e3:8.2f} ms, ratio {fail_s / ok_s:6.1f}")
