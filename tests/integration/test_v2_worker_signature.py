"""``DDTreeWorkerV2`` takes what each release's scheduler hands a speculative worker.

The scheduler builds the worker as ``DraftWorkerClass(**draft_worker_kwargs)``, and the keyword
set changed three times across the v2 releases (0.5.14 - 0.5.15.post1: the ranks one by one;
0.5.18 - 0.5.19: a ``ps`` ParallelState; 0.5.20+: neither). ``__init__`` needs a GPU (it loads
the draft model), so no CPU test drives it: this one reads, from each release wheel's own files,
the keywords the scheduler passes and the parameters ``DFlashWorkerV2.__init__`` takes, and
binds both to the payload's ``DDTreeWorkerV2.__init__`` (the payload parsed, not imported: it
imports SGLang). It failed on 0.5.18 and 0.5.19 with the fixed 0.5.20 signature (``ps``).

Cheap: three small files read from the cached wheels per release, no environment built.
"""

from __future__ import annotations

import ast
import inspect
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent.parent
WORKER = REPO / "payload" / "ddtree_worker_v2.py"
# A release of each scheduler spelling, and each v2 family's probe release.
RELEASES = ("0.5.14", "0.5.15.post1", "0.5.16", "0.5.18", "0.5.19", "0.5.23")


def _wheel_source(version: str, path: str) -> str:
    from ddtree_deploy.sandbox import release_wheel

    with zipfile.ZipFile(release_wheel(version)) as zf:
        return zf.read(path).decode()


def _scheduler_kwargs(version: str) -> list[str]:
    """The keywords of ``draft_worker_kwargs = dict(...)`` in the release's scheduler."""
    tree = ast.parse(_wheel_source(version, "sglang/srt/managers/scheduler.py"))
    for node in ast.walk(tree):
        if (isinstance(node, ast.Assign) and len(node.targets) == 1
                and getattr(node.targets[0], "id", None) == "draft_worker_kwargs"
                and isinstance(node.value, ast.Call)):
            return [kw.arg for kw in node.value.keywords]
    raise AssertionError(f"sglang {version}: no draft_worker_kwargs = dict(...) in scheduler.py")


def _init_signature(source: str, cls: str) -> inspect.Signature:
    """``cls.__init__``'s signature from source (names and kinds; defaults as None)."""
    tree = ast.parse(source)
    klass = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls)
    init = next(n for n in klass.body if isinstance(n, ast.FunctionDef) and n.name == "__init__")
    a = init.args
    params = [inspect.Parameter(p.arg, inspect.Parameter.POSITIONAL_OR_KEYWORD)
              for p in a.posonlyargs + a.args]
    if a.vararg:
        params.append(inspect.Parameter(a.vararg.arg, inspect.Parameter.VAR_POSITIONAL))
    params += [inspect.Parameter(p.arg, inspect.Parameter.KEYWORD_ONLY,
                                 default=None if d is not None else inspect.Parameter.empty)
               for p, d in zip(a.kwonlyargs, a.kw_defaults)]
    if a.kwarg:
        params.append(inspect.Parameter(a.kwarg.arg, inspect.Parameter.VAR_KEYWORD))
    return inspect.Signature(params)


@pytest.mark.parametrize("version", RELEASES)
def test_the_worker_takes_what_the_scheduler_hands_it(version):
    kwargs = {name: object() for name in _scheduler_kwargs(version)}
    base = _init_signature(
        _wheel_source(version, "sglang/srt/speculative/dflash_worker_v2.py"), "DFlashWorkerV2")
    ours = _init_signature(WORKER.read_text(), "DDTreeWorkerV2")
    base.bind(None, **kwargs)  # the release's own worker takes them (the test's premise)
    ours.bind(None, **kwargs)  # and so does DDTree's, on every release


def test_the_worker_passes_the_scheduler_s_arguments_on_unchanged():
    # What __init__ hands DFlashWorkerV2: server_args and the rest as given, nothing renamed.
    tree = ast.parse(WORKER.read_text())
    klass = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "DDTreeWorkerV2")
    init = next(n for n in klass.body if isinstance(n, ast.FunctionDef) and n.name == "__init__")
    calls = [n for n in ast.walk(init) if isinstance(n, ast.Call)
             and isinstance(n.func, ast.Attribute) and n.func.attr == "__init__"]
    assert [ast.unparse(c) for c in calls] == ["super().__init__(server_args, *args, **kwargs)"]
