"""Ranked evidence on SGLang's own release diffs (issue 28 item 6): no real hunk refused.

The corpus (ddtree_testkit/release_corpus.py): every consecutive pair of the fifteen PyPI
releases 0.5.12 ... 0.5.23 (post-releases included), every ``.py`` file under ``sglang/``
that changed between them, its ``diff -u`` by GNU diff. Each file's diff is applied by the
engine at fuzz 0, 1 and 2:

- to the older release, its own base: every hunk exact and the result the newer file byte for
  byte; GNU patch --dry-run (the oracle) applies every hunk at the same line (at fuzz 0: GNU
  tries fuzz 0 first, so a hunk it places exactly is placed so at -F1 and -F2 too; the bench
  runs GNU at every level);
- to the newer release, which has the change: every hunk already applied, nothing written.
  GNU patch -N (at fuzz 0) skips most of those files as "previously applied" and would write
  the others a second time (it checks the first hunk only);
- the first hunk alone, on the older file with a copy of its new side on top, and on the newer
  file with a copy of its old side on top (issue 21's lookalike, with real code: neither the
  copy nor the real place is at the line the hunk states): refused naming both places, or
  decided right by an anchor or a match at the stated line; never skipped, never written twice.
  Every fourth changed file (sorted by release, then path): the bench runs them all.

Before ranked evidence (9892cf5's engine) the same corpus refused 93 / 606 / 1,594 hunks on
their own base at fuzz 0 / 1 / 2 and failed 396 / 1,918 / 3,815 files on the newer release;
`python -m bench release_corpus_bench` prints every figure.
"""

from __future__ import annotations


import pytest

from ddtree_deploy.base.errors import DeployError
from ddtree_testkit import release_corpus
from ddtree_testkit.system_tools import require

pytestmark = pytest.mark.network  # fifteen wheels, fetched once into the cache, then offline
require("diff", "patch")  # the diffs and the oracle: a machine without them fails, never skips

LOOKALIKE_EVERY = 4  # the test's sample of the lookalike cases (the bench: every file)


@pytest.fixture(scope="module")
def figures(tmp_path_factory):
    try:
        release_corpus.wheels()
    except DeployError as exc:  # offline with an empty cache: nothing to run on
        pytest.skip(f"a wheel of SGLang {release_corpus.RELEASES[0]} .. {release_corpus.RELEASES[-1]} is "
                    f"not cached and PyPI is unreachable: {exc.message}")
    stats = release_corpus.measure(tmp_path_factory.mktemp("release-corpus"), gnu_levels=(0,),
                                   lookalike_every=LOOKALIKE_EVERY)
    print("\nrelease corpus:", dict(sorted(stats.items())))
    return stats


def test_the_corpus_is_every_changed_file_of_fourteen_release_pairs(figures):
    # Pinned: a corpus that silently shrank (a wheel's layout, a diff split wrongly) fails here.
    assert (figures["pairs"], figures["files"], figures["hunks"]) == (14, 10_896, 67_527)


@pytest.mark.parametrize("fuzz", release_corpus.FUZZ)
def test_every_hunk_applies_exactly_on_its_own_base(figures, fuzz):
    assert figures[f"own {fuzz}: refused"] == 0
    assert figures[f"own {fuzz}: not exact"] == 0
    assert figures[f"own {fuzz}: wrong text"] == 0  # apertus.py's CRLF -> LF change included
    # GNU patch, the oracle: every hunk succeeds, at the engine's line, offset and fuzz
    assert figures["gnu own 0: hunks refused"] == 0
    assert figures["gnu own 0: disagree"] == 0


@pytest.mark.parametrize("fuzz", release_corpus.FUZZ)
def test_every_hunk_is_already_applied_on_the_patched_release(figures, fuzz):
    assert figures[f"patched {fuzz}: files failing"] == 0
    assert figures[f"patched {fuzz}: hunks not already"] == 0
    assert figures[f"patched {fuzz}: hunks written"] == 0
    # GNU patch -N recognises most of those files and writes 72 a second time: the real
    # corpus has what the engine's rule is for.
    assert figures["gnu patched 0: files reversed"] == 10_824
    assert figures["gnu patched 0: files written twice"] == 72


@pytest.mark.parametrize("fuzz", release_corpus.FUZZ)
@pytest.mark.parametrize("side", ["new", "old"])
def test_a_lookalike_on_top_is_refused_naming_both_places(figures, side, fuzz):
    key = f"lookalike {side} {fuzz}"
    assert figures[f"{key}: wrong"] == 0  # never skipped ("new"), never written twice ("old")
    assert figures[f"{key}: failed"] == 0
    # every other one refused with both places; the rest decided by an anchor (a hunk whose
    # trailing context is shorter must end at the end of the file: the copy is out of reach)
    assert (figures[f"{key}: refused"], figures[f"{key}: right"]) == {"new": (2_458, 55), "old": (2_459, 54)}[side]
