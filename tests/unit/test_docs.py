"""The docs hold what they claim to hold (issue 33 item 1).

- every relative link in README.md and docs/ resolves: the file, and its ``#anchor`` among
  the target page's headings (GitHub's slugs);
- every command and every option that ``ddtree-deploy ... --help`` lists (the typer app
  walked, cli/app.py) is documented in docs/: the command's row in docs/commands.md names
  each of its options, and each option is written somewhere in docs/ outside that table;
- every example inventory in the docs (a ```toml block with a ``[host]`` table: a host file;
  one with only ``[smoke]``/``[serve]``/``[analysis]``/``[container]``: those tables under a
  minimal host) parses with the real inventory loader and passes push's table check;
- the exit-code table (docs/commands.md "Exit codes") lists exactly the exit codes the code
  defines (every module-level ``EXIT_* = <int>`` in ddtree_deploy/, base/errors.py's first).

Each failure names the file and line (or the command and option) that is wrong.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
import typer.main

from ddtree_deploy.base.errors import BadInput
from ddtree_deploy.base.toml_input import TomlFile
from ddtree_deploy.cli import app, load_commands
from ddtree_deploy.fleets.host_check import check_tables
from ddtree_deploy.settings.inventory import parse_host
from ddtree_deploy.settings.smoke import parse_family_smoke

REPO = Path(__file__).resolve().parent.parent.parent
DOCS = REPO / "docs"
PAGES = [REPO / "README.md", *sorted(DOCS.rglob("*.md"))]
COMMANDS_PAGE = DOCS / "commands.md"
README_LIMIT = 10_000  # bytes: the front door stays short (issue 33 item 1)


def prose(text: str) -> list[tuple[int, str]]:
    """(line number, line) outside fenced and indented code blocks, inline code removed.
    An indented block starts with a line indented by four after a blank line (a list item's
    continuation is not: the docs indent those by less) and ends at a line that is not."""
    lines, fence, code, blank = [], False, False, True
    for number, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith("```"):
            fence = not fence
            continue
        if line.strip():
            code = line.startswith("    ") and (code or blank)
        blank = not line.strip()
        if not (fence or code):
            lines.append((number, re.sub(r"`[^`]*`", "", line)))
    return lines


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation other than '-' and '_' dropped,
    spaces to '-'."""
    text = re.sub(r"`", "", heading.strip().lstrip("#").strip()).lower()
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    found: set[str] = set()
    seen: dict[str, int] = {}
    fence = False
    for line in page.read_text().splitlines():
        if line.lstrip().startswith("```"):
            fence = not fence
        if fence:
            continue
        if re.match(r"#{1,6} ", line):
            base = slug(line)
            n = seen.get(base, 0)
            seen[base] = n + 1
            found.add(base if n == 0 else f"{base}-{n}")
        found.update(re.findall(r'<a (?:id|name)="([^"]+)"', line))
    return found


LINK = re.compile(r"\[(?:[^\]\[]|\[[^\]]*\])*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")


def broken_links() -> list[str]:
    broken = []
    cache: dict[Path, set[str]] = {}
    for page in PAGES:
        for number, line in prose(page.read_text()):
            for target in LINK.findall(line):
                if re.match(r"[a-z][a-z0-9+.-]*:", target):
                    continue  # https:, mailto:
                path, _, anchor = target.partition("#")
                dest = (page.parent / path).resolve() if path else page
                where = f"{page.relative_to(REPO)}:{number}: link {target}"
                if not dest.exists():
                    broken.append(f"{where}: no file {dest.relative_to(REPO) if dest.is_relative_to(REPO) else dest}")
                elif anchor and dest.suffix == ".md":
                    if anchor not in cache.setdefault(dest, anchors(dest)):
                        broken.append(f"{where}: {dest.name} has no heading #{anchor}")
    return broken


def test_every_relative_link_resolves():
    broken = broken_links()
    assert not broken, "\n".join(broken)


def test_the_link_check_finds_a_broken_link_and_anchor(tmp_path, monkeypatch):
    # The check itself fails where it should (else an empty list above proves nothing).
    page = tmp_path / "docs" / "p.md"
    page.parent.mkdir()
    page.write_text("# Title\n\n## A `b`: c\n\nsee [x](#a-b-c), [y](#nope), [z](missing.md), [w](p.md#title)\n"
                    "\n    [code](not-checked.md)\n")
    monkeypatch.setattr(__import__(__name__), "PAGES", [page])
    monkeypatch.setattr(__import__(__name__), "REPO", tmp_path)
    assert broken_links() == ["docs/p.md:5: link #nope: p.md has no heading #nope",
                              "docs/p.md:5: link missing.md: no file docs/missing.md"]


def test_the_readme_is_a_short_front_door():
    size = len((REPO / "README.md").read_bytes())
    assert size < README_LIMIT, f"README.md is {size} bytes; keep it under {README_LIMIT}: move detail to docs/"
    index = (DOCS / "index.md").read_text()
    listed = set(re.findall(r"\]\(([\w./-]+\.md)(?:#[^)]*)?\)", index))
    unlisted = [p.relative_to(DOCS).as_posix() for p in sorted(DOCS.rglob("*.md"))
                if p.name != "index.md" and p.relative_to(DOCS).as_posix() not in listed]
    assert unlisted == [], f"docs/index.md does not link these pages: {unlisted}"


# --- commands and options --------------------------------------------------------------------

def cli_commands() -> dict[str, list[str]]:
    """'push' -> its option strings ('--host', ...), for every leaf command of the app."""
    load_commands()
    root = typer.main.get_command(app)
    found: dict[str, list[str]] = {}

    # typer vendors click (typer._click): its classes are not the click package's, so the
    # walk asks what a command has rather than what it is.
    def walk(command, path: tuple[str, ...]) -> None:
        if hasattr(command, "commands"):
            for name, sub in command.commands.items():
                if not sub.hidden:
                    walk(sub, (*path, name))
            return
        options = []
        for param in command.params:
            if param.param_type_name == "option" and not param.hidden:
                options += [o for o in (*param.opts, *param.secondary_opts)
                            if o.startswith("--") and o not in ("--help",)]
        found[" ".join(path)] = options

    walk(root, ())
    return found


def command_rows() -> dict[str, str]:
    """docs/commands.md's command table: 'push' -> its row's first cell."""
    rows = {}
    for line in COMMANDS_PAGE.read_text().splitlines():
        m = re.match(r"\| `([a-z][a-z -]*?)(?: [A-Z\[-].*?)?` \|", line)
        if m:
            rows[m.group(1)] = re.split(r"(?<!\\)\|", line)[1]  # a cell may hold an escaped \|
    return rows


def mentions(text: str, option: str) -> bool:
    return re.search(rf"(?<![\w-]){re.escape(option)}(?![\w-])", text) is not None


def test_every_command_has_a_row_naming_each_of_its_options():
    rows = command_rows()
    missing = []
    for command, options in sorted(cli_commands().items()):
        if command not in rows:
            missing.append(f"docs/commands.md: no row for `{command}`")
            continue
        missing += [f"docs/commands.md: the `{command}` row does not name {o}"
                    for o in options if not mentions(rows[command], o)]
    assert not missing, "\n".join(missing)


def test_every_option_is_described_in_docs():
    table = "\n".join(line for line in COMMANDS_PAGE.read_text().splitlines() if line.startswith("| `"))
    text = "\n".join(p.read_text() for p in sorted(DOCS.rglob("*.md")) if p != COMMANDS_PAGE)
    text += "\n" + COMMANDS_PAGE.read_text().replace(table, "")
    undocumented = sorted({f"{command} {option}" for command, options in cli_commands().items()
                           for option in options if not mentions(text, option)})
    assert undocumented == [], "options --help lists that no docs/ page describes: " + ", ".join(undocumented)


def test_the_top_level_options_are_described_in_docs():
    load_commands()
    root = typer.main.get_command(app)
    options = [o for param in root.params if param.param_type_name == "option" and not param.hidden
               for o in (*param.opts, *param.secondary_opts) if o.startswith("--") and o != "--help"]
    assert {"--version", "--install-completion", "--show-completion"} <= set(options), options
    text = "\n".join(p.read_text() for p in sorted(DOCS.rglob("*.md")))
    assert [o for o in options if not mentions(text, o)] == [], "top-level options no docs/ page describes"


def test_the_option_walk_sees_every_command():
    # The walk reaches the nested groups (a walk that found nothing would pass the two above).
    commands = cli_commands()
    assert {"push", "lock release", "series refresh", "snapshot pull", "inventory from-ansible"} <= set(commands)
    assert "--max-failures" in commands["push"] and "--force" in commands["lock release"]


# --- example inventories -----------------------------------------------------------------------

TABLES_ONLY = ("smoke", "serve", "analysis", "container")
MINIMAL_HOST = '[host]\npython = "/opt/sglang/.venv/bin/python"\n[ssh]\nhost = "gpu1"\n'


def toml_examples() -> list[tuple[str, str, str]]:
    """(where, text, kind) for every ```toml block that is an inventory ("host": a host file,
    "tables": tables of one) or a family.toml's ``[smoke]`` ("family": the block follows a
    paragraph naming family.toml)."""
    found = []
    for page in PAGES:
        lines = page.read_text().splitlines()
        start = None
        for number, line in enumerate(lines, 1):
            stripped = line.strip()
            if start is None and stripped == "```toml":
                start = number
            elif start is not None and stripped == "```":
                text = "\n".join(lines[start:number - 1]) + "\n"
                tables = set(re.findall(r"^\s*\[([\w.]+)\]", text, re.M))
                where = f"{page.relative_to(REPO)}:{start}"
                before = "\n".join(lines[max(0, start - 6):start - 1])
                if "host" in tables:
                    found.append((where, text, "host"))
                elif tables == {"smoke"} and "family.toml" in before:
                    found.append((where, text, "family"))
                elif tables and {t.split(".")[0] for t in tables} <= set(TABLES_ONLY):
                    found.append((where, text, "tables"))
                start = None
    return found


EXAMPLES = toml_examples()


def test_the_docs_have_example_inventories():
    kinds = [kind for _, _, kind in EXAMPLES]
    assert kinds.count("host") >= 3 and kinds.count("tables") >= 2 and "family" in kinds, EXAMPLES


@pytest.mark.parametrize("where,text,kind", EXAMPLES, ids=[w for w, _, _ in EXAMPLES])
def test_every_example_inventory_parses(where, text, kind):
    source = f"{where} (example)"
    try:
        if kind == "family":
            parse_family_smoke(TomlFile(text, source=source))
        else:
            host = parse_host(text if kind == "host" else MINIMAL_HOST + text, name="example", source=source)
            check_tables(host)
    except BadInput as exc:
        pytest.fail(f"{where}: the example inventory does not load: {exc.message}")


# --- exit codes ------------------------------------------------------------------------------

def code_exit_codes() -> dict[int, list[str]]:
    """Every module-level ``EXIT_* = <int>`` in the package: code -> where it is defined."""
    found: dict[int, list[str]] = {}
    for module in sorted((REPO / "ddtree_deploy").rglob("*.py")):
        for node in ast.parse(module.read_text()).body:
            if (isinstance(node, ast.Assign) and len(node.targets) == 1
                    and isinstance(node.targets[0], ast.Name) and node.targets[0].id.startswith("EXIT_")
                    and isinstance(node.value, ast.Constant) and type(node.value.value) is int):
                found.setdefault(node.value.value, []).append(
                    f"{module.relative_to(REPO)}:{node.targets[0].id}")
    return found


def documented_exit_codes() -> list[int]:
    text = COMMANDS_PAGE.read_text()
    section = text.split("## Exit codes", 1)[1].split("\n## ", 1)[0]
    return [int(code) for code in re.findall(r"^\| (\d+) \|", section, re.M)]


def test_the_exit_code_table_matches_the_code():
    documented = documented_exit_codes()
    defined = code_exit_codes()
    assert {0, 1, 2} <= set(defined), defined  # base/errors.py's own
    assert len(documented) == len(set(documented)), f"docs/commands.md lists a code twice: {documented}"
    assert sorted(documented) == sorted(defined), (
        f"docs/commands.md 'Exit codes' lists {sorted(documented)}; the code defines {defined}")
