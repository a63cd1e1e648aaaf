"""The patch engine vs GNU patch, same inputs, same run: every case issues 11 and 21 measured.

    python -m bench patchset_bench        (make bench runs it with the others)

The engine side is what `check` pays for a patch: parse, place every hunk, and prove every
written file by reversing its applied hunks (patch_verify); GNU patch's side is one `patch`
process on a copy of the files (--dry-run where nothing chains; a real run, on a fresh copy
made outside the timing, where sections on one file must see each other's result). Each
figure is CPU time, the best of several runs: the engine's process time, GNU patch's as a
child process (its start included). The machine these run on is shared: wall-clock time
under load measures the scheduler more than the code. The ratio is engine / GNU patch.

Cases (SGLang's own files, read from the cached wheels; the synthetic ones are built here):

1. series: every patch of patches/sglang-0.5.12, in series order, on SGLang 0.5.12.post1's
   files; GNU: one process per patch, as a shell loop would do.
2. whole-file diffs: SGLang's own change of its four most-changed large modules
   (server_args.py, scheduler.py, schedule_batch.py, model_runner.py) between consecutive
   cached releases, one patch per pair, on the older release.
3. single-hunk corpus: the 0.5.12.post1 -> 0.5.13 diffs of case 2 cut into one-hunk file
   sections (every hunk its own section, in order, each applied to the result of the ones
   before), so each hunk pays a file's whole setup; GNU: a real run (sections chain).
4. 2,000 failing hunks on server_args.py, cut from the file (one line of context each side),
   each removing a line the file does not have: the nearest-match evidence for each.
5. 2,000 failing hunks made of common lines: context lines among the file's most frequent
   ones (blank lines, closing brackets), a removed line the file does not have.
6. a 196 KB two-patch series: 0001 creates a module of 20,000 alternating lines, 0002 has one
   8,001-line hunk on it that fails (a removed line the module lacks); GNU: a real run.
7. a 16,001-line failing hunk (same shape) on a 40,000-line file of alternating lines.

Goal (issue 21): every ratio at most 2. Both are printed: the engine alone (parse + apply,
what issue 21 measured) and with check's proof.
"""

from __future__ import annotations

import resource
import shutil
import subprocess
import tempfile
import zipfile
from collections import Counter
from pathlib import Path

from ddtree_deploy.base.locations import REPO_ROOT, cache_dir
from ddtree_deploy.engine.patch_apply import apply_file_patch
from ddtree_deploy.engine.patch_parse import parse_patch
from ddtree_deploy.engine.patch_verify import verify_round_trip

RELEASE = "0.5.12.post1"
FAMILY = REPO_ROOT / "patches" / "sglang-0.5.12"
WHOLE_FILES = ("sglang/srt/server_args.py", "sglang/srt/managers/scheduler.py",
               "sglang/srt/managers/schedule_batch.py", "sglang/srt/model_executor/model_runner.py")
# Consecutive releases whose whole-file diffs are measured (those cached are used).
PAIRS = (("0.5.12.post1", "0.5.13"), ("0.5.13", "0.5.14"), ("0.5.14", "0.5.16"),
         ("0.5.20", "0.5.21"), ("0.5.21", "0.5.22"), ("0.5.22", "0.5.23"))
BIG = "sglang/srt/server_args.py"
FAILING = 2000
GOAL = 2.0


def _wheel(release: str) -> Path | None:
    return next((cache_dir() / "wheels").glob(f"sglang-{release}-*.whl"), None)


def _release_files(paths, release: str = RELEASE) -> dict[str, str]:
    wheel = _wheel(release)
    if wheel is None:
        raise FileNotFoundError(release)
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        return {p: zf.read(p).decode() for p in paths if p in names}


def _series() -> list[Path]:
    names = [ln.strip() for ln in (FAMILY / "series").read_text().splitlines()]
    return [FAMILY / n for n in names if n and not n.startswith("#") and not n.startswith("add ")]


# ----------------------------------------------------------------------------- the two sides


def engine(patches: list[tuple[str, str]], files: dict[str, str | None], prove: bool = True) -> int:
    """What check pays: parse, apply in order (each section on the result so far), prove
    (``prove``: the round trip check adds; without it, the engine alone, as issue 21 measured).

    Returns the number of hunks placed; a failed section leaves its file as it was."""
    texts = dict(files)
    hunks = 0
    for name, text in patches:
        for fp in parse_patch(text, name=name):
            before = texts.get(fp.path)
            res = apply_file_patch(fp, before)
            hunks += len(res.hunks)
            if prove:
                assert verify_round_trip(fp, before, res) is None
            if res.ok and res.text is not None:
                texts[fp.path] = res.text
    return hunks


def _write_tree(root: Path, files: dict[str, str | None]) -> None:
    if root.exists():
        shutil.rmtree(root)
    root.mkdir(parents=True)
    for path, text in files.items():
        if text is not None:
            (root / path).parent.mkdir(parents=True, exist_ok=True)
            (root / path).write_text(text)


def _gnu(tree: Path, patch: Path, *, dry: bool) -> int:
    args = ["patch", "-s", "-p1", "-F0", "-N", "-r", "-", "--no-backup-if-mismatch", "-i", str(patch)]
    return subprocess.run(args[:1] + (["--dry-run"] if dry else []) + args[1:], cwd=tree,
                          check=False, capture_output=True).returncode


def _cpu() -> float:
    """CPU seconds used so far by this process and its finished children."""
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def _cpu_of(fn, setup=None) -> float:
    """The CPU time ``fn`` takes (``setup`` untimed before it)."""
    if setup is not None:
        setup()
    t0 = _cpu()
    fn()
    return _cpu() - t0


def _best(fns: list, repeat: int, setups: list) -> list[float]:
    """The least CPU time of each of ``fns`` over ``repeat`` rounds, run in turn within a round,
    so that a busy spell of the shared machine weighs on all of them alike."""
    times = [[] for _ in fns]
    for _ in range(repeat):
        for k, (fn, setup) in enumerate(zip(fns, setups)):
            times[k].append(_cpu_of(fn, setup))
    return [min(t) for t in times]


RATIOS: list[tuple[str, float, float]] = []  # (case, engine / GNU, engine + proof / GNU)


def _report(title: str, bare_s: float, engine_s: float, gnu_s: float, gnu_how: str) -> None:
    RATIOS.append((title, bare_s / gnu_s, engine_s / gnu_s))
    print(title + ":")
    print(f"  engine (parse + apply)           {bare_s * 1e3:9.2f} ms   ratio {bare_s / gnu_s:6.2f}")
    print(f"  engine + check's proof           {engine_s * 1e3:9.2f} ms   ratio {engine_s / gnu_s:6.2f}")
    print(f"  GNU patch {gnu_how:<22} {gnu_s * 1e3:9.2f} ms   (goal: ratio <= {GOAL:g})")


def _compare(title: str, root: Path, patches: list[tuple[str, str]], files: dict[str, str | None], *,
             chained: bool, repeat: int = 9) -> None:
    """Time both sides on one case; GNU runs on ``root`` (rebuilt before each real run)."""
    tree = root / "tree"
    patch_files = []
    for k, (name, text) in enumerate(patches):
        patch_files.append(root / f"{k:02d}-{name}")
        patch_files[-1].write_text(text)
    _write_tree(tree, files)

    def gnu() -> None:
        for p in patch_files:
            _gnu(tree, p, dry=not chained)

    bare_s, engine_s, gnu_s = _best(
        [lambda: engine(patches, files, prove=False), lambda: engine(patches, files), gnu], repeat,
        [None, None, (lambda: _write_tree(tree, files)) if chained else None])
    _report(title, bare_s, engine_s, gnu_s, "(real run)" if chained else "--dry-run")


# ----------------------------------------------------------------------------- the cases


def _diff(root: Path, old: dict[str, str], new: dict[str, str]) -> str:
    """GNU diff -u of the files both sides have, as one patch."""
    parts = []
    for path in WHOLE_FILES:
        if path not in old or path not in new:
            continue
        for side, text in (("a", old[path]), ("b", new[path])):
            (root / side / path).parent.mkdir(parents=True, exist_ok=True)
            (root / side / path).write_text(text)
        run = subprocess.run(["diff", "-u", "--label", f"a/{path}", "--label", f"b/{path}",
                              f"a/{path}", f"b/{path}"], cwd=root, capture_output=True, text=True)
        parts.append(run.stdout)
    return "".join(parts)


def _one_hunk_sections(patch: str) -> str:
    """The same hunks, each in a file section of its own (header repeated), in order."""
    out, header = [], ""
    for fp in parse_patch(patch, name="whole.diff"):
        header = f"--- a/{fp.path}\n+++ b/{fp.path}\n"
        for h in fp.hunks:
            body = "".join(f"{tag}{text}\n" for tag, text in h.lines)
            out.append(f"{header}{h.header}\n{body}")
    return "".join(out)


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


def _common_lines_patch(text: str, count: int) -> str:
    """``count`` failing hunks whose context lines are among the file's most frequent lines."""
    lines = text.split("\n")[:-1]
    common = [line for line, _ in Counter(lines).most_common(6)]
    stride = max((len(lines) - 2) // count, 3)
    body = [f"--- a/{BIG}\n", f"+++ b/{BIG}\n"]
    for k in range(count):
        i = 1 + k * stride
        above, below = common[k % len(common)], common[(k + 1) % len(common)]
        body.append(f"@@ -{i},3 +{i},3 @@\n {above}\n-absent line {k}\n+changed line {k}\n {below}\n")
    return "".join(body)


def _alternating(n: int) -> list[str]:
    return ["x = 0" if k % 2 == 0 else "y = 1" for k in range(n)]


def _big_failing_hunk(path: str, at: int, context: int) -> str:
    """One hunk on a file of alternating lines: ``context`` lines, a removed line the file
    lacks, an added one, ``context`` more lines; old and new side 2 * context + 1 lines."""
    ctx = _alternating(at - 1 + 2 * context)[at - 1:]
    m = 2 * context + 1
    body = "".join(f" {line}\n" for line in ctx[:context]) + "-z = 2\n+z = 3\n"
    body += "".join(f" {line}\n" for line in ctx[context:])
    return f"--- a/{path}\n+++ b/{path}\n@@ -{at},{m} +{at},{m} @@\n{body}"


def main() -> None:
    if shutil.which("patch") is None or shutil.which("diff") is None:
        print("GNU patch or diff is not installed: no baseline, skipped")
        return
    try:
        series_patches = [(p.name, p.read_text()) for p in _series()]
        paths = {fp.path for name, text in series_patches for fp in parse_patch(text, name=name)}
        files = _release_files(paths)
        base = _release_files(WHOLE_FILES)
    except (FileNotFoundError, KeyError, OSError):
        print(f"no cached sglang {RELEASE} wheel under {cache_dir() / 'wheels'}: skipped")
        return
    RATIOS.clear()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        (root / "series").mkdir()
        hunks = engine(series_patches, files)
        _compare(f"1. series, {len(series_patches)} patches / {hunks} hunks / {len(files)} files, "
                 "a process per patch", root / "series", series_patches, files, chained=False, repeat=10)

        first_whole = None
        for old_v, new_v in PAIRS:
            try:
                old, new = _release_files(WHOLE_FILES, old_v), _release_files(WHOLE_FILES, new_v)
            except FileNotFoundError:
                print(f"2. whole-file diffs {old_v} -> {new_v}: a wheel is not cached, skipped")
                continue
            case = root / f"whole-{old_v}-{new_v}"
            case.mkdir()
            whole = _diff(case / "diff", old, new)
            if first_whole is None:
                first_whole = (whole, old)
            n = sum(len(fp.hunks) for fp in parse_patch(whole, name="whole.diff"))
            _compare(f"2. whole-file diffs {old_v} -> {new_v}, {n} hunks, one patch", case,
                     [("whole.diff", whole)], old, chained=False)

        if first_whole is not None:
            whole, old = first_whole
            single = _one_hunk_sections(whole)
            n = len(parse_patch(single, name="single.diff"))
            (root / "single").mkdir()
            _compare(f"3. single-hunk corpus, {n} one-hunk sections (case 2's first pair)", root / "single",
                     [("single.diff", single)], old, chained=True, repeat=3)

        (root / "failing").mkdir()
        _compare(f"4. {BIG}, {FAILING} failing hunks cut from the file", root / "failing",
                 [("failing.diff", _failing_patch(base[BIG], FAILING))], {BIG: base[BIG]}, chained=False)
        (root / "common").mkdir()
        _compare(f"5. {BIG}, {FAILING} failing hunks made of common lines", root / "common",
                 [("common.diff", _common_lines_patch(base[BIG], FAILING))], {BIG: base[BIG]}, chained=False)

        module = "sglang/ddtree_bench_module.py"
        lines = _alternating(20_000)
        create = f"--- /dev/null\n+++ b/{module}\n@@ -0,0 +1,{len(lines)} @@\n" + "".join(f"+{x}\n" for x in lines)
        change = _big_failing_hunk(module, 6001, 4000)
        size = len(create) + len(change)
        (root / "twopatch").mkdir()
        _compare(f"6. two-patch series ({size / 1000:.0f} KB): a 20,000-line module, then a failing "
                 "8,001-line hunk", root / "twopatch",
                 [("0001.patch", create), ("0002.patch", change)], {module: None}, chained=True, repeat=3)

        big = "sglang/ddtree_bench_big.py"
        text = "".join(f"{x}\n" for x in _alternating(40_000))
        (root / "bighunk").mkdir()
        _compare("7. a failing 16,001-line hunk on a 40,000-line file", root / "bighunk",
                 [("big.diff", _big_failing_hunk(big, 12_001, 8000))], {big: text}, chained=False, repeat=3)

    for k, what in ((1, "engine"), (2, "engine + proof")):
        worst = max(RATIOS, key=lambda item: item[k])
        missed = [title.split(",")[0] for title, *ratios in RATIOS if ratios[k - 1] > GOAL]
        print(f"{what}: worst ratio {worst[k]:.2f} ({worst[0].split(',')[0]}); goal <= {GOAL:g} "
              + ("met on every case" if not missed else f"NOT met on {len(missed)} of {len(RATIOS)}: "
                 + "; ".join(missed)))
