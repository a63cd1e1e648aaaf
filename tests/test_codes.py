"""codes.py is the one list of error codes and journal phases. The host programs (stdlib,
shipped to hosts) name them from it too: codes.py ships with them (hostprog.bundle), so a
host program's code is a ``Code.X`` name, never a string literal. These tests read the
host programs' sources and fail when a code is written as a literal there, when a name
does not exist, or when the agent's codes and AGENT_CODES differ (added, renamed or
dropped on one side only)."""

from __future__ import annotations

import ast

from ddtree_deploy import codes
from ddtree_deploy.codes import Code, Phase
from ddtree_deploy.hostprog import bundle, state

PROGRAMS = [f"ddtree_deploy.hostprog.{name}" for name in ("agent", "smoke", "serve", "tune")]
HOST_MODULES = sorted({m for p in PROGRAMS for m in bundle.shipped(p)} - {"ddtree_deploy.codes"})
AGENT_MODULES = [m for m in bundle.shipped("ddtree_deploy.hostprog.agent") if m != "ddtree_deploy.codes"]


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
