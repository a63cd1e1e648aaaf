"""Calls only go down: no module imports one of a higher room (issue #24, section 1).

The package's folders are its rooms, lowest first in ``ORDER`` (the one place the order is
declared; each room's ``__init__`` docstring says the same in words). Every import is
read with ``ast`` from the source, the lazy ones inside functions included, and resolved to
the module it names (``from ddtree_deploy.engine import series`` is the module ``series``,
not the room's ``__init__``). A module may import its own room and the rooms below it.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import ddtree_deploy

PACKAGE = Path(ddtree_deploy.__file__).resolve().parent

#: The rooms, lowest first. "" is the package's own ``__init__`` (its version only).
ORDER = (
    "",
    "base",  # stdlib-only where the host programs need it: codes.py ships with them
    "hostprog",  # the stdlib-only programs shipped to a host (agent, smoke, serve, tune)
    "settings",
    "engine",
    "remote",
    "smoke",
    "release",
    "session",
    "tuning",
    "serve",
    "containers",  # [container] hosts: the image build context, the container program's session
    "fleets",
    "interop",
    "sandbox",  # loopback sshd and host environments, for the demo and the tests
    "cli",  # the commands, ``python -m ddtree_deploy`` and the demo
)

#: Modules filed in one room but run from a copy whose imports another room assembles: the
#: image build's RUN step (hostprog/image_apply.py, a host program: it runs in the image with
#: the image's Python) imports session/plan.py, which containers/image_context.py copies into
#: the build context beside it. Its imports are held to that room's rank; no module of the
#: package imports it (it is read as bytes, never loaded here).
RUN_FROM_A_COPY = {"ddtree_deploy.hostprog.image_apply": "containers"}

#: Modules at the package's top level, by room.
TOP_LEVEL = {
    "__init__": "",
    "__main__": "cli",
    "demo": "cli",
}


def _modules() -> dict[str, Path]:
    """Every module of the package: dotted name -> file."""
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE)
        if rel.parts[0].startswith(("_data", "__pycache__")):
            continue
        parts = ["ddtree_deploy", *rel.with_suffix("").parts]
        if parts[-1] == "__init__" and len(parts) > 2:
            parts.pop()
        out[".".join(parts)] = path
    return out


MODULES = _modules()


def room_of(module: str) -> str:
    parts = module.split(".")
    if len(parts) == 1:
        return ""
    if len(parts) == 2 and (PACKAGE / f"{parts[1]}.py").is_file():
        if parts[1] not in TOP_LEVEL:
            raise AssertionError(f"{module}: a module at the package's top level belongs in a room "
                                 f"(or in TOP_LEVEL here)")
        return TOP_LEVEL[parts[1]]
    if parts[1] not in ORDER:
        raise AssertionError(f"{module}: room {parts[1]!r} is not in ORDER (tests/unit/test_layering.py): "
                             "add it where it belongs, lowest first")
    return parts[1]


def imports_of(module: str, source: str) -> list[tuple[int, str]]:
    """(line, imported module) for every package import in ``source``, lazy ones included."""
    package = module if MODULES.get(module, Path()).name == "__init__.py" else module.rsplit(".", 1)[0]
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(anchor + ([node.module] if node.module else []))
            for a in node.names:
                # ``from pkg import name``: the submodule when there is one, else pkg itself.
                found.append((node.lineno, f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base))
    return [(line, name) for line, name in found if name == "ddtree_deploy" or name.startswith("ddtree_deploy.")]


def upward(module: str, source: str) -> list[str]:
    """The imports of ``module`` that climb to a higher room, one line each."""
    ranked = RUN_FROM_A_COPY.get(module, room_of(module))
    here = ORDER.index(ranked)
    bad = []
    for line, target in imports_of(module, source):
        room = room_of(target)
        if ORDER.index(room) > here:
            bad.append(f"{module}:{line} imports {target}: room {room!r} is above {ranked!r}")
        if target in RUN_FROM_A_COPY:
            bad.append(f"{module}:{line} imports {target}, which runs only from a copy (RUN_FROM_A_COPY)")
    return bad


def test_every_import_goes_down():
    bad = []
    for module, path in MODULES.items():
        bad += upward(module, path.read_text(encoding="utf-8"))
    assert bad == []


def test_every_module_is_in_a_known_room():
    rooms = {room_of(m) for m in MODULES}
    assert rooms <= set(ORDER)
    folders = {p.name for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").is_file()}
    assert folders <= set(ORDER), f"a package folder that is no room: {folders - set(ORDER)}"


@pytest.mark.parametrize("room", [r for r in ORDER if r and (PACKAGE / r / "__init__.py").is_file()])
def test_each_room_says_what_it_is_and_imports_nothing(room):
    """A room's ``__init__`` is its docstring (what the room is, what it may import) and
    nothing else: importing one module never loads a room's neighbours, and the image build
    copies a room's ``__init__`` along with the modules it needs."""
    tree = ast.parse((PACKAGE / room / "__init__.py").read_text(encoding="utf-8"))
    doc = ast.get_docstring(tree)
    if room in ("cli", "sandbox"):  # the rooms that were packages before: their __init__ exports
        assert doc
        return
    assert doc and len(doc.split()) >= 20 and "import" in doc.lower(), room
    assert len(tree.body) == 1, f"{room}/__init__.py holds more than its docstring"


@pytest.mark.parametrize(("module", "source"), [
    ("ddtree_deploy.session.push", "from ddtree_deploy.fleets import rollout\n"),
    ("ddtree_deploy.session.push", "def f():\n    from ddtree_deploy.fleets.run import run_fleet\n"),
    ("ddtree_deploy.engine.series", "import ddtree_deploy.smoke.plan as sp\n"),
    ("ddtree_deploy.base.errors", "from ddtree_deploy.cli import app\n"),
    ("ddtree_deploy.release.port", "from . import check\nfrom ..session import plan\n"),
    ("ddtree_deploy.hostprog.image_apply", "def main():\n    from ddtree_deploy.fleets import rollout\n"),
    ("ddtree_deploy.containers.image_context", "from ddtree_deploy.hostprog import image_apply\n"),
])
def test_an_import_that_climbs_is_found(module, source):
    """The checker itself: each of these climbs (lazily, by alias, relatively) or imports a module
    that runs only from a copy, and is named."""
    assert upward(module, source), source


@pytest.mark.parametrize(("module", "source"), [
    ("ddtree_deploy.fleets.rollout", "from ddtree_deploy.session import push\nfrom ddtree_deploy import __version__\n"),
    ("ddtree_deploy.session.desired", "from ddtree_deploy.session.plan import Desired\n"),
    ("ddtree_deploy.engine.series", "from ddtree_deploy.settings.smoke import parse_family_smoke\n"),
    ("ddtree_deploy.hostprog.image_apply", "def main():\n    from ddtree_deploy.session.plan import plan_push\n"),
])
def test_an_import_that_goes_down_or_across_passes(module, source):
    assert upward(module, source) == []


def test_test_hooks_are_read_in_one_place():
    """The one test hook point (base/hooks.py): no other module of the package reads the
    variable or names a test hook's key; the host agent acts on the keys it is sent."""
    readers = [m for m, path in MODULES.items()
               if "DDTREE_DEPLOY_TEST_HOOKS" in path.read_text(encoding="utf-8")
               or "TEST_HOOKS_ENV" in path.read_text(encoding="utf-8")]
    assert readers == ["ddtree_deploy.base.hooks"]
    keys = ("smoke_heartbeat_s", "exit_after_renames", "fill_after_staging", "stop_before_each_request")
    naming = [m for m, path in MODULES.items() if m != "ddtree_deploy.base.hooks" and room_of(m) != "hostprog"
              and any(f'"{k}"' in path.read_text(encoding="utf-8") for k in keys)]
    assert naming == []
