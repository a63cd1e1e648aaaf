#!/usr/bin/env python3
"""Sort the test files into tier folders by what they use, and move them there with ``git mv``.

    tests/unit          pure: no subprocess, no sshd, no network, no SGLang/torch import
                        (`pytest tests/unit` runs in seconds)
    tests/integration   real parts: a real sshd, real programs (subprocess), SGLang release
                        wheels and venvs, torch/transformers/Triton
    tests/e2e           the CLI end to end on a real host (console script, ``python -m
                        ddtree_deploy`` or typer's CliRunner, with an sshd host), the demo,
                        fleets over SSH, Ansible

Run it from anywhere in the checkout; run it again after merging a branch that adds test
files in tests/ (or moves one's needs across a tier): it moves only what is in the wrong
folder, and says why each file goes where it goes.

    python scripts/tier_tests.py            # classify, git mv, rewrite what the move breaks
    python scripts/tier_tests.py --dry-run  # say what it would move, change nothing
    python scripts/tier_tests.py --check    # exit 1 if a test file is in the wrong folder

What a file uses is read from its source (ast, never imported): the modules it imports, the
fixtures and names it refers to, its pytest marks, and the same for the helper modules beside
the tests (tests/*.py that are not test files: sshd_host, serve_host, the probes) and
ddtree_testkit's modules that it imports, transitively. A file goes to the highest tier any
of its uses calls for: the whole file moves, so one subprocess in a file makes it integration.

What the move breaks, and is rewritten in the moved files and the repository:

* ``Path(__file__)...parent`` chains and ``os.path.dirname(...__file__...)`` in a moved test
  file (it is one folder deeper): one ``.parent`` more;
* ``tests/test_x.py`` in the repository's text files (docs, comments, Makefile):
  ``tests/<tier>/test_x.py``; not in README.md (another engineer's), nor in what ships or is
  frozen (payload/, patches/, wip/, snapshot/): those are listed instead, to be changed by hand.

Shared fixtures stay in tests/conftest.py (it applies to the tier folders below it) and the
helper modules stay in tests/ (tests/conftest.py puts that folder on sys.path).
"""

from __future__ import annotations

import argparse
import ast
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

TIERS = ("unit", "integration", "e2e")

# --- what a use means -----------------------------------------------------------------------
# Each table maps a name (an imported module's first parts, a referenced name or fixture, a
# mark) to the reason it is named in the report. Module keys match the module itself and
# anything under it ("ddtree_deploy.sandbox" matches "ddtree_deploy.sandbox.hostenv").

# A real host: an sshd on loopback, a sandbox host, a served host.
SSHD_FIXTURES = {
    "sshd": "the sshd fixture", "host": "the sandbox host fixture", "served": "the served host fixture",
    "oracle": "the oracle fixture (a sandbox host and GNU patch)",
    "tuned_host": "the tuned host fixture", "tuned_host_0_5_23": "the tuned host fixture",
}
SSHD_NAMES = {"SSHServer": "a real sshd (SSHServer)", "SandboxHost": "a sandbox host",
              "SSHTransport": "an SSH transport"}
SSHD_MODULES = {"paramiko": "paramiko", "fabric": "fabric"}

# Real programs, sockets and processes.
PROCESS_MODULES = {
    "subprocess": "subprocess", "multiprocessing": "multiprocessing", "pexpect": "pexpect",
    "socket": "sockets", "socketserver": "a socket server", "http.server": "an HTTP server",
    "urllib.request": "HTTP", "requests": "HTTP", "http.client": "HTTP",
    "ddtree_testkit.system_tools": "a system tool (patch, git, diff) as the oracle",
    "ddtree_testkit.supervised": "a real supervisord", "ddtree_testkit.containers": "real containers",
    "ddtree_testkit.standin_server": "the stand-in server (a process)",
    "ddtree_testkit.standin_tune_server": "the stand-in tune server (a process)",
    "ddtree_testkit.standin_metrics": "the stand-in metrics server (a process)",
    "ddtree_testkit.standin_nvidia_smi": "the stand-in nvidia-smi (a program)",
}
PROCESS_NAMES = {
    "Popen": "a subprocess", "check_output": "a subprocess",
    "STANDIN_SERVER": "the stand-in server (a process)",
    "STANDIN_TUNE_SERVER": "the stand-in tune server (a process)",
    "free_port": "a listening port",
    "LocalTransport": "a host program run here (LocalTransport: a subprocess)",
    "run_on_host": "a host program (a subprocess or SSH)",
}

# SGLang release files, wheels from PyPI (cached), venvs, and the heavy libraries whose import
# alone takes seconds.
SGLANG_MODULES = {
    "torch": "torch", "transformers": "transformers", "triton": "Triton", "sglang": "SGLang",
    "sgl_kernel": "sgl_kernel", "tokenizers": "tokenizers",
    "ddtree_deploy.release.matrix_import": "release venvs (matrix --import)",
    "ddtree_deploy.sandbox": "the sandbox (release files, host venvs)",
}
SGLANG_FIXTURES = {"release_wheel": "a release wheel (PyPI, cached)",
                   "release_tree": "a release's files (PyPI wheel)"}
SGLANG_NAMES = {
    "ensure_wheel": "a release wheel (PyPI, cached)", "pristine_files": "release files (PyPI wheel)",
    "read_wheel_files": "release files (PyPI wheel)", "make_host_env": "an SGLang host venv",
    "make_env": "a release venv", "hostenv": "an SGLang host venv",
}
SGLANG_MARKS = {"sglang_env": "marked sglang_env", "network": "marked network"}

# The CLI as a user runs it.
CLI_NAMES = {"CliRunner": "typer's CliRunner", "run_cli": "the CLI", "start_cli": "the CLI", "cli": "the CLI"}
CLI_STRINGS = {"ddtree_deploy": "python -m ddtree_deploy", "ddtree-deploy": "the console script"}

# End to end whatever else it uses: the demo, Ansible, fleets over SSH.
E2E_MODULES = {"ddtree_deploy.demo": "the demo", "ansible": "Ansible"}
E2E_STRINGS = {"ansible-playbook": "ansible-playbook", "ansible-galaxy": "ansible-galaxy"}
E2E_WITH_SSHD_MODULES = {"ddtree_deploy.fleets.run": "a fleet run"}

# Where the heuristics above would misjudge a file: its tier and why (none today).
PINNED: dict[str, tuple[str, str]] = {}

# Where `tests/test_x.py` is never rewritten: another engineer's file, and what ships to
# hosts or is frozen (a patch series, the unfinished family's mbox, the release snapshots).
NO_REWRITE = ("README.md", "payload/", "patches/", "wip/", "snapshot/")


@dataclass
class Uses:
    """What one source file uses, as read from its text."""

    modules: set[str] = field(default_factory=set)
    names: set[str] = field(default_factory=set)
    fixtures: set[str] = field(default_factory=set)
    marks: set[str] = field(default_factory=set)
    strings: set[str] = field(default_factory=set)

    def merge(self, other: Uses) -> None:
        self.modules |= other.modules
        self.names |= other.names
        self.fixtures |= other.fixtures
        self.marks |= other.marks
        self.strings |= other.strings


def read_uses(source: str, filename: str) -> Uses:
    """Imports, names (identifiers, attributes), the fixtures its tests and fixtures take, marks
    and short string constants of a Python source. Pure."""
    tree = ast.parse(source, filename=filename)
    uses = Uses()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            uses.modules.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            uses.modules.add(node.module)
            # `from ddtree_deploy.sandbox import hostenv`: a module as a name too
            uses.modules.update(f"{node.module}.{a.name}" for a in node.names)
            uses.names.update(a.name for a in node.names)
        elif isinstance(node, ast.Name):
            uses.names.add(node.id)
        elif isinstance(node, ast.Attribute):
            uses.names.add(node.attr)
            if isinstance(node.value, ast.Attribute) and node.value.attr == "mark" and \
                    isinstance(node.value.value, ast.Name) and node.value.value.id == "pytest":
                uses.marks.add(node.attr)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and _takes_fixtures(node):
            uses.fixtures.update(a.arg for a in node.args.args)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and len(node.value) <= 40:
            uses.strings.add(node.value)
    return uses


def _takes_fixtures(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    """A test function, or a fixture: its arguments are fixtures."""
    return fn.name.startswith("test") or any(
        "fixture" in ast.unparse(d.func if isinstance(d, ast.Call) else d) for d in fn.decorator_list)


def _module_hits(modules: set[str], table: dict[str, str]) -> list[str]:
    return sorted({why for key, why in table.items()
                   for m in modules if m == key or m.startswith(key + ".")})


def _name_hits(names: set[str], table: dict[str, str | None]) -> list[str]:
    return sorted({why or name for name, why in table.items() if name in names})


def _string_hits(strings: set[str], table: dict[str, str]) -> list[str]:
    return sorted({why for key, why in table.items() if key in strings})


def classify(uses: Uses) -> tuple[str, list[str]]:
    """(tier, reasons) for a test file's uses (its own and its helpers', merged). Pure."""
    sshd = (_module_hits(uses.modules, SSHD_MODULES) + _name_hits(uses.names, SSHD_NAMES)
            + _name_hits(uses.fixtures, SSHD_FIXTURES))
    process = _module_hits(uses.modules, PROCESS_MODULES) + _name_hits(uses.names, PROCESS_NAMES)
    sglang = (_module_hits(uses.modules, SGLANG_MODULES) + _name_hits(uses.names, SGLANG_NAMES)
              + _name_hits(uses.fixtures, SGLANG_FIXTURES)
              + sorted(why for mark, why in SGLANG_MARKS.items() if mark in uses.marks))
    cli = _name_hits(uses.names, CLI_NAMES) + _string_hits(uses.strings, CLI_STRINGS)
    e2e = _module_hits(uses.modules, E2E_MODULES) + _string_hits(uses.strings, E2E_STRINGS)
    if sshd:
        e2e += _module_hits(uses.modules, E2E_WITH_SSHD_MODULES)
        if cli:
            e2e += [f"{c} on a real host" for c in cli]
    if e2e:
        return "e2e", e2e + [f"({s})" for s in sshd]
    real = sshd + process + sglang
    if real:
        return "integration", real
    return "unit", ["nothing but Python in this process"]


# --- the files ------------------------------------------------------------------------------


def _top_module(name: str) -> str:
    return name.split(".", 1)[0]


class Tree:
    """The repository's tests folder and test support, read once."""

    def __init__(self, repo: Path):
        self.repo = repo
        self.tests = repo / "tests"
        self._cache: dict[Path, Uses] = {}
        # helper modules beside the tests, and ddtree_testkit's, by module name
        self.helpers = {p.stem: p for p in self.tests.glob("*.py")
                        if not p.name.startswith("test_") and p.name != "conftest.py"}
        self.testkit = {f"ddtree_testkit.{p.stem}": p for p in (repo / "ddtree_testkit").glob("*.py")
                        if p.name != "__init__.py"}

    def test_files(self) -> list[Path]:
        found = list(self.tests.glob("test_*.py"))
        for tier in TIERS:
            found += (self.tests / tier).glob("test_*.py")
        return sorted(found, key=lambda p: p.name)

    def _own(self, path: Path) -> Uses:
        if path not in self._cache:
            self._cache[path] = read_uses(path.read_text(encoding="utf-8"), str(path))
        return self._cache[path]

    def uses(self, path: Path) -> Uses:
        """The file's uses and, transitively, those of the test helpers it imports."""
        total, seen, todo = Uses(), set(), [path]
        while todo:
            p = todo.pop()
            if p in seen:
                continue
            seen.add(p)
            own = self._own(p)
            if p == path:
                total.merge(own)
            else:  # a helper: what it imports and its fixtures; its own names are its business
                total.merge(Uses(modules=own.modules, fixtures=own.fixtures, marks=own.marks))
            for m in own.modules:
                if _top_module(m) in self.helpers:
                    todo.append(self.helpers[_top_module(m)])
                if m in self.testkit:
                    todo.append(self.testkit[m])
        return total


def tier_of(tree: Tree, path: Path) -> tuple[str, list[str]]:
    if path.name in PINNED:
        tier, why = PINNED[path.name]
        return tier, [f"pinned: {why}"]
    return classify(tree.uses(path))


def current_tier(tree: Tree, path: Path) -> str | None:
    return path.parent.name if path.parent != tree.tests else None


# --- what the move breaks -------------------------------------------------------------------

_PATH_CHAIN = re.compile(r"Path\(__file__\)((?:\.resolve\(\))?)((?:\.parent\b)+|\.parents\[(\d+)\])")
_DIRNAME = re.compile(r"os\.path\.dirname\(os\.path\.abspath\(__file__\)\)")


def deepen(source: str, levels: int) -> str:
    """A test file's source, one folder deeper (levels=1) or shallower (-1): each way it
    finds its own folder's parents names one more (or one fewer) ``.parent``. Pure."""
    if levels == 0:
        return source

    def chain(m: re.Match) -> str:
        if m.group(3) is not None:
            return f"Path(__file__){m.group(1)}.parents[{int(m.group(3)) + levels}]"
        count = m.group(2).count(".parent") + levels
        return f"Path(__file__){m.group(1)}" + ".parent" * count

    out = _PATH_CHAIN.sub(chain, source)
    if levels > 0:
        out = _DIRNAME.sub(lambda m: "os.path.dirname(" * levels + m.group(0) + ")" * levels, out)
    return out


_TEST_REF = re.compile(r"(?<![\w./-])tests/(?:(unit|integration|e2e)/)?(test_\w+\.py)\b")


def rewrite_refs(text: str, where: dict[str, str]) -> str:
    """``tests/[tier/]test_x.py`` -> ``tests/<its tier>/test_x.py`` for the files in ``where``
    (file name -> tier). Pure."""
    def sub(m: re.Match) -> str:
        name = m.group(2)
        return f"tests/{where[name]}/{name}" if name in where else m.group(0)
    return _TEST_REF.sub(sub, text)


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True, text=True).stdout


def _tracked_text_files(repo: Path) -> list[Path]:
    out = []
    for rel in _git(repo, "ls-files", "-z").split("\0"):
        if not rel:
            continue
        p = repo / rel
        if p.is_file() and not p.is_symlink() and p.suffix in {
                ".py", ".md", ".toml", ".cfg", ".ini", ".txt", ".yml", ".yaml", ".sh", ".json", ""}:
            out.append(p)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    ap.add_argument("--dry-run", action="store_true", help="say what would move; change nothing")
    ap.add_argument("--check", action="store_true", help="exit 1 if any test file is in the wrong folder")
    ap.add_argument("--why", action="store_true", help="print every file's tier and reasons")
    args = ap.parse_args(argv)

    repo = Path(_git(Path(__file__).resolve().parent, "rev-parse", "--show-toplevel").strip())
    tree = Tree(repo)
    moves: list[tuple[Path, Path, str, list[str]]] = []
    where: dict[str, str] = {}
    counts = dict.fromkeys(TIERS, 0)
    for path in tree.test_files():
        tier, why = tier_of(tree, path)
        where[path.name] = tier
        counts[tier] += 1
        if args.why:
            print(f"{tier:<12} {path.name}: {'; '.join(why)}")
        if current_tier(tree, path) != tier:
            moves.append((path, tree.tests / tier / path.name, tier, why))
    dupes = sorted(n for n in where if sum(1 for p in tree.test_files() if p.name == n) > 1)
    if dupes:
        print(f"error: test files with the same name in two folders: {', '.join(dupes)}; "
              "keep one (pytest imports test files by name)", file=sys.stderr)
        return 2
    summary = ", ".join(f"{counts[t]} {t}" for t in TIERS)
    if args.check:
        for src, _dst, tier, why in moves:
            print(f"{src.relative_to(repo)} belongs in tests/{tier}/ ({'; '.join(why)}): "
                  "run scripts/tier_tests.py", file=sys.stderr)
        return 1 if moves else 0
    for src, dst, _tier, why in moves:
        print(f"{src.relative_to(repo)} -> {dst.relative_to(repo)}   ({'; '.join(why[:3])})")
    if args.dry_run or not moves:
        print(f"{len(moves)} file(s) to move; tiers: {summary}" + (" (dry run)" if args.dry_run else ""))
        return 0

    for src, dst, _tier, _why in moves:
        dst.parent.mkdir(exist_ok=True)
        _git(repo, "mv", str(src), str(dst))
        levels = (0 if dst.parent == tree.tests else 1) - (0 if src.parent == tree.tests else 1)
        dst.write_text(deepen(dst.read_text(encoding="utf-8"), levels), encoding="utf-8")
    left: list[str] = []
    for p in _tracked_text_files(repo):
        rel = p.relative_to(repo).as_posix()
        try:
            text = p.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        new = rewrite_refs(text, where)
        if new == text:
            continue
        if rel.startswith(NO_REWRITE[1:]) or rel == NO_REWRITE[0]:
            for n, (a, b) in enumerate(zip(text.splitlines(), new.splitlines()), start=1):
                if a != b:
                    left.append(f"{rel}:{n}: {a.strip()}")
            continue
        p.write_text(new, encoding="utf-8")
        _git(repo, "add", rel)
    _git(repo, "add", "--", *(str(dst) for _s, dst, _t, _w in moves))
    print(f"moved {len(moves)} file(s); tiers: {summary}")
    if left:
        print("left as they are (README.md, or shipped/frozen files): change these by hand:")
        print("\n".join(f"  {line}" for line in left))
    return 0


if __name__ == "__main__":
    sys.exit(main())
