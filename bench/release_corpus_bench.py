"""Ranked evidence on SGLang's own release diffs: the figures of issue 28 item 6, measured.

    python -m bench release_corpus_bench
    RELEASE_CORPUS_ENGINE=/a/checkout python -m bench release_corpus_bench   # another engine

The corpus is ddtree_testkit/release_corpus.py's: every consecutive pair of the fifteen PyPI
releases 0.5.12 ... 0.5.23, every .py file under sglang/ that changed, its `diff -u`. Printed,
at fuzz 0, 1 and 2:

- own base: the diff on the older release: hunks the engine refuses (failed), hunks not
  exact, results that are not the newer file; GNU patch --dry-run's refusals and the hunks
  where its verdict, line, offset or fuzz differ from the engine's;
- patched: the diff on the newer release: files where some hunk is not already applied,
  hunks written a second time; GNU patch -N's files "previously applied" and files it would
  write a second time;
- lookalikes: the first hunk of every changed file alone, with a copy of its new side on top
  of the older file ("new") or of its old side on top of the newer file ("old"): refused
  naming both places, decided right (an anchor or a match at the stated line), wrong
  (skipped / written twice), failed otherwise.

Figures, not times: the test (tests/integration/test_release_corpus.py) pins them; RELEASE_CORPUS_ENGINE
names a checkout (or any folder holding a ddtree_deploy package) whose engine is measured
instead of this one, for the before/after figures (run this bench alone then: the engine is
chosen when it is first imported). About 1 minute of CPU; the files of one release pair at a
time (about 70 MB) in a temporary folder.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path

FUZZ = (0, 1, 2)
ROWS = (
    ("own base: hunks refused", "own {f}: refused"),
    ("own base: hunks not exact", "own {f}: not exact"),
    ("own base: result not the newer file", "own {f}: wrong text"),
    ("own base: GNU patch refuses", "gnu own {f}: hunks refused"),
    ("own base: GNU patch differs", "gnu own {f}: disagree"),
    ("patched: files not all already", "patched {f}: files failing"),
    ("patched: hunks not already", "patched {f}: hunks not already"),
    ("patched: hunks written again", "patched {f}: hunks written"),
    ("patched: GNU -N 'previously applied'", "gnu patched {f}: files reversed"),
    ("patched: GNU -N writes again (files)", "gnu patched {f}: files written twice"),
    ("lookalike new side: refused", "lookalike new {f}: refused"),
    ("lookalike new side: right", "lookalike new {f}: right"),
    ("lookalike new side: skipped (wrong)", "lookalike new {f}: wrong"),
    ("lookalike new side: failed", "lookalike new {f}: failed"),
    ("lookalike old side: refused", "lookalike old {f}: refused"),
    ("lookalike old side: right", "lookalike old {f}: right"),
    ("lookalike old side: twice (wrong)", "lookalike old {f}: wrong"),
    ("lookalike old side: failed", "lookalike old {f}: failed"),
)


def main() -> None:
    engine = os.environ.get("RELEASE_CORPUS_ENGINE")
    if engine:
        sys.path.insert(0, str(Path(engine).resolve()))
    import ddtree_deploy
    from ddtree_testkit.release_corpus import RELEASES, measure

    print(f"engine: {Path(ddtree_deploy.__file__).parent}")
    started = time.process_time()
    with tempfile.TemporaryDirectory(prefix="release-corpus-") as work:
        stats = measure(Path(work))
    print(f"corpus: {stats['pairs']} release pairs {RELEASES[0]} -> {RELEASES[-1]}, {stats['files']:,} "
          f"changed files, {stats['hunks']:,} hunks ({time.process_time() - started:.0f} s of CPU here)")
    width = max(len(label) for label, _ in ROWS)
    print(f"{'':{width}}  " + "  ".join(f"{'fuzz ' + str(f):>8}" for f in FUZZ))
    for label, key in ROWS:
        print(f"{label:{width}}  " + "  ".join(f"{stats[key.format(f=f)]:>8,}" for f in FUZZ))


if __name__ == "__main__":
    main()
