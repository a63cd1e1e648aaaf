"""The patch engine vs GNU patch, same files, same run: the series, whole-file diffs, failing hunks.

    python -m bench patchset_bench

Workloads (SGLang's own files, read from the cached wheels):

1. the series: every patch of patches/sglang-0.5.12, in series order, applied to SGLang
   0.5.12.post1's files. Baseline: GNU patch --dry-run, one process per patch (as a shell
   loop would do).
2. multi-hunk whole-file diffs: SGLang's own change from 0.5.12.post1 to 0.5.13 of its four
   most-changed large modules (server_args.py, scheduler.py, schedule_batch.py,
   model_runner.py; about 350 hunks), one patch, parsed and applied in memory. Baseline:
   one GNU patch --dry-run -F0 of the same patch.
3. 2,000 failing hunks on server_args.py (7,964 lines): hunks cut from the real file (one
   line of context each side), each expecting a removed line the file does not have, so
   every hunk fails and the engine finds its nearest location and the differing lines.
   Baseline: GNU patch --dry-run -F0 of the same patch (it writes no nearest match).

Targets (issue 11): cases 2 and 3 within 3x GNU patch.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
import zipfile
from pathlib import Path

from ddtree_deploy.locations import REPO_ROOT, cache_dir
from ddtree_deploy.patch_apply import apply_file_patch
from ddtree_deploy.patch_parse import parse_patch

RELEASE = "0.5.12.post1"
NEXT = "0.5.13"
FAMILY = REPO_ROOT / "patches" / "sglang-0.5.12"
WHOLE_FILES = ("sglang/srt/server_args.py", "sglang/srt/managers/scheduler.py",
               "sglang/srt/managers/schedule_batch.py", "sglang/srt/model_executor/model_runner.py")
BIG = "sglang/srt/server_args.py"
FAILING = 2000


def _series() -> list[Path]:
    names = [ln.strip() for ln in (FAMILY / "series").read_text().splitlines()]
    return [FAMILY / n for n in names if n and not n.startswith("#") and not n.startswith("add ")]


def _release_files(paths: set[str] | tuple[str, ...], release: str = RELEASE) -> dict[str, str]:
    wheel = next((cache_dir() / "wheels").glob(f"sglang-{release}-*.whl"))
    with zipfile.ZipFile(wheel) as zf:
        return {p: zf.read(p).decode() for p in paths}


def _whole_file_patch(root: Path) -> str:
    """SGLang's own 0.5.12.post1 -> 0.5.13 change of WHOLE_FILES, as one unified diff (GNU diff)."""
    old, new = _release_files(WHOLE_FILES), _release_files(WHOLE_FILES, NEXT)
    parts = []
    for path in WHOLE_FILES:
        for side, text in (("a", old[path]), ("b", new[path])):
            (root / side / path).parent.mkdir(parents=True, exist_ok=True)
            (root / side / path).write_text(text)
        run = subprocess.run(["diff", "-u", "--label", f"a/{path}", "--label", f"b/{path}",
                              f"a/{path}", f"b/{path}"], cwd=root, capture_output=True, text=True)
        parts.append(run.stdout)
    return "".join(parts)


def _failing_patch(text: str, count: int) -> str:
    """``count`` hunks cut from ``text``, each removing a line the file does not have."""
    lines = text.split("\n")[:-1]
    stride = (len(lines) - 2) // count
    assert stride >= 3, "file too short for that many hunks"
    body = [f"--- a/{BIG}\n", f"+++ b/{BIG}\n"]
    for k in range(count):
        i = 1 + k * stride  # 0-based line of the removed one; context above and below
        body.append(f"@@ -{i},3 +{i},3 @@\n {lines[i - 1]}\n-{lines[i]}  # not in the file\n"
                    f"+{lines[i]}  # changed\n {lines[i + 1]}\n")
    return "".join(body)


def _gnu_dry_run(root: Path, patch: Path) -> int:
    run = subprocess.run(["patch", "--dry-run", "-s", "-p1", "-F0", "-N", "-i", str(patch)],
                         cwd=root, check=False, capture_output=True)
    return run.returncode


def _engine_whole(patch: str, files: dict[str, str]) -> list:
    return [apply_file_patch(fp, files[fp.path]) for fp in parse_patch(patch, name="whole.diff")]


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

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        try:
            whole = _whole_file_patch(root / "diff")
            base = _release_files(WHOLE_FILES)
        except (StopIteration, KeyError, OSError):
            print(f"no cached sglang {NEXT} wheel: whole-file case skipped")
            return
        tree = root / "tree"
        for path, text in base.items():
            (tree / path).parent.mkdir(parents=True, exist_ok=True)
            (tree / path).write_text(text)
        (root / "whole.diff").write_text(whole)
        results = _engine_whole(whole, base)
        assert all(r.ok for r in results) and _gnu_dry_run(tree, root / "whole.diff") == 0
        hunks = sum(len(r.hunks) for r in results)
        engine_s = _best(lambda: _engine_whole(whole, base), 10)
        gnu_s = _best(lambda: _gnu_dry_run(tree, root / "whole.diff"), 10)
        print(f"whole-file diffs {RELEASE} -> {NEXT}, {len(WHOLE_FILES)} files / {hunks} hunks, one patch:")
        print(f"  engine (parse + apply in memory) {engine_s * 1e3:8.2f} ms")
        print(f"  GNU patch --dry-run -F0          {gnu_s * 1e3:8.2f} ms")
        print(f"  ratio engine / GNU patch          {engine_s / gnu_s:8.2f}   (target <= 3)")

        failing = _failing_patch(base[BIG], FAILING)
        (root / "failing.diff").write_text(failing)
        (res,) = _engine_whole(failing, base)
        failed = sum(1 for h in res.hunks if not h.ok)
        assert failed == FAILING and all(h.nearest_line for h in res.hunks)
        assert _gnu_dry_run(tree, root / "failing.diff") == 1
        engine_s = _best(lambda: _engine_whole(failing, base), 5)
        gnu_s = _best(lambda: _gnu_dry_run(tree, root / "failing.diff"), 5)
        lines = base[BIG].count("\n")
        print(f"{BIG} ({lines} lines), {failed} failing hunks, nearest match and differing lines each:")
        print(f"  engine (parse + apply in memory) {engine_s * 1e3:8.2f} ms")
        print(f"  GNU patch --dry-run -F0          {gnu_s * 1e3:8.2f} ms")
        print(f"  ratio engine / GNU patch          {engine_s / gnu_s:8.2f}   (target <= 3)")
