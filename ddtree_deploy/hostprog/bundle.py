"""A host program and the modules it imports, packed into the one source a host runs.

A host has no ddtree-deploy installed, so a program ships with what it imports, the way
Ansible ships ``module_utils`` with a module. ``shipped(program)`` reads the program's
imports (its ``ddtree_deploy.*`` ones, through every module they import in turn: one
list, dependencies first); ``source(program)`` is a short prelude that makes stub packages
(``ddtree_deploy``, ``ddtree_deploy.hostprog``), registers each shipped module under its own
dotted name in ``sys.modules`` and runs it, then imports the program's public names (its
``main`` among them) into its own globals, as when each program was one file. So on the
host a program imports ``from ddtree_deploy.hostprog import wire`` exactly as it does in a
checkout: no fallback, no second name. The stub packages hold only what was shipped: an
import of anything else from ddtree_deploy fails on the host as in tests/integration/test_hostprog.py.

The source runs the same three ways: sent to ``python -c BOOTSTRAP`` (which calls the
``main`` it leaves in its globals), written to a file and run as a script (the image build,
``matrix --import``), or exec'd. This module is the controller's: it never ships.
"""

from __future__ import annotations

import ast
import functools
from importlib import resources

PACKAGE = "ddtree_deploy"


class BundleError(Exception):
    """A host program imports what cannot ship (a relative import, an import cycle)."""


def _file(module: str):
    """The file of ``module`` (a dotted name under ddtree_deploy) in the installed package,
    found without importing anything."""
    top, *parts = module.split(".")
    if top != PACKAGE or not parts:
        raise BundleError(f"{module} is not a module of {PACKAGE}")
    path = resources.files(PACKAGE)
    for part in parts[:-1]:
        path = path.joinpath(part)
    return path.joinpath(parts[-1] + ".py")


def module_text(module: str) -> str:
    """The source of ``module``, as shipped."""
    return _file(module).read_text(encoding="utf-8")


def _is_module(module: str) -> bool:
    return module.startswith(PACKAGE + ".") and _file(module).is_file()


def package_imports(module: str, text: str | None = None) -> list[str]:
    """The ddtree_deploy modules ``module`` imports (anywhere in it: inside functions and
    try blocks too), in the order written. ``from P import name`` counts ``P.name`` when
    that is a module, else ``P``."""
    tree = ast.parse(text if text is not None else module_text(module))
    found: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level:
            raise BundleError(f"{module}: line {node.lineno}: a relative import; host programs import "
                              f"by absolute name ({PACKAGE}.hostprog....), the same on a host as here")
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            names = [f"{node.module}.{a.name}" if _is_module(f"{node.module}.{a.name}") else node.module
                     for a in node.names]
        else:
            continue
        for name in names:
            if (name == PACKAGE or name.startswith(PACKAGE + ".")) and name not in found:
                found.append(name)
    return found


@functools.lru_cache(maxsize=None)
def shipped(program: str) -> tuple[str, ...]:
    """Every module ``program`` needs on a host, each after the modules it imports; the
    program last."""
    order: list[str] = []
    visiting: list[str] = []

    def visit(module: str) -> None:
        if module in order:
            return
        if module in visiting:
            raise BundleError("import cycle: " + " -> ".join(visiting[visiting.index(module):] + [module]))
        if not _is_module(module):
            raise BundleError(f"{visiting[-1] if visiting else program} imports {module}, which is not a module "
                              "file of the package (a package's __init__ never ships)")
        visiting.append(module)
        for dep in package_imports(module):
            visit(dep)
        visiting.pop()
        order.append(module)

    visit(program)
    return tuple(order)


def _packages(modules) -> list[str]:
    out: list[str] = []
    for module in modules:
        parts = module.split(".")[:-1]
        for i in range(1, len(parts) + 1):
            name = ".".join(parts[:i])
            if name not in out:
                out.append(name)
    return out


@functools.lru_cache(maxsize=None)
def source(program: str) -> bytes:
    """The one source that runs ``program`` on a host (see the module docstring)."""
    modules = shipped(program)
    lines = ["# ddtree-deploy host program %s, with the modules it imports (ddtree_deploy/hostprog/bundle.py)"
             % program,
             "import sys as _sys, types as _types",
             "def _ddtree_register(name, package):",
             "    m = _types.ModuleType(name)",
             "    if package:",
             "        m.__path__ = []",
             "    m.__package__ = name if package else name.rpartition('.')[0]",
             "    _sys.modules[name] = m",
             "    parent, _, leaf = name.rpartition('.')",
             "    if parent:",
             "        setattr(_sys.modules[parent], leaf, m)",
             "    return m"]
    for package in _packages(modules):
        lines.append(f"_ddtree_register({package!r}, True)")
    for module in modules:
        path = module.replace(".", "/") + ".py"
        lines.append(f"exec(compile({module_text(module)!r}, {path!r}, 'exec', dont_inherit=True), "
                     f"_ddtree_register({module!r}, False).__dict__)")
    # The program's public names (main among them) in the source's own globals, as when each
    # program was one file: what BOOTSTRAP calls, and what a host-side wrapper may reach.
    lines += [f"from {program} import *  # noqa: F401,F403",
              f"from {program} import main",
              "if __name__ == '__main__':",
              "    _sys.exit(main())"]
    return ("\n".join(lines) + "\n").encode("utf-8")


__all__ = ["BundleError", "package_imports", "shipped", "source"]
