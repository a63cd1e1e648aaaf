"""codes.py is the one list of error codes and journal phases; the host agent (stdlib,
copied to hosts, so it cannot import codes.py) writes the same literals. These tests
read the agent's source and fail when a code or phase is added, renamed or dropped on
one side only."""

from __future__ import annotations

import ast
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

