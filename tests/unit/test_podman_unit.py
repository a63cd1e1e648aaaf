"""The test modules that drive podman run as one unit of work under `make test` (one worker,
one after the other: podman is flaky when several run at once), found from their source: a
module that imports tests/container_host.py or asks for its ``engine`` or ``box`` fixture."""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parent.parent
REPO = TESTS.parent


def drives_podman(path: Path) -> bool:
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == "container_host":
            return True
        if isinstance(node, ast.FunctionDef) and node.name.startswith("test_"):
            if {a.arg for a in node.args.args} & {"engine", "box"}:
                return True
    return False


def root_conftest(config):
    """tests/conftest.py as pytest loaded it (``import conftest`` here is tests/unit's own)."""
    for plugin in config.pluginmanager.get_plugins():
        if Path(getattr(plugin, "__file__", None) or "/").resolve() == TESTS / "conftest.py":
            return plugin
    raise AssertionError("tests/conftest.py is not loaded")


def test_every_module_that_drives_podman_is_one_unit_with_the_others(pytestconfig):
    c = root_conftest(pytestconfig)
    found = {str(p.relative_to(REPO)) for p in TESTS.rglob("test_*.py") if drives_podman(p)}
    assert found == set(c.PODMAN_MODULES), found ^ set(c.PODMAN_MODULES)
    assert {c.work_unit(f"{m}::test_x") for m in found} == {c.PODMAN_UNIT}
    assert c.work_unit("tests/e2e/test_push.py::test_x") == "tests/e2e/test_push.py"  # others: their module
