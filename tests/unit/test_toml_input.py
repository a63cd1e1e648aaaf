"""toml_input: the one TOML reader; the inventory and family.toml give the same message format.

Format: <file>: line N: <key>: <what is wrong>; <what to do> (issue #14, one home per concept).
"""

from __future__ import annotations

import re
import shutil

import pytest

from ddtree_deploy.base.errors import BadInput
from ddtree_deploy.base.toml_input import TomlFile
from ddtree_deploy.engine import series as S
from ddtree_deploy.settings.inventory import parse_host

FORMAT = re.compile(r"(?P<file>[^:]+): line (?P<line>\d+): (?P<key>[a-z_.]+): (?P<what>.+?); (?P<todo>.+)")


def _inventory_error(text: str) -> re.Match:
    with pytest.raises(BadInput) as e:
        parse_host(text, name="h", source="hosts/h.toml")
    m = FORMAT.fullmatch(e.value.message)
    assert m, e.value.message
    return m


def _family_error(tmp_path, test_family_dir, text: str) -> re.Match:
    fam = tmp_path / "patches" / "f"
    shutil.copytree(test_family_dir, fam)
    (fam / "family.toml").write_text(text)
    with pytest.raises(BadInput) as e:
        S.read_family_info(fam)
    m = FORMAT.fullmatch(e.value.message)
    assert m, e.value.message
    return m


def test_wrong_type_same_format_in_inventory_and_family_toml(tmp_path, test_family_dir):
    inv = _inventory_error("[host]\npython = '/p'\n[ssh]\nhost = 'a'\nport = '22'\n")
    fam = _family_error(tmp_path, test_family_dir, '# a family\nsglang = 5\n')
    assert (inv["file"], inv["line"], inv["key"]) == ("hosts/h.toml", "5", "ssh.port")
    assert inv["what"] == "must be an integer from 1 to 65535, not '22'"
    assert fam["file"].endswith("family.toml") and (fam["line"], fam["key"]) == ("2", "sglang")
    assert fam["what"] == "must be a string holding a PEP 440 specifier (not 5)"
    assert inv["todo"] and fam["todo"]


def test_unknown_key_same_format_and_wording(tmp_path, test_family_dir):
    inv = _inventory_error("[host]\npython = '/p'\n[ssh]\nhost = 'a'\nprot = 22\n")
    fam = _family_error(tmp_path, test_family_dir, 'sglang = ">=0.5"\n\nrange = "x"\n')
    assert (inv["line"], inv["key"]) == ("5", "ssh.prot")
    assert (fam["line"], fam["key"]) == ("3", "range")
    for m in (inv, fam):
        assert m["what"].startswith("unknown key (known keys here: ")
    # A key spelled nearly like a known one is named (prot: port); else the plain advice.
    assert inv["todo"] == "did you mean port? fix its spelling or remove it"
    assert fam["todo"] == "fix its spelling or remove it"
    assert fam["what"] == "unknown key (known keys here: description, sglang, smoke)"


@pytest.mark.parametrize("text, message", [
    # A required key misspelt is said as the misspelling it is, never as "missing" (issue 28: pyhton).
    ("[host]\npyhton = '/p'\n[ssh]\nhost = 'a'\n",
     "hosts/h.toml: line 2: host.pyhton: unknown key: a misspelling of python (host.python is required); rename "
     "it to python"),
    ("[host]\npython = '/p'\n[ssh]\nhots = 'a'\n",
     "hosts/h.toml: line 4: ssh.hots: unknown key: a misspelling of host (ssh.host is required); rename it to host"),
    ("[host]\nsudo = false\n[ssh]\nhost = 'a'\n", "hosts/h.toml: line 1: host.python: missing (required); add "
     'python = "/opt/venv/bin/python"'),
])
def test_a_misspelt_required_key_is_named_not_missing(text, message):
    with pytest.raises(BadInput) as e:
        parse_host(text, name="h", source="hosts/h.toml")
    assert e.value.message == message


def test_syntax_error_carries_tomllib_line(tmp_path, test_family_dir):
    with pytest.raises(BadInput, match=r"^hosts/h\.toml: line 2: not valid TOML: .+; fix the syntax"):
        parse_host("[host]\npython = \n", name="h", source="hosts/h.toml")
    with pytest.raises(BadInput, match=r"family\.toml: line 1: not valid TOML: .+; fix the syntax"):
        S.read_family_info(_copy(tmp_path, test_family_dir, 'sglang = ">=0.5\n'))


def _copy(tmp_path, test_family_dir, text):
    fam = tmp_path / "patches" / "g"
    shutil.copytree(test_family_dir, fam)
    (fam / "family.toml").write_text(text)
    return fam


def test_line_of_finds_keys_in_tables_dotted_keys_and_headers():
    doc = TomlFile('top = 1\n\n[ssh]\nhost = "a"\n# port = 1\nport = 2\n[smoke.launch]\nmodel = "m"\n'
                   '[host]\n"python" = "/p"\nsub.x = 1\n', source="f")
    assert doc.line_of("top") == 1
    assert doc.line_of("ssh") == 3 and doc.line_of("ssh.port") == 6  # the comment is no key
    assert doc.line_of("smoke.launch.model") == 8 and doc.line_of("smoke.launch") == 7
    assert doc.line_of("host.python") == 10 and doc.line_of("host.sub.x") == 11
    assert doc.line_of("ssh.nothing") == 3  # not written: its table's header
    assert doc.line_of("absent") is None
    assert doc.bad("absent", "missing", "add it").message == "f: absent: missing; add it"
    assert doc.bad("ssh.user", "x", "y").message == "f: line 3: ssh.user: x; y"


# ---------------------------------------------------------------- the [smoke] tables (issue #14)

HOST = "[host]\npython = '/p'\n[ssh]\nhost = 'a'\n"  # 4 lines: [smoke] starts on line 5


def _smoke_error(parse) -> re.Match:
    with pytest.raises(BadInput) as e:
        parse()
    m = FORMAT.fullmatch(e.value.message)
    assert m, e.value.message
    return m


def _host_smoke(text: str):
    """A host file's [smoke] as a command reads it: parsed with the file, checked on use."""
    from ddtree_deploy.settings.smoke import parse_settings

    host = parse_host(HOST + text, name="h", source="hosts/h.toml")
    return lambda: parse_settings(host.smoke, source=host.source)


def _family_smoke(tmp_path, test_family_dir, text: str):
    return lambda: S.read_family_info(_copy(tmp_path, test_family_dir, 'sglang = ">=0.5"\n' + text))


def test_smoke_tables_wrong_type_same_format_as_the_inventory(tmp_path, test_family_dir):
    inv = _inventory_error(HOST + "port = '22'\n")  # the reference: the inventory's own wrong type
    launch = _smoke_error(_host_smoke("[smoke.launch]\nmodel = '/m'\nport = '80'\n"))
    fam = _smoke_error(_family_smoke(tmp_path, test_family_dir, "[smoke]\n\nprobe_args = '--device cpu'\n"))
    assert inv["file"] == launch["file"] == "hosts/h.toml" and fam["file"].endswith("family.toml")
    assert (launch["line"], launch["key"]) == ("7", "smoke.launch.port")
    assert (inv["what"], launch["what"]) == ("must be an integer from 1 to 65535, not '22'",
                                             "must be an integer from 1 to 65535, not '80'")
    assert inv["todo"] == launch["todo"] == "write a number without quotes, e.g. port = 1"
    assert (fam["line"], fam["key"]) == ("4", "smoke.probe_args")
    assert fam["what"] == "must be a list of non-empty strings, not '--device cpu'"
    assert fam["todo"] == 'write a list in brackets, e.g. probe_args = ["--device", "cpu"]'


def test_smoke_tables_unknown_key_same_format_and_wording_as_the_inventory(tmp_path, test_family_dir):
    inv = _inventory_error(HOST + "prot = 22\n")
    launch = _smoke_error(_host_smoke("[smoke]\nlevels = ['compile']\n[smoke.launch]\nmodle = '/m'\n"))
    fam = _smoke_error(_family_smoke(tmp_path, test_family_dir, "[smoke]\nworker_klass = 'W'\n"))
    assert (launch["line"], launch["key"]) == ("8", "smoke.launch.modle")
    assert (fam["line"], fam["key"]) == ("3", "smoke.worker_klass")
    for m in (inv, launch, fam):
        assert m["what"].startswith("unknown key (known keys here: ")
    assert (inv["todo"], launch["todo"], fam["todo"]) == tuple(
        f"did you mean {k}? fix its spelling or remove it" for k in ("port", "model", "worker_class"))
    assert "draft_model, extra_args, gpu" in launch["what"] and "worker_class, worker_module)" in fam["what"]


def test_a_hand_built_smoke_table_gives_the_same_format_without_a_line():
    from ddtree_deploy.settings.smoke import parse_settings

    with pytest.raises(BadInput) as e:
        parse_settings({"launch": {"gpu": "no"}}, source="hosts/h.toml")
    assert e.value.message == ("hosts/h.toml: smoke.launch.gpu: must be true or false, not 'no'; "
                               "write true or false without quotes")
