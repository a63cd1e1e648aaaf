"""codes.py is the one list of error codes and journal phases. The host programs (stdlib,
shipped to hosts) name them from it too: codes.py ships with them (hostprog.bundle), so a
host program's code is a ``Code.X`` name, never a string literal. These tests read the
host programs' sources and fail when a code is written as a literal there, when a name
does not exist, or when the agent's codes and AGENT_CODES differ (added, renamed or
dropped on one side only)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from ddtree_deploy.base import codes
from ddtree_deploy.base.codes import Code, Phase
from ddtree_deploy.hostprog import bundle, state

PROGRAMS = [f"ddtree_deploy.hostprog.{name}" for name in ("agent", "smoke", "serve", "tune", "container")]
HOST_MODULES = sorted({m for p in PROGRAMS for m in bundle.shipped(p)} - {"ddtree_deploy.base.codes"})
AGENT_MODULES = [m for m in bundle.shipped("ddtree_deploy.hostprog.agent") if m != "ddtree_deploy.base.codes"]


def _code_places(module: str):
    """Every place ``module`` gives an error code: AgentError's first argument, a ``code=``
    argument or parameter default, a ``{"code": ...}`` value."""
    for node in ast.walk(ast.parse(bundle.module_text(module))):
        if isinstance(node, ast.Call):
            if getattr(node.func, "id", None) == "AgentError" and node.args:
                yield node.args[0]
            yield from (k.value for k in node.keywords if k.arg == "code")
        elif isinstance(node, ast.Dict):
            yield from (v for k, v in zip(node.keys, node.values) if isinstance(k, ast.Constant) and k.value == "code")
        elif isinstance(node, ast.arguments):
            args = node.posonlyargs + node.args
            yield from (d for a, d in zip(args[len(args) - len(node.defaults):], node.defaults) if a.arg == "code")


def _code_name(node) -> str | None:
    return node.attr if isinstance(node, ast.Attribute) and getattr(node.value, "id", None) == "Code" else None


def test_no_host_program_writes_a_code_as_a_literal():
    literals = [f"{m}:{n.lineno}: {n.value!r}" for m in HOST_MODULES for n in _code_places(m)
                if isinstance(n, ast.Constant) and isinstance(n.value, str)]
    assert literals == []


def test_every_code_name_a_host_program_uses_exists():
    used = {(m, node.attr) for m in HOST_MODULES for node in ast.walk(ast.parse(bundle.module_text(m)))
            if _code_name(node)}
    assert used and [(m, name) for m, name in used if not hasattr(Code, name)] == []


def test_agent_codes_are_the_constants():
    raised = {getattr(Code, _code_name(n)) for m in AGENT_MODULES for n in _code_places(m) if _code_name(n)}
    assert raised == set(codes.AGENT_CODES)


def test_agent_phases_are_the_constants():
    assert tuple(state.PHASES) == codes.JOURNAL_PHASES
    assert set(codes.JOURNAL_PHASES) | {Phase.NEVER_DEPLOYED} == {
        v for k, v in vars(Phase).items() if k.isupper()}


def test_code_values_are_unique_slugs():
    values = [v for k, v in vars(Code).items() if k.isupper()]
    assert len(values) == len(set(values))
    assert all(v == v.lower() and " " not in v for v in values)
    assert codes.BEFORE_CHANGE <= set(values) and codes.AGENT_CODES <= set(values)


# ---------------------------------------------------------------- no code literal outside codes.py

PACKAGE = Path(codes.__file__).resolve().parents[1]
#: The host programs' room (hostprog/) is left to the checks above: its shipped modules are
#: checked there, and image_apply.py runs inside an image build without the package beside it,
#: so it writes its few codes as literals.
HOST_ROOM = "hostprog/"
CODE_KEYS = {"code", "phase"}
SLUG = re.compile(r"[a-z][a-z0-9-]*")


def _keyed(node) -> bool:
    """``code``, ``x.code``, ``x["code"]``, ``x.get("code")`` (and the same for ``phase``)."""
    if isinstance(node, ast.Name):
        return _is_code_name(node.id)
    if isinstance(node, ast.Attribute):
        return node.attr in CODE_KEYS
    if isinstance(node, ast.Subscript):
        return isinstance(node.slice, ast.Constant) and node.slice.value in CODE_KEYS
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get"
            and bool(node.args) and isinstance(node.args[0], ast.Constant) and node.args[0].value in CODE_KEYS)


def _strings(node) -> list[ast.Constant]:
    """The slug-like string constants in ``node`` (a code is one: "no-version"; "?" is no code)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node] if SLUG.fullmatch(node.value) else []
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return [c for e in node.elts for c in _strings(e)]
    if isinstance(node, ast.BoolOp):
        return [c for v in node.values for c in _strings(v)]
    if isinstance(node, ast.IfExp):
        return _strings(node.body) + _strings(node.orelse)
    if isinstance(node, ast.Call) and getattr(node.func, "id", None) in ("frozenset", "set", "tuple"):
        return [c for a in node.args for c in _strings(a)]
    return []


def _is_code_name(name: str) -> bool:
    return name in CODE_KEYS or name.lower().endswith(("_code", "_codes")) or name in ("CODE", "CODES", "STOPPERS")


def code_literals(source: str, skip: set[str] = frozenset()) -> list[tuple[int, str]]:
    """(line, literal) for each error code or journal phase spelled as a string where a code goes:
    ``code="x"`` (any ``*_code=`` too), ``{"code": "x"}``, ``code = "x"`` and a ``*_CODES``
    constant, a ``code: str = "x"`` default, and ``x.code == "x"`` / ``x.get("code") in (...)``."""
    tree = ast.parse(source)
    skipped = {id(n) for top in tree.body for n in ast.walk(top)
               if getattr(top, "name", None) in skip
               or isinstance(top, ast.Assign) and any(getattr(t, "id", None) in skip for t in top.targets)}
    found = []
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        hits: list[ast.Constant] = []
        if isinstance(node, ast.keyword) and node.arg and _is_code_name(node.arg):
            hits = _strings(node.value)
        elif isinstance(node, ast.Dict):
            hits = [c for k, v in zip(node.keys, node.values)
                    if isinstance(k, ast.Constant) and k.value in CODE_KEYS for c in _strings(v)]
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(_is_code_name(getattr(t, "id", None) or getattr(t, "attr", "")) for t in targets):
                hits = _strings(node.value) if node.value is not None else []
        elif isinstance(node, ast.arguments):
            args = node.posonlyargs + node.args
            pairs = list(zip(args[len(args) - len(node.defaults):], node.defaults))
            pairs += [(a, d) for a, d in zip(node.kwonlyargs, node.kw_defaults) if d is not None]
            hits = [c for a, d in pairs if _is_code_name(a.arg) for c in _strings(d)]
        elif isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            if any(_keyed(s) for s in sides):
                hits = [c for s in sides for c in _strings(s)]
        found += [(c.lineno, c.value) for c in hits]
    return found


def test_no_code_literal_outside_codes_py():
    """Issue #24: every error code and journal phase is a name from codes.py, outside the host
    programs too (checked above)."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        if rel == "base/codes.py" or rel.startswith(("_data/", HOST_ROOM)):
            continue
        found += [f"{rel}:{line}: {value!r}" for line, value in code_literals(path.read_text(encoding="utf-8"))]
    assert found == []


def test_the_literal_finder_finds_each_form():
    source = '''
class E(Exception):
    code = "failed"
def f(exc, reply, code: str = "x1"):
    raise E(code="locked", hint="a hint is free text")
    if exc.code == "drift" or reply.get("code") in ("a", "b") or reply["phase"] != "deployed" or code == "u":
        return {"code": "c", "message": "free text"}
BAD_INPUT_CODES = frozenset({"bad-state-dir"})
'''
    assert sorted(v for _, v in code_literals(source)) == sorted(
        ["failed", "x1", "locked", "drift", "a", "b", "deployed", "u", "c", "bad-state-dir"])
    assert code_literals('raise E(code=Code.LOCKED)\nif exc.code == Code.DRIFT: pass\n') == []
