"""The Ansible collection (ansible/ddtree) end to end: a real ``ansible-playbook`` (ansible-core
from PyPI), the collection built with ``ansible-galaxy collection build`` and installed from the
tarball, three hosts behind a real OpenSSH sshd on loopback, each its own venv with SGLang
0.5.12.post1's real files, and the real DDTree series (patches/sglang-0.5.12). The oracle of
the patched bytes is GNU patch applied to the release files plus the series' added payload.

Runs, in order: check mode + diff (nothing changes, the diff is shown), push (changed), push
again (ok, not changed), rollback (changed, files pristine again), then one host drifted: it
fails with the toolkit's one-line drift error and hint, the others are pushed and go on to the
next task under max_fail_percentage. Plus the inventory import through ansible-core's loader.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).parent))
from ddtree_deploy.sandbox import SSHServer  # noqa: E402

from ddtree_deploy.engine.series import AddEntry, PatchEntry, load_family  # noqa: E402

BIN = Path(sys.executable).parent
FAMILY = REPO / "patches" / "sglang-0.5.12"
HOSTS = ("h1", "h2", "h3")


def _ansible_or_skip():
    if not (BIN / "ansible-playbook").exists():
        pytest.skip("ansible-core is not installed in this venv (pip install -e '.[test]' installs it)")


def test_mapping_has_one_source():
    """The collection carries a byte-identical copy of the toolkit's mapping (one source)."""
    a = (REPO / "ddtree_deploy" / "interop" / "ansible_map.py").read_bytes()
    b = (REPO / "ansible" / "ddtree" / "plugins" / "plugin_utils" / "hostmap.py").read_bytes()
    assert a == b, "cp ddtree_deploy/interop/ansible_map.py ansible/ddtree/plugins/plugin_utils/hostmap.py"


def test_mapping_values():
    from ddtree_deploy.interop.ansible_map import MappingError, host_toml
    from ddtree_deploy.settings.inventory import parse_host

    v = {"ansible_host": "10.0.0.5", "ansible_user": "ops", "ansible_port": "2222",
         "ansible_ssh_private_key_file": "~/.ssh/k", "ddtree_python": "/opt/v/bin/python",
         "ansible_ssh_common_args": "-o ProxyJump=ops@bastion:22 -F /etc/ssh/cfg "
                                    "-o UserKnownHostsFile=/tmp/kh -o ControlMaster=auto",
         "ddtree_sudo": "yes", "ddtree_smoke_levels": "compile,import"}
    host = parse_host(host_toml("gpu1", v.get), name="gpu1", source="gpu1.toml")
    assert (host.ssh.host, host.ssh.user, host.ssh.port, host.ssh.identity_file) == ("10.0.0.5", "ops", 2222, "~/.ssh/k")
    assert (host.ssh.jump, host.ssh.ssh_config, host.ssh.known_hosts) == ("ops@bastion:22", "/etc/ssh/cfg", "/tmp/kh")
    assert host.python == "/opt/v/bin/python" and host.sudo is True
    assert host.smoke == {"levels": ["compile", "import"]}
    assert parse_host(host_toml("l", {"ddtree_python": "/p", "ansible_connection": "local"}.get),
                      name="l", source="l").is_local
    with pytest.raises(MappingError, match="ProxyCommand"):
        host_toml("x", {"ddtree_python": "/p", "ansible_ssh_common_args": "-o ProxyCommand='nc %h %p'"}.get)
    with pytest.raises(MappingError, match="ddtree_python is not set"):
        host_toml("x", {}.get)
    from ddtree_deploy.settings.serve_settings import parse_serve

    serve = {"restart": ["sudo", "-n", "systemctl", "restart", "sglang"], "url": "http://127.0.0.1:30000",
             "ready_timeout_s": 300, "proof": "width"}
    host = parse_host(host_toml("s", {"ddtree_python": "/p", "ddtree_serve": serve}.get), name="s", source="s")
    assert parse_serve(host.serve, source="s").restart == ("sudo", "-n", "systemctl", "restart", "sglang")
    with pytest.raises(MappingError, match="ddtree_serve must be a mapping"):
        host_toml("x", {"ddtree_python": "/p", "ddtree_serve": "systemctl restart sglang"}.get)


def oracle(pristine: dict[str, bytes | None], tmp: Path, family: Path) -> dict[str, bytes]:
    """GNU patch applied to the release's files, plus the series' added files."""
    series = load_family(family, payload_dir=tmp / "payload")
    tree = tmp / "oracle-tree"
    for rel, data in pristine.items():
        if data is not None:
            (tree / rel).parent.mkdir(parents=True, exist_ok=True)
            (tree / rel).write_bytes(data)
    out = {}
    for entry in series.entries:
        if isinstance(entry, PatchEntry):
            subprocess.run(["patch", "-p1", "-s", "--no-backup-if-mismatch", "-i", str(entry.file)],
                           cwd=tree, check=True)
        elif isinstance(entry, AddEntry):
            out[entry.dest] = entry.content
    for rel in pristine:
        if rel not in out:
            out[rel] = (tree / rel).read_bytes()
    return out


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    _ansible_or_skip()
    tmp = tmp_path_factory.mktemp("ansible")
    # A private copy of the series: the test's oracle and every ddtree-deploy the playbooks
    # start read the same bytes, whatever happens to the working tree meanwhile.
    shutil.copytree(REPO / "patches", tmp / "patches")
    shutil.copytree(REPO / "payload", tmp / "payload")
    family = tmp / "patches" / FAMILY.name
    paths = list(load_family(family, payload_dir=tmp / "payload").touched_paths())
    with SSHServer(tmp / "sshd") as sshd:
        hosts = {n: sshd.add_host(n, tmp / n, files=paths) for n in HOSTS}
        pristine = {p: hosts["h1"].read(p) for p in paths}
        # The collection as users get it: built by ansible-galaxy, installed from the tarball.
        env = dict(os.environ, PATH=f"{BIN}:{os.environ['PATH']}", ANSIBLE_LOCAL_TEMP=str(tmp / "atmp"),
                   ANSIBLE_COLLECTIONS_PATH=str(tmp / "collections"), ANSIBLE_NOCOLOR="1",
                   ANSIBLE_FORCE_COLOR="0", ANSIBLE_HOST_KEY_CHECKING="True", ANSIBLE_RETRY_FILES_ENABLED="0",
                   ANSIBLE_DEPRECATION_WARNINGS="0", DDTREE_DEPLOY_HOSTS=str(tmp / "no-hosts"),
                   DDTREE_DEPLOY_PATCHES=str(tmp / "patches"), DDTREE_DEPLOY_PAYLOAD=str(tmp / "payload"))
        r = subprocess.run([str(BIN / "ansible-galaxy"), "collection", "build", str(REPO / "ansible" / "ddtree"),
                            "--output-path", str(tmp), "--force"], env=env, capture_output=True, text=True)
        assert r.returncode == 0, r.stdout + r.stderr
        tarball = next(tmp.glob("ddtree-deploy-*.tar.gz"))
        r = subprocess.run([str(BIN / "ansible-galaxy"), "collection", "install", str(tarball), "-p",
                            str(tmp / "collections")], env=env, capture_output=True, text=True)
        assert r.returncode == 0, r.stdout + r.stderr
        common = f"-F {sshd.ssh_config} -o UserKnownHostsFile={sshd.known_hosts}"
        lines = ["[gpu]"]
        for n, h in hosts.items():
            lines.append(f"{n} ansible_host=127.0.0.1 ansible_port={sshd.port} ansible_user={sshd.user} "
                         f"ansible_ssh_private_key_file={sshd.identity} ddtree_python={h.python} "
                         f"ddtree_state_dir={h.state_dir} \"ansible_ssh_common_args={common}\"")
        inventory = tmp / "inventory.ini"
        inventory.write_text("\n".join(lines) + "\n")
        yield {"tmp": tmp, "hosts": hosts, "env": env, "inventory": inventory, "pristine": pristine,
               "patched": oracle(pristine, tmp, family), "paths": paths}


def playbook(fleet, name: str, body: str, *args: str) -> tuple[int, str, dict]:
    """Run ansible-playbook; (exit code, output, {host: recap counts})."""
    path = fleet["tmp"] / f"{name}.yml"
    path.write_text(body)
    r = subprocess.run([str(BIN / "ansible-playbook"), "-i", str(fleet["inventory"]), str(path), *args],
                       env=fleet["env"], capture_output=True, text=True, timeout=300)
    text = r.stdout + r.stderr
    recap = {}
    for m in re.finditer(r"^(\w+)\s+:\s+ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)", text, re.M):
        recap[m[1]] = {"ok": int(m[2]), "changed": int(m[3]), "failed": int(m[5])}
    return r.returncode, text, recap


PUSH = """
- hosts: gpu
  gather_facts: false
  serial: "{{ ddtree_serial | default(3) }}"
  max_fail_percentage: 40
  tasks:
    - name: push
      ddtree.deploy.push:
        smoke: false
    - name: after the push
      ddtree.deploy.status: {}
      register: st
    - ansible.builtin.debug:
        msg: "PHASE {{ inventory_hostname }} {{ st.ddtree.phase }}"
"""

SMOKE = """
- hosts: gpu
  gather_facts: false
  tasks:
    - ddtree.deploy.push:
        levels: [compile, import]
"""

ROLLBACK = """
- hosts: gpu
  gather_facts: false
  tasks:
    - ddtree.deploy.rollback: {}
"""


def files(fleet, name: str) -> dict[str, bytes | None]:
    return {p: fleet["hosts"][name].read(p) for p in fleet["paths"]}


@pytest.mark.sshd  # the fleet fixture's sshd
def test_playbook_push_check_diff_rollback_drift(fleet):
    pristine, patched = fleet["pristine"], fleet["patched"]

    # Check mode + diff mode: "changed" (files would switch), the per-file diff printed, nothing touched.
    rc, out, recap = playbook(fleet, "check", PUSH, "--check", "--diff")
    assert rc == 0, out
    assert all(recap[h]["changed"] == 1 and recap[h]["failed"] == 0 for h in HOSTS), out
    assert re.search(r"^\+    DDTREE = auto\(\)$", out, re.M), out  # a line patch 0001 adds
    assert "sglang/srt/speculative/spec_info.py (host " in out, out
    assert all(f"PHASE {h} never-deployed" in out for h in HOSTS), out
    assert all(files(fleet, h) == pristine for h in HOSTS)

    # A smoke level that fails for real on h3 (its venv has the series' files but not SGLang's
    # dependencies: a real ImportError, after the compile level passed): the task fails saying
    # which level and that the toolkit rolled the host back; the files are pristine again.
    rc, out, recap = playbook(fleet, "smoke", SMOKE, "--limit", "h3")
    assert rc != 0 and recap["h3"]["failed"] == 1, out
    assert re.search(r"fatal: \[h3\].*smoke level import failed: .*; rolled back automatically", out), out
    assert files(fleet, "h3") == pristine

    # Push: changed on every host, files byte-identical to GNU patch's result.
    rc, out, recap = playbook(fleet, "push", PUSH)
    assert rc == 0, out
    assert all(recap[h]["changed"] == 1 and recap[h]["failed"] == 0 for h in HOSTS), out
    assert all(files(fleet, h) == patched for h in HOSTS)
    assert all(f"PHASE {h} deployed" in out for h in HOSTS), out

    # Again: ok, not changed.
    rc, out, recap = playbook(fleet, "push-again", PUSH, "-v")
    assert rc == 0, out
    assert all(recap[h]["changed"] == 0 and recap[h]["failed"] == 0 for h in HOSTS), out
    assert "already deployed" in out

    # Rollback with diff: changed, every file back to the release's bytes.
    rc, out, recap = playbook(fleet, "rollback", ROLLBACK, "--diff")
    assert rc == 0, out
    assert all(recap[h]["changed"] == 1 for h in HOSTS), out
    assert "(host " in out and "(backup " in out, out
    assert all(files(fleet, h) == pristine for h in HOSTS)

    # One host drifted: it fails with the toolkit's error and hint, the others are pushed and
    # carry on to the next tasks (1 of 3 failed = 33% <= max_fail_percentage 40).
    spec = "sglang/srt/speculative/spec_info.py"
    h2 = fleet["hosts"]["h2"].file(spec)
    h2.write_bytes(h2.read_bytes() + b"# local edit\n")
    rc, out, recap = playbook(fleet, "drift", PUSH)
    assert rc != 0, out
    assert recap["h2"]["failed"] == 1 and recap["h2"]["changed"] == 0, out
    assert re.search(r"fatal: \[h2\].*match neither .* nor the patched version: .*spec_info\.py \(drifted\)", out), out
    assert "snapshot pull --host h2" in out, out  # the toolkit's hint
    assert "PHASE h1 deployed" in out and "PHASE h3 deployed" in out and "PHASE h2" not in out, out
    assert files(fleet, "h1") == patched and files(fleet, "h3") == patched
    assert fleet["hosts"]["h2"].read(spec) == pristine[spec] + b"# local edit\n"

    # The same drift in waves of one host (serial 1): h1 (already deployed) is ok, h2 fails,
    # which is more than max_fail_percentage of its wave: the play stops, h3 is never started.
    state_h3 = (fleet["hosts"]["h3"].state_dir / "journal.json").stat().st_mtime_ns
    rc, out, recap = playbook(fleet, "waves", PUSH, "-e", "ddtree_serial=1")
    assert rc != 0
    assert recap["h1"]["changed"] == 0 and recap["h1"]["failed"] == 0 and recap["h2"]["failed"] == 1, out
    assert "h3" not in recap and "[h3]" not in out, out
    assert (fleet["hosts"]["h3"].state_dir / "journal.json").stat().st_mtime_ns == state_h3



RESTART = """
- hosts: served
  gather_facts: false
  tasks:
    - name: restart
      ddtree.deploy.restart: {}
      register: restarted
    - ansible.builtin.debug:
        msg: "RESTART {{ restarted.msg }}"
"""


@pytest.mark.sshd  # the fleet fixture's sshd
def test_playbook_restart_module(fleet, tmp_path):
    """ddtree.deploy.restart against a host whose stand-in server runs under supervisord
    (tests/serve_host.py): changed and healthy; check mode reports changed and restarts nothing."""
    pytest.importorskip("supervisor", reason="supervisor (the test extra) runs the stand-in server")
    import yaml

    sys.path.insert(0, str(Path(__file__).parent))
    from serve_host import Served

    sshd = fleet["hosts"]["h1"].server
    s = Served(sshd, tmp_path, "served")
    with s.sup:
        s.wait_healthy()
        inventory = tmp_path / "served.yml"
        inventory.write_text(yaml.safe_dump({"all": {"children": {"served": {"hosts": {"served": {
            "ansible_host": "127.0.0.1", "ansible_port": sshd.port, "ansible_user": sshd.user,
            "ansible_ssh_private_key_file": str(sshd.identity), "ddtree_python": str(s.host.python),
            "ddtree_state_dir": str(s.host.state_dir),
            "ansible_ssh_common_args": f"-F {sshd.ssh_config} -o UserKnownHostsFile={sshd.known_hosts}",
            "ddtree_serve": {"restart": s.sup.restart_argv, "url": f"http://127.0.0.1:{s.port}",
                             "ready_timeout_s": 20, "poll_s": 0.2}}}}}}}))
        run = dict(fleet, inventory=inventory)
        pid = s.sup.pid()
        rc, out, recap = playbook(run, "restart-check", RESTART, "--check")
        assert rc == 0 and recap["served"]["changed"] == 1 and s.sup.pid() == pid, out
        rc, out, recap = playbook(run, "restart", RESTART)
        assert rc == 0 and recap["served"]["changed"] == 1 and recap["served"]["failed"] == 0, out
        assert "RESTART healthy" in out and s.sup.pid() not in (pid, None) and s.healthy(), out


@pytest.mark.sshd  # the fleet fixture's sshd
def test_inventory_import_through_ansible_loader(fleet, tmp_path):
    """`ddtree-deploy inventory from-ansible` reads an INI and a YAML inventory (groups, host
    vars, group_vars) with ansible-core's loader; the hosts written work with the CLI."""
    (tmp_path / "inv").mkdir()
    yaml_inv = tmp_path / "inv" / "fleet.yml"
    h = fleet["hosts"]["h1"]
    sshd = h.server
    yaml_inv.write_text(f"""
all:
  children:
    gpu:
      hosts:
        h1:
          ddtree_python: {h.python}
          ddtree_state_dir: {h.state_dir}
        h3:
          ddtree_python: {fleet['hosts']['h3'].python}
          ddtree_state_dir: {fleet['hosts']['h3'].state_dir}
""")
    (tmp_path / "inv" / "group_vars").mkdir()
    (tmp_path / "inv" / "group_vars" / "gpu.yml").write_text(
        f"ansible_host: 127.0.0.1\nansible_port: {sshd.port}\nansible_user: {sshd.user}\n"
        f"ansible_ssh_private_key_file: {sshd.identity}\n"
        f"ansible_ssh_common_args: '-F {sshd.ssh_config} -o UserKnownHostsFile={sshd.known_hosts}'\n")
    out_dir = tmp_path / "hosts"
    cli = [str(BIN / "ddtree-deploy")]
    env = dict(fleet["env"], DDTREE_DEPLOY_HOSTS=str(out_dir))
    r = subprocess.run([*cli, "inventory", "from-ansible", str(yaml_inv), "--out", str(out_dir), "--json"],
                       env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["imported_hosts"] == ["h1", "h3"] and doc["groups"] == {"gpu": ["h1", "h3"]}
    r = subprocess.run([*cli, "status", "--group", "gpu", "--json"], env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr + r.stdout
    status = json.loads(r.stdout)
    assert [x["host"] for x in status["hosts"]] == ["h1", "h3"]

    # INI, written over an existing folder: refused without --force (exit 2, nothing written).
    r = subprocess.run([*cli, "inventory", "from-ansible", str(fleet["inventory"]), "--out", str(out_dir)],
                       env=env, capture_output=True, text=True)
    assert r.returncode == 2 and "--force" in r.stderr, r.stderr
    r = subprocess.run([*cli, "inventory", "from-ansible", str(fleet["inventory"]), "--out", str(out_dir),
                        "--force"], env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert sorted(p.stem for p in out_dir.glob("h*.toml")) == ["h1", "h2", "h3"]

    # A host without ddtree_python: one line naming the host and the variable, exit 2.
    bad = tmp_path / "bad.ini"
    bad.write_text("[gpu]\nnode7 ansible_host=10.1.1.7\n")
    r = subprocess.run([*cli, "inventory", "from-ansible", str(bad), "--out", str(tmp_path / "h2")],
                       env=env, capture_output=True, text=True)
    assert r.returncode == 2 and "node7: ddtree_python is not set" in r.stderr, r.stderr
    assert not (tmp_path / "h2").exists()


@pytest.mark.sshd  # the fleet fixture's sshd
def test_module_docs_match_the_action_specs(fleet):
    """ansible-doc renders every module from the installed collection, and each module's
    documented options are exactly what its action plugin accepts (names, types, defaults)."""
    r = subprocess.run([str(BIN / "ansible-doc"), "--json", "ddtree.deploy.push", "ddtree.deploy.status",
                        "ddtree.deploy.rollback", "ddtree.deploy.restart"], env=fleet["env"], capture_output=True,
                       text=True)
    assert r.returncode == 0 and "ERROR" not in r.stderr, r.stderr
    rendered = json.loads(r.stdout)
    sys.path.insert(0, str(fleet["tmp"] / "collections"))  # the installed collection, as Ansible imports it
    try:
        from ansible_collections.ddtree.deploy.plugins.plugin_utils.toolkit import SPECS
    finally:
        sys.path.remove(str(fleet["tmp"] / "collections"))
    for name, spec in SPECS.items():
        assert f"ddtree.deploy.{name}" in rendered
        # As ansible-doc renders it: the module's own options and its doc fragments' (plugins/doc_fragments).
        doc = rendered[f"ddtree.deploy.{name}"]["doc"]
        assert set(doc["options"]) == set(spec), name
        for opt, s in spec.items():
            assert doc["options"][opt]["type"] == s["type"], (name, opt)
            assert doc["options"][opt].get("default") == s.get("default"), (name, opt)


def test_import_refuses_names_it_cannot_write(tmp_path):
    """Two hosts onto one file, or a host named like the groups file: exit 2, nothing written."""
    _ansible_or_skip()
    cli = [str(BIN / "ddtree-deploy"), "inventory", "from-ansible"]
    for text, needle in (("[gpu]\na ddtree_python=/p ddtree_name=n1\nb ddtree_name=n1 ddtree_python=/p\n",
                          "both map to the host name 'n1'"),
                         ("[gpu]\ngroups ddtree_python=/p\n", "'groups' is reserved")):
        inv = tmp_path / "inv.ini"
        inv.write_text(text)
        r = subprocess.run([*cli, str(inv), "--out", str(tmp_path / "out")], capture_output=True, text=True)
        assert r.returncode == 2 and needle in r.stderr, r.stderr
        assert not (tmp_path / "out").exists()
