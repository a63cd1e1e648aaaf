"""The host programs (ddtree_deploy/hostprog/) ship as they are and run on any host Python.

A host has no ddtree-deploy and perhaps an old interpreter, so every module a program
ships with (hostprog.bundle.shipped) may import only the standard library and modules
shipped with it: checked on the source (every import, inside functions and try/except
ImportError fallbacks too, and the child scripts the smoke program runs), on the grammar
(Python 3.8, the oldest a host may have: docs/architecture.md) and by running each
bundle in an interpreter that cannot import this package at all (``python -S -I``), under
Python 3.8 itself when this machine has one.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ddtree_deploy.hostprog import bundle
from ddtree_deploy.hostprog.protocol import PROTOCOL

ROOM = Path(bundle.__file__).parent
PROGRAMS = [f"ddtree_deploy.hostprog.{name}" for name in ("agent", "smoke", "serve", "tune", "container")]
OLDEST = (3, 8)  # the oldest Python a host may have (docs/architecture.md)
# Strings the smoke program runs as scripts in a child interpreter on the host.
CHILD_SCRIPTS = ("_IMPORT_CHILD", "_VALIDATE_CHILD", "_RELEASE_HELPERS")


def outside_imports(text: str, shipped: set[str], where: str) -> list[str]:
    """Every import in ``text`` of something neither in the standard library nor shipped
    (``shipped``: dotted module names), as ``where:line: name``."""
    bad = []
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                bad.append(f"{where}:{node.lineno}: a relative import")
                continue
            names = [node.module] if node.module == "__future__" else \
                [f"{node.module}.{a.name}" for a in node.names]
        elif (isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", None))
              in ("import_module", "__import__") and node.args and isinstance(node.args[0], ast.Constant)):
            names = [node.args[0].value]
        else:
            continue
        for name in names:
            top = name.split(".")[0]
            if top in sys.stdlib_module_names:
                continue
            # ``from P import x``: x is a shipped module, or an attribute of shipped module P.
            if name in shipped or name.rpartition(".")[0] in shipped:
                continue
            bad.append(f"{where}:{node.lineno}: {name}")
    return sorted(bad, key=lambda line: int(line.split(":")[1]))


def child_scripts(text: str) -> list[tuple[str, str]]:
    """The module-level string constants of ``text`` that are scripts run by a child interpreter."""
    out = []
    for node in ast.parse(text).body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and getattr(node.targets[0], "id", None) in \
                CHILD_SCRIPTS:
            # A script's text, or a concatenation of scripts (the shared helpers + its own).
            out += [(node.targets[0].id, part.value) for part in ast.walk(node.value)
                    if isinstance(part, ast.Constant) and isinstance(part.value, str)]
    return out


@pytest.mark.parametrize("program", PROGRAMS)
def test_a_program_imports_only_the_standard_library_and_what_ships_with_it(program):
    shipped = bundle.shipped(program)
    assert shipped[-1] == program and "ddtree_deploy.hostprog.wire" in shipped
    bad = []
    for module in shipped:
        text = bundle.module_text(module)
        bad += outside_imports(text, set(shipped), module)
        for name, script in child_scripts(text):
            bad += outside_imports(script, set(), f"{module}.{name}")  # the child has nothing shipped
    assert bad == []


def test_the_check_catches_every_way_to_import_from_outside():
    """The check above can fail: a third-party import inside a function, a try/except
    ImportError fallback to the controller's package, a relative import, importlib."""
    text = (
        "import json\n"
        "from ddtree_deploy.hostprog import wire\n"
        "def f():\n"
        "    import requests\n"
        "try:\n"
        "    import yaml\n"
        "except ImportError:\n"
        "    from ddtree_deploy import cli\n"
        "from . import lock\n"
        "import importlib\n"
        "importlib.import_module('paramiko')\n"
    )
    assert outside_imports(text, {"ddtree_deploy.hostprog.wire"}, "m") == [
        "m:4: requests", "m:6: yaml", "m:8: ddtree_deploy.cli", "m:9: a relative import", "m:11: paramiko"]


def test_the_smoke_programs_child_scripts_are_checked():
    text = bundle.module_text("ddtree_deploy.hostprog.smoke")
    assert {name for name, _ in child_scripts(text)} == set(CHILD_SCRIPTS)


@pytest.mark.parametrize("program", PROGRAMS)
def test_every_shipped_module_and_the_bundle_parse_as_python_3_8(program):
    for module in bundle.shipped(program):
        ast.parse(bundle.module_text(module), filename=module, feature_version=OLDEST)
    ast.parse(bundle.source(program), feature_version=OLDEST)


def test_the_room_stays_shippable():
    """Its modules, run as a script from a checkout, sit first on sys.path: none may shadow a
    standard module. A shipped module never reads ``__file__`` (a bundle's modules have
    none). The room's ``__init__`` never ships (a host gets a stub package): a docstring only."""
    names = {p.stem for p in ROOM.glob("*.py")} - {"__init__"}
    assert not names & set(sys.stdlib_module_names)
    shipped = {m for p in PROGRAMS for m in bundle.shipped(p)}
    for module in shipped:
        tree = ast.parse(bundle.module_text(module))
        assert not [n for n in ast.walk(tree) if isinstance(n, ast.Name) and n.id == "__file__"], module
    assert "ddtree_deploy.hostprog.bundle" not in shipped
    init = ast.parse((ROOM / "__init__.py").read_text())
    assert len(init.body) == 1 and isinstance(init.body[0].value, ast.Constant)


def private_uses(text: str, where: str) -> list[str]:
    """Every use in ``text`` of another host module's private name (``mod._name``, or
    ``from ddtree_deploy.hostprog.mod import _name``), as ``where:line: mod._name``."""
    tree = ast.parse(text)
    modules = {}  # local name -> the host module it is bound to
    bad = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == "ddtree_deploy.hostprog":
            modules.update({a.asname or a.name: a.name for a in node.names})
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("ddtree_deploy.hostprog."):
            bad += [f"{where}:{node.lineno}: {node.module.rsplit('.', 1)[1]}.{a.name}" for a in node.names
                    if a.name.startswith("_")]
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in modules
                and node.attr.startswith("_") and not node.attr.startswith("__")):
            bad.append(f"{where}:{node.lineno}: {modules[node.value.id]}.{node.attr}")
    return sorted(bad, key=lambda line: int(line.split(":")[1]))


def test_what_one_host_module_uses_of_another_is_public_there():
    """A helper two programs share lives in a module of its own under a public name (the
    server lifecycle in server.py), not borrowed from another program's private names."""
    bad = [line for path in sorted(ROOM.glob("*.py"))
           for line in private_uses(path.read_text(encoding="utf-8"), path.name)]
    assert bad == []


def test_the_private_use_check_catches_both_ways_in():
    text = ("from ddtree_deploy.hostprog import smoke as sa, wire\n"
            "from ddtree_deploy.hostprog.server import _scan_log, tail\n"
            "sa._http('GET', 'u')\nwire.one_request(None, None)\nsa.__name__\n")
    assert private_uses(text, "m") == ["m:2: server._scan_log", "m:3: smoke._http"]


def test_the_server_lifecycle_travels_with_every_program_that_starts_or_asks_a_server():
    """server.py ships with each program that uses it (bundle.shipped follows the imports);
    the tune program, which only borrows the lifecycle, no longer ships the smoke program."""
    for name in ("smoke", "serve", "tune", "container"):
        assert "ddtree_deploy.hostprog.server" in bundle.shipped(f"ddtree_deploy.hostprog.{name}"), name
    assert "ddtree_deploy.hostprog.smoke" not in bundle.shipped("ddtree_deploy.hostprog.tune")


def test_the_bundler_refuses_what_cannot_ship():
    with pytest.raises(bundle.BundleError, match="relative import"):
        bundle.package_imports("m", "from . import wire\n")
    assert bundle.package_imports("m", "import os\nfrom ddtree_deploy.hostprog import wire, smoke\n"
                                       "from ddtree_deploy.base.codes import Code\n") == [
        "ddtree_deploy.hostprog.wire", "ddtree_deploy.hostprog.smoke", "ddtree_deploy.base.codes"]


# ---------------------------------------------------------------- run where the package cannot be imported

# One exchange per program whose answer needs no SGLang: (request lines, exit status, check of the last line).
EXCHANGES = {
    "agent": ('{"op": "init", "protocol": %d, "state_dir": "~/.ddtree-deploy"}\n{"op": "fly"}\n' % PROTOCOL, 0,
              lambda last: last == {"ok": False, "code": "protocol", "message": "unknown op 'fly'"}),
    "smoke": ('{"levels": ["compile"], "compile": {"files": ["%s"]}}\n' % bundle.__file__, 0,
              lambda last: last["event"] == "done" and last["ok"] and last["levels"][0]["status"] == "passed"),
    "serve": ('{"op": "fly", "python": "/usr/bin/python3"}\n', 2,
              lambda last: last == {"event": "done", "ok": False, "error": "bad request: \"unknown op 'fly'\""}),
    "tune": ('{"op": "end"}\n', 0, lambda last: last == {"event": "bye"}),
    # The container program's init fails (no such engine here) yet the hello passed: the next is answered.
    "container": ('{"op": "init", "protocol": %d, "container": {"engine": "podman", "name": "c"}}\n'
                  '{"op": "fly"}\n' % PROTOCOL, 0,
                  lambda last: last == {"ok": False, "code": "protocol", "message": "unknown op 'fly'"}),
}


def _interpreters():
    """This interpreter and Python 3.8, the oldest a host may have: the 3.8 case is always
    collected, and skips saying so on a machine without one (it used to vanish silently)."""
    from ddtree_testkit.system_tools import python_3_8

    return [("this", sys.executable), ("3.8", python_3_8())]


@pytest.mark.parametrize("python", _interpreters(), ids=lambda p: p[0])
@pytest.mark.parametrize("name", sorted(EXCHANGES))
def test_each_bundle_runs_where_ddtree_deploy_cannot_be_imported(name, python, tmp_path):
    """Shipped the way a session ships it (BOOTSTRAP, the length-prefixed source on stdin),
    to ``python -S -I``: no site-packages, no PYTHONPATH, so nothing of this checkout can be
    imported; only what the bundle carries runs."""
    from ddtree_deploy.remote.program import BOOTSTRAP

    _label, exe = python
    if exe is None:  # none is installed by the project: the 3.8 syntax is checked above for every program
        pytest.skip("no Python 3.8 interpreter on this machine (every program's 3.8 syntax is checked above)")
    request, status, check = EXCHANGES[name]
    source = bundle.source(f"ddtree_deploy.hostprog.{name}")
    probe = subprocess.run([exe, "-S", "-I", "-c", "import ddtree_deploy"], capture_output=True, cwd=tmp_path)
    assert probe.returncode == 1 and b"No module named 'ddtree_deploy'" in probe.stderr
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path)}
    done = subprocess.run([exe, "-S", "-I", "-c", BOOTSTRAP], input=b"%d\n" % len(source) + source
                          + request.encode(), capture_output=True, cwd=tmp_path, env=env, timeout=60)
    # A one-shot program's main returns its status; BOOTSTRAP discards it (python -c exits 0).
    assert done.returncode == 0, done.stderr.decode()
    last = json.loads(done.stdout.decode().splitlines()[-1])
    assert check(last), last
    # Written to a file and run as a script (the image build, `matrix --import`): its status too.
    script = tmp_path / f"{name}.py"
    script.write_bytes(source)
    ran = subprocess.run([exe, "-S", "-I", str(script)], input=request.encode(), capture_output=True, cwd=tmp_path,
                         env=env, timeout=60)
    assert ran.returncode == status, ran.stderr.decode()
    assert check(json.loads(ran.stdout.decode().splitlines()[-1]))
