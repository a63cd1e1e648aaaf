"""codes.py is the one list of error codes and journal phases; the host agent (stdlib,
copied to hosts, so it cannot import codes.py) writes the same literals. These tests
read the agent's source and fail when a code or phase is added, renamed or dropped on
one side only."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from ddtree_deploy import agent
from ddtree_deploy.base import codes
from ddtree_deploy.base.codes import Code, Phase

AGENT_SRC = Path(agent.__file__).read_text()


def _agent_codes() -> set[str]:
    """Every code the agent can answer with: AgentError("<code>", ...) and {"code": "<code>"} literals."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(AGENT_SRC)):
        if (isinstance(node, ast.Call) and getattr(node.func, "id", None) == "AgentError" and node.args
                and isinstance(node.args[0], ast.Constant)):
            found.add(node.args[0].value)
        if isinstance(node, ast.Dict):
            for k, v in zip(node.keys, node.values):
                if isinstance(k, ast.Constant) and k.value == "code" and isinstance(v, ast.Constant):
                    found.add(v.value)
    return found


def test_agent_codes_are_the_constants():
    assert _agent_codes() == set(codes.AGENT_CODES)
    assert agent.LOST_LOCK == Code.LOST_LOCK  # the name the agent compares codes with


def test_agent_phases_are_the_constants():
    assert tuple(agent.PHASES) == codes.JOURNAL_PHASES
    assert set(codes.JOURNAL_PHASES) | {Phase.NEVER_DEPLOYED} == {
        v for k, v in vars(Phase).items() if k.isupper()}


def test_code_values_are_unique_slugs():
    values = [v for k, v in vars(Code).items() if k.isupper()]
    assert len(values) == len(set(values))
    assert all(v == v.lower() and " " not in v for v in values)
    assert codes.BEFORE_CHANGE <= set(values) and codes.AGENT_CODES <= set(values)



# ---------------------------------------------------------------- no code literal outside codes.py

PACKAGE = Path(codes.__file__).resolve().parents[1]
#: The stdlib-only host programs cannot import codes.py: they write the literals (checked above).
#: (At the package's top level, or in its hostprog/ room once branch hostprog is merged.)
HOST_PROGRAMS = {"agent.py", "smoke_agent.py", "serve_agent.py", "tune_agent.py", "image_apply.py"}
#: Branch hostprog owns how transport ships the host programs (HostProgram, ProgramSession and the
#: AGENT constant); their literals move into codes.py there. Drop this once that branch is merged.
NOT_YET = {("remote/transport.py", name) for name in ("HostProgram", "ProgramSession", "AGENT")}
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
    """Issue #24: every error code and journal phase is a name from codes.py; the host programs,
    which cannot import it, are checked against it above."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        if path.name in HOST_PROGRAMS or rel == "base/codes.py" or rel.startswith(("_data/", "hostprog/")):
            continue
        skip = {name for file, name in NOT_YET if file == rel}
        found += [f"{rel}:{line}: {value!r}" for line, value in code_literals(path.read_text(encoding="utf-8"), skip)]
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
