"""scripts/tier_tests.py: what a test file uses decides its tier folder, and the move keeps
what the moved file finds (its paths one folder deeper, the references to it elsewhere).

The script's pure parts on small sources, then the checkout itself: every test file is in the
folder the script gives it (a file added to tests/ by a merge fails here until the script is
run again), with the reasons it prints.
"""

from __future__ import annotations

import importlib.util
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent.parent
_spec = importlib.util.spec_from_file_location("tier_tests", REPO / "scripts" / "tier_tests.py")
tier_tests = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = tier_tests
_spec.loader.exec_module(tier_tests)


def tier(source: str) -> tuple[str, list[str]]:
    return tier_tests.classify(tier_tests.read_uses(textwrap.dedent(source), "test_x.py"))


def test_pure_code_is_unit():
    assert tier("""
        import json
        from ddtree_deploy.engine.series import parse_series

        def test_a(tmp_path):
            host = {"name": "h"}  # a variable named host is no sshd
            assert json.loads("1") == 1
    """) == ("unit", ["nothing but Python in this process"])


@pytest.mark.parametrize("source,why", [
    ("import subprocess\ndef test_a():\n    subprocess.run(['true'])\n", "subprocess"),
    ("def test_a(sshd):\n    pass\n", "the sshd fixture"),
    ("def test_a(release_tree):\n    pass\n", "a release's files (PyPI wheel)"),
    ("import torch\n", "torch"),
    ("import pytest\npytestmark = pytest.mark.sglang_env\n", "marked sglang_env"),
    ("from ddtree_deploy.remote.transport import LocalTransport\n",
     "a host program run here (LocalTransport: a subprocess)"),
    # a fixture of the module that takes the sshd: its tests use it through the fixture
    ("import pytest\n@pytest.fixture(scope='module')\ndef world(sshd):\n    return sshd\n"
     "def test_a(world):\n    pass\n", "the sshd fixture"),
])
def test_real_parts_are_integration(source, why):
    got, reasons = tier(source)
    assert got == "integration" and why in reasons, reasons


def test_the_cli_on_a_real_host_is_e2e_and_alone_it_is_not():
    on_host = """
        from typer.testing import CliRunner
        from ddtree_deploy.cli import app

        def test_a(host):
            CliRunner().invoke(app, ["status", "--host", str(host.inventory)])
    """
    got, reasons = tier(on_host)
    assert got == "e2e" and "typer's CliRunner on a real host" in reasons and "(the sandbox host fixture)" in reasons
    # the same CLI on bad input, no host: in process, in the unit tier
    assert tier(on_host.replace("def test_a(host)", "def test_a(tmp_path)").replace("host.inventory", "tmp_path"))[0] \
        == "unit"
    assert tier("from ddtree_deploy import demo\n")[0] == "e2e"
    assert tier("ARGV = ['ansible-playbook', 'site.yml']\n")[0] == "e2e"


def test_a_helper_module_carries_its_imports_not_its_names(tmp_path):
    """`from sshd_host import SPEC` brings sshd_host's sshd (it imports the sandbox's SSHServer
    and defines the fixtures), but not the CLI helper it defines: not e2e by that alone."""
    tests = tmp_path / "tests"
    (tmp_path / "ddtree_testkit").mkdir(parents=True)
    tests.mkdir()
    (tests / "helper.py").write_text(textwrap.dedent("""
        import pytest
        from typer.testing import CliRunner
        from ddtree_deploy.sandbox import SSHServer

        SPEC = "x"

        @pytest.fixture(scope="module")
        def world(sshd):
            return sshd

        def cli(*args):
            return CliRunner().invoke(None, args)
    """))
    (tests / "test_a.py").write_text("from helper import SPEC\n\ndef test_a():\n    assert SPEC\n")
    (tests / "test_b.py").write_text("from helper import cli\n\ndef test_b(world):\n    cli('push')\n")
    tree = tier_tests.Tree(tmp_path)
    a_tier, a_why = tier_tests.tier_of(tree, tests / "test_a.py")
    assert a_tier == "integration" and "the sshd fixture" in a_why
    assert tier_tests.tier_of(tree, tests / "test_b.py")[0] == "e2e"


def test_a_moved_file_finds_the_same_folders():
    # Written with F for __file__: the script rewrites this very file when it moves it, and
    # the examples must stay what they say.
    source = textwrap.dedent("""
        REPO = Path(F).resolve().parent.parent
        DATA = Path(F).parent / "data"
        ROOT = Path(F).resolve().parents[1]
        HERE = os.path.dirname(os.path.abspath(F))
        TEXT = Path(F).read_text()
        PKG = Path(ddtree_deploy.F).resolve().parent
    """).replace("F", "__" + "file__")
    deeper = tier_tests.deepen(source, 1)
    assert deeper == textwrap.dedent("""
        REPO = Path(F).resolve().parent.parent.parent
        DATA = Path(F).parent.parent / "data"
        ROOT = Path(F).resolve().parents[2]
        HERE = os.path.dirname(os.path.dirname(os.path.abspath(F)))
        TEXT = Path(F).read_text()
        PKG = Path(ddtree_deploy.F).resolve().parent
    """).replace("F", "__" + "file__")
    # and back: the chains lose their .parent (a dirname added is left as it is)
    assert tier_tests.deepen(deeper, -1) == source.replace(
        "os.path.dirname(os.path.abspath(", "os.path.dirname(os.path.dirname(os.path.abspath(").replace(
        "(__file__))\n", "(__file__)))\n")
    assert tier_tests.deepen(source, 0) == source


def test_references_name_the_tier_folder():
    # Written with T for "tests/": the script rewrites this very file's references when it
    # moves it, and the examples must stay what they say.
    where = {"test_push.py": "e2e", "test_codes.py": "unit"}
    text = ("see Ttest_push.py and `Tunit/test_push.py`, Ttest_codes.py::test_a; "
            "not Ttest_other.py, nor bench/Ttest_push.py, nor Ttest_push.pyc").replace("T", "tests" + "/")
    assert tier_tests.rewrite_refs(text, where) == (
        "see Te2e/test_push.py and `Te2e/test_push.py`, Tunit/test_codes.py::test_a; "
        "not Ttest_other.py, nor bench/Ttest_push.py, nor Ttest_push.pyc").replace("T", "tests" + "/")


def test_every_test_file_is_in_the_folder_its_uses_give_it():
    tree = tier_tests.Tree(REPO)
    wrong = []
    for path in tree.test_files():
        want, why = tier_tests.tier_of(tree, path)
        if tier_tests.current_tier(tree, path) != want:
            wrong.append(f"{path.relative_to(REPO)} belongs in tests/{want}/ ({'; '.join(why)})")
    assert not wrong, "run scripts/tier_tests.py:\n" + "\n".join(wrong)
