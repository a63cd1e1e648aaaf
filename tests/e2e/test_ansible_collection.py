"""The Ansible collection (ansible/ddtree) end to end: a real ``ansible-playbook`` (ansible-core
from PyPI), the collection built by ``make collection`` (ansible-galaxy collection build) and
installed from the tarball into a folder of its own, hosts behind a real OpenSSH sshd on
loopback, each its own venv with SGLang 0.5.12.post1's real files, and the real DDTree series
(patches/sglang-0.5.12). The oracle of the patched bytes is GNU patch applied to the release
files plus the series' added payload.

The SHIPPED playbooks and role run with the very commands docs/ansible.md gives (read from the
doc), from a user's folder outside the checkout, on a plain INI and on a YAML inventory: check
+ diff, push, status, rollback; the canary of the shipped push stopping the play; the shipped
restart. Playbooks written here drive the modules as the doc's "The tasks" shows: check mode +
diff (nothing changes, the diff is shown), push (changed), push again (ok, not changed),
rollback (changed, files pristine again), then one host drifted: it fails with the toolkit's
one-line drift error and hint, the others are pushed and go on to the next task under
max_fail_percentage. Plus the inventory import through ansible-core's loader, and the rules
that keep the run's options apart from the host's variables.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent.parent
from ddtree_deploy.sandbox import SSHServer  # noqa: E402

from ddtree_deploy import __version__  # noqa: E402
from ddtree_deploy.engine.series import AddEntry, PatchEntry, load_family  # noqa: E402
from ddtree_deploy.interop.ansible_map import HOST_VARIABLES  # noqa: E402

BIN = Path(sys.executable).parent
FAMILY = REPO / "patches" / "sglang-0.5.12"
DOCS = REPO / "docs" / "ansible.md"
COLLECTION = REPO / "ansible" / "ddtree"
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
    from ddtree_deploy.settings.serve import parse_serve

    serve = {"restart": ["sudo", "-n", "systemctl", "restart", "sglang"], "url": "http://127.0.0.1:30000",
             "ready_timeout_s": 300, "proof": "width"}
    host = parse_host(host_toml("s", {"ddtree_python": "/p", "ddtree_serve": serve}.get), name="s", source="s")
    assert parse_serve(host.serve, source="s").restart == ("sudo", "-n", "systemctl", "restart", "sglang")
    # A switch where the table belongs: the line says which variable is the run's.
    with pytest.raises(MappingError, match="ddtree_smoke must be a mapping .* not True; .*ddtree_push_smoke.*"
                                           "--no-smoke"):
        host_toml("x", {"ddtree_python": "/p", "ddtree_smoke": True}.get)
    with pytest.raises(MappingError, match="ddtree_serve must be a mapping"):
        host_toml("x", {"ddtree_python": "/p", "ddtree_serve": "systemctl restart sglang"}.get)


def _yaml(path: Path):
    import yaml  # ansible-core's dependency

    return yaml.safe_load(path.read_text())


def _names(node) -> set[str]:
    """Every ddtree_* name in a parsed playbook or task file: set (vars, register) or read (Jinja)."""
    if isinstance(node, dict):
        return set().union(*(_names(k) | _names(v) for k, v in node.items())) if node else set()
    if isinstance(node, list):
        return set().union(*(_names(x) for x in node)) if node else set()
    return set(re.findall(r"\bddtree_\w+", node)) if isinstance(node, str) else set()


def test_run_options_are_not_host_variables():
    """What a run does (the role's options, the playbooks' variables) and what a host is (the
    mapping's variables, HOST_VARIABLES) never share a name. A role default is a variable of
    every host in the play: the role's `ddtree_smoke: true` (run the smoke) once replaced every
    host's [smoke] table, and every shipped playbook failed on every host. The role's defaults
    and its argument spec agree, its tasks read only its options, the mapping reads exactly
    HOST_VARIABLES, and docs/ansible.md lists every name of both sets."""
    pytest.importorskip("yaml")
    from ddtree_deploy.interop.ansible_map import host_tables

    role = COLLECTION / "roles" / "deploy"
    defaults = _yaml(role / "defaults" / "main.yml")
    spec = _yaml(role / "meta" / "argument_specs.yml")["argument_specs"]["main"]["options"]
    assert defaults == {k: v.get("default") for k, v in spec.items()}
    tasks = [_yaml(p) for p in sorted((role / "tasks").glob("*.yml"))]
    registered = {t["register"] for f in tasks for t in f if "register" in t}
    assert _names(tasks) <= set(spec) | registered, _names(tasks) - set(spec) - registered
    plays = [_yaml(p) for p in sorted((COLLECTION / "playbooks").glob("*.yml"))]
    run = set(spec) | registered | _names(plays)
    assert not run & set(HOST_VARIABLES), f"named like a host variable: {sorted(run & set(HOST_VARIABLES))}"

    asked = []
    host_tables("h", lambda var: asked.append(var) or {"ddtree_python": "/p"}.get(var))
    assert set(asked) == set(HOST_VARIABLES) - {"ddtree_name", "ddtree_deploy_cmd"}  # read by the callers
    doc = DOCS.read_text()
    assert [n for n in sorted(run - registered) + list(HOST_VARIABLES) if not re.search(rf"`{n}\b", doc)] == []


def test_collection_version_is_the_toolkits():
    """galaxy.yml's version is ddtree_deploy's (the package's and pyproject's): `make collection`
    writes ddtree-deploy-VERSION.tar.gz for the toolkit release it belongs to."""
    pytest.importorskip("yaml")
    try:
        import tomllib
    except ImportError:  # Python 3.10
        import tomli as tomllib
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    assert _yaml(COLLECTION / "galaxy.yml")["version"] == __version__ == project
    for doc in (DOCS, REPO / "README.md", COLLECTION / "README.md", COLLECTION / "galaxy.yml"):
        named = set(re.findall(r"ddtree-deploy-(\d[\w.]*?)\.tar\.gz", doc.read_text()))
        assert named <= {__version__}, f"{doc.name} names the tarball of {sorted(named)}, not {__version__}"


def test_documented_inventories_are_the_same_hosts(tmp_path):
    """docs/ansible.md's plain INI and YAML inventories, read by ansible-core's loader (`inventory
    from-ansible`) and validated by the toolkit's inventory loader, give the same host files:
    the INI's ddtree_smoke_levels and the YAML's ddtree_smoke mapping are one [smoke] table."""
    _ansible_or_skip()
    blocks = dict(re.findall(r"^```\w+\n# (inventory\.\w+)[^\n]*\n(.*?)^```$", DOCS.read_text(), re.M | re.S))
    assert sorted(blocks) == ["inventory.ini", "inventory.yml"], sorted(blocks)
    written = {}
    for name, text in blocks.items():
        (tmp_path / name).write_text(text)
        out = tmp_path / f"hosts-{name}"
        r = subprocess.run([str(BIN / "ddtree-deploy"), "inventory", "from-ansible", str(tmp_path / name), "--out",
                            str(out)], capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        written[name] = {p.name: p.read_text() for p in sorted(out.iterdir())}
    assert sorted(written["inventory.ini"]) == ["gpu1.toml", "gpu2.toml", "groups.toml"]
    assert written["inventory.ini"] == written["inventory.yml"]
    assert '[smoke]\nlevels = ["compile", "import", "cli"]' in written["inventory.ini"]["gpu1.toml"]


def test_readmes_give_the_documented_commands():
    """The READMEs' ansible-playbook lines (the collection's README gives some; the toolkit's
    front door may link instead) are commands docs/ansible.md gives (and the tests run)."""
    for readme in (REPO / "README.md", COLLECTION / "README.md"):
        lines = re.findall(r"^ {4}(ansible-playbook .*)$", readme.read_text(), re.M)
        assert lines or readme.parent == REPO, readme
        assert [c for c in lines if shlex.split(c, comments=True) not in documented_commands()] == [], readme


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
        r = subprocess.run(["make", "-C", str(REPO), "collection", f"COLLECTION_OUT={tmp / 'dist'}",
                            f"ANSIBLE_GALAXY={BIN / 'ansible-galaxy'}"], env=env, capture_output=True, text=True)
        assert r.returncode == 0, r.stdout + r.stderr
        tarball = tmp / "dist" / f"ddtree-deploy-{__version__}.tar.gz"  # the toolkit's version
        assert [p.name for p in (tmp / "dist").iterdir()] == [tarball.name], r.stdout
        with tarfile.open(tarball) as tar:  # the collection's own files, no build left-overs
            names = tar.getnames()
        assert "playbooks/push.yml" in names and not [n for n in names if "__pycache__" in n or n.endswith(".pyc")]
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
               "patched": oracle(pristine, tmp, family), "paths": paths, "sshd": sshd}


def playbook(fleet, name: str, body: str, *args: str) -> tuple[int, str, dict]:
    """Run a playbook written here; (exit code, output, {host: recap counts})."""
    path = fleet["tmp"] / f"{name}.yml"
    path.write_text(body)
    return ansible_playbook(fleet, [str(BIN / "ansible-playbook"), "-i", str(fleet["inventory"]), str(path), *args])


def ansible_playbook(fleet, argv: list[str], cwd: Path | None = None) -> tuple[int, str, dict]:
    """Run ``argv`` (an ansible-playbook command line); (exit code, output, {host: recap counts})."""
    r = subprocess.run(argv, cwd=cwd, env=fleet["env"], capture_output=True, text=True, timeout=300)
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


def documented_commands() -> list[list[str]]:
    """The command lines docs/ansible.md gives for the shipped playbooks, in the doc's order."""
    lines = re.findall(r"^ {4}(ansible-playbook -i inventory\.ini ddtree\.deploy\..*)$", DOCS.read_text(), re.M)
    return [shlex.split(line, comments=True) for line in lines]


def documented(play: str, inventory: str = "inventory.ini", check: bool = False) -> list[str]:
    """The doc's first command line for the shipped playbook ``play``, for ``inventory``."""
    for argv in documented_commands():
        if argv[3] == f"ddtree.deploy.{play}" and ("--check" in argv) == check:
            return [inventory if a == "inventory.ini" else a for a in argv]
    raise AssertionError(f"docs/ansible.md gives no `ansible-playbook -i inventory.ini ddtree.deploy.{play}`")


def user_inventory(fleet, folder: str, kind: str, names: tuple[str, ...], smoke: dict) -> tuple[Path, dict]:
    """A user's folder (outside the checkout) with new sandbox hosts ``names`` in group gpu, in a
    plain INI (the smoke levels as ddtree_smoke_levels) or a YAML inventory (the [smoke] table
    as the ddtree_smoke mapping). Returns (the folder, {name: SandboxHost})."""
    sshd, tmp = fleet["sshd"], fleet["tmp"]
    hosts = {n: sshd.add_host(n, tmp / folder / "hosts" / n, files=fleet["paths"]) for n in names}
    where = {"ansible_host": "127.0.0.1", "ansible_port": sshd.port, "ansible_user": sshd.user,
             "ansible_ssh_private_key_file": str(sshd.identity),
             "ansible_ssh_common_args": f"-F {sshd.ssh_config} -o UserKnownHostsFile={sshd.known_hosts}"}
    user = tmp / folder / "user"
    user.mkdir()
    if kind == "ini":
        lines = ["[gpu]"] + [f"{n} ddtree_python={h.python} ddtree_state_dir={h.state_dir}" for n, h in hosts.items()]
        lines += ["", "[gpu:vars]"] + [f"{k}={v}" for k, v in where.items()]
        lines.append("ddtree_smoke_levels=" + ",".join(smoke["levels"]))
        (user / "inventory.ini").write_text("\n".join(lines) + "\n")
    else:
        import yaml

        members = {n: {"ddtree_python": str(h.python), "ddtree_state_dir": str(h.state_dir)} for n, h in hosts.items()}
        doc = {"all": {"children": {"gpu": {"hosts": members, "vars": dict(where, ddtree_smoke=smoke)}}}}
        (user / "inventory.yml").write_text(yaml.safe_dump(doc))
    return user, hosts


def read_files(host, paths) -> dict[str, bytes | None]:
    return {p: host.read(p) for p in paths}


@pytest.mark.sshd  # the fleet fixture's sshd
@pytest.mark.parametrize("kind", ["ini", "yaml"])
def test_shipped_playbooks_as_documented(fleet, kind):
    """The shipped playbooks and role, installed from the tarball, run with the command lines of
    docs/ansible.md (read from it, in its order) from a user's folder, on a plain two-host INI
    and on a YAML inventory whose [smoke] table is the ddtree_smoke mapping. Each host's smoke
    levels are its table's (compile): the toolkit's default levels would fail here at import
    (the venvs hold SGLang's files, not its dependencies), so a push that passes proves the
    table reached the toolkit. Before the role's run options had names of their own, every
    host failed every playbook ('ddtree_smoke must be a mapping'), and the YAML inventory's
    mapping failed the role's argument spec."""
    inventory = {"ini": "inventory.ini", "yaml": "inventory.yml"}[kind]
    user, hosts = user_inventory(fleet, f"docs-{kind}", kind, (f"{kind}1", f"{kind}2"), {"levels": ["compile"]})
    want = {"pristine": fleet["pristine"], "patched": fleet["patched"]}
    state, ran = "pristine", set()
    for argv in documented_commands():
        play, check = argv[3].rsplit(".", 1)[1], "--check" in argv
        if play == "restart":
            continue  # test_shipped_restart: a host with a server
        argv = [inventory if a == "inventory.ini" else a for a in argv]
        rc, out, recap = ansible_playbook(fleet, argv, cwd=user)
        assert rc == 0 and sorted(recap) == sorted(hosts), (argv, out)
        assert all(r["failed"] == 0 for r in recap.values()), (argv, out)
        if play == "push":
            # check mode: changed (files would switch) and nothing touched; else switched.
            assert all(r["changed"] == 1 for r in recap.values()), (argv, out)
            if "--diff" in argv:
                assert re.search(r"^\+    DDTREE = auto\(\)$", out, re.M), out  # a line patch 0001 adds
            state = state if check else "patched"
        elif play == "rollback":
            assert all(r["changed"] == 1 for r in recap.values()), (argv, out)
            state = "pristine"
        elif play == "status":
            for h in hosts:
                msg = re.search(rf'^ok: \[{h}\] => {{\s*"msg": "([\w-]+): ', out, re.M)
                assert msg and (msg[1] == "deployed") == (state == "patched"), out
        for h in hosts.values():
            assert read_files(h, fleet["paths"]) == want[state], argv
        ran.add((play, check))
    assert ran == {("push", True), ("push", False), ("status", False), ("rollback", False)}, ran


@pytest.mark.sshd  # the fleet fixture's sshd
def test_shipped_push_canary_and_run_options(fleet):
    """The shipped push's canary: the first host's smoke fails for real (its [smoke] table asks
    for the import level; its venv lacks SGLang's dependencies), the toolkit rolls it back and
    the play stops before the second host. Then the run's own option ddtree_push_smoke=false
    pushes both without the smoke while the hosts keep their ddtree_smoke table, and the
    shipped rollback puts the release back."""
    user, hosts = user_inventory(fleet, "canary", "yaml", ("c1", "c2"), {"levels": ["compile", "import"]})
    push = documented("push", "inventory.yml")
    rc, out, recap = ansible_playbook(fleet, push, cwd=user)
    assert rc != 0 and recap["c1"]["failed"] == 1 and "c2" not in recap, out
    assert re.search(r"fatal: \[c1\].*smoke level import failed: .*; rolled back automatically", out), out
    assert all(read_files(h, fleet["paths"]) == fleet["pristine"] for h in hosts.values())
    assert not hosts["c2"].state_dir.exists()  # never contacted

    rc, out, recap = ansible_playbook(fleet, push + ["-e", "ddtree_push_smoke=false"], cwd=user)
    assert rc == 0 and all(recap[h]["changed"] == 1 and recap[h]["failed"] == 0 for h in hosts), out
    assert all(read_files(h, fleet["paths"]) == fleet["patched"] for h in hosts.values())

    rc, out, recap = ansible_playbook(fleet, documented("rollback", "inventory.yml"), cwd=user)
    assert rc == 0 and all(recap[h]["changed"] == 1 for h in hosts), out
    assert all(read_files(h, fleet["paths"]) == fleet["pristine"] for h in hosts.values())


@pytest.mark.sshd  # the fleet fixture's sshd
def test_shipped_restart(fleet, tmp_path):
    """The shipped restart playbook (the doc's command) against a host whose server runs under
    supervisord (tests/serve_host.py: a STAND-IN for SGLang's HTTP server, which needs a GPU):
    check mode reports changed and restarts nothing; then restarted and healthy."""
    pytest.importorskip("supervisor", reason="supervisor (the test extra) runs the stand-in server")
    import yaml

    from serve_host import Served

    sshd = fleet["sshd"]
    s = Served(sshd, tmp_path, "served")
    with s.sup:
        s.wait_healthy()
        (tmp_path / "inventory.yml").write_text(yaml.safe_dump({"all": {"children": {"gpu": {"hosts": {"served": {
            "ansible_host": "127.0.0.1", "ansible_port": sshd.port, "ansible_user": sshd.user,
            "ansible_ssh_private_key_file": str(sshd.identity), "ddtree_python": str(s.host.python),
            "ddtree_state_dir": str(s.host.state_dir),
            "ansible_ssh_common_args": f"-F {sshd.ssh_config} -o UserKnownHostsFile={sshd.known_hosts}",
            "ddtree_serve": {"restart": s.sup.restart_argv, "url": f"http://127.0.0.1:{s.port}",
                             "ready_timeout_s": 20, "poll_s": 0.2}}}}}}}))
        restart = documented("restart", "inventory.yml")
        pid = s.sup.pid()
        rc, out, recap = ansible_playbook(fleet, restart + ["--check"], cwd=tmp_path)
        assert rc == 0 and recap["served"]["changed"] == 1 and s.sup.pid() == pid, out
        rc, out, recap = ansible_playbook(fleet, restart + ["-v"], cwd=tmp_path)  # -v: the task's msg
        assert rc == 0 and recap["served"]["changed"] == 1 and recap["served"]["failed"] == 0, out
        assert '"msg": "healthy' in out and s.sup.pid() not in (pid, None) and s.healthy(), out


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
    """ansible-doc renders every module and the role from the installed collection; each
    module's documented options are exactly what its action plugin accepts (names, types,
    defaults), and each role option the role's tasks pass to a module has that option's type
    and default (the role's argument spec agrees with the modules')."""
    r = subprocess.run([str(BIN / "ansible-doc"), "--json", "ddtree.deploy.push", "ddtree.deploy.status",
                        "ddtree.deploy.rollback", "ddtree.deploy.restart"], env=fleet["env"], capture_output=True,
                       text=True)
    assert r.returncode == 0 and "ERROR" not in r.stderr, r.stderr
    rendered = json.loads(r.stdout)
    installed = fleet["tmp"] / "collections"
    sys.path.insert(0, str(installed))  # the installed collection, as Ansible imports it
    try:
        from ansible_collections.ddtree.deploy.plugins.plugin_utils.toolkit import SPECS
    finally:
        sys.path.remove(str(installed))
    for name, spec in SPECS.items():
        assert f"ddtree.deploy.{name}" in rendered
        # As ansible-doc renders it: the module's own options and its doc fragments' (plugins/doc_fragments).
        doc = rendered[f"ddtree.deploy.{name}"]["doc"]
        assert set(doc["options"]) == set(spec), name
        for opt, s in spec.items():
            assert doc["options"][opt]["type"] == s["type"], (name, opt)
            assert doc["options"][opt].get("default") == s.get("default"), (name, opt)

    r = subprocess.run([str(BIN / "ansible-doc"), "--json", "-t", "role", "ddtree.deploy.deploy"], env=fleet["env"],
                       capture_output=True, text=True)
    assert r.returncode == 0 and "ERROR" not in r.stderr, r.stderr
    role = installed / "ansible_collections" / "ddtree" / "deploy" / "roles" / "deploy"
    options = _yaml(role / "meta" / "argument_specs.yml")["argument_specs"]["main"]["options"]
    assert set(json.loads(r.stdout)["ddtree.deploy.deploy"]["entry_points"]["main"]["options"]) == set(options)
    passed = 0
    for path in sorted((role / "tasks").glob("*.yml")):
        for task in _yaml(path):
            module = next((k for k in task if k.startswith("ddtree.deploy.")), None)
            for opt, value in (task.get(module) or {}).items() if module else ():
                (var,) = re.findall(r"\{\{\s*(\w+)", value)
                want = SPECS[module.rsplit(".", 1)[1]][opt]
                assert options[var]["type"] == want["type"], (path.name, opt, var)
                assert options[var].get("default") == want.get("default"), (path.name, opt, var)
                passed += 1
    assert passed == 9  # push 4 (family, smoke, levels, trust_new_host), status 2, rollback 2, restart 1


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
