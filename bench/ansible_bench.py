"""The same 8-host push through the Ansible collection vs `ddtree-deploy push --group`, same run.

    python -m bench ansible_bench

Eight hosts behind one real OpenSSH sshd on loopback, each its own venv with SGLang
0.5.12.post1's real files, the real DDTree series, no smoke levels (both paths switch the
files and journal `deployed`). Baseline: ``ddtree-deploy push --group fleet --parallel 8
--no-smoke`` as a process (canary first, then the other seven on threads). Measured:
``ansible-playbook`` with the collection (built with ansible-galaxy and installed from the
tarball), ``forks: 8``, ``serial: [1, "100%"]`` (the same canary-then-rest schedule),
``ddtree.deploy.push: {smoke: false}``: one ``ddtree-deploy push --host`` process per host.
Every run starts from pristine hosts (reset untimed); the two alternate; medians of RUNS.
Needs ansible-core in this venv (``pip install -e '.[test]'``).
"""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ddtree_deploy.engine.series import load_family
from ddtree_deploy.sandbox import SSHServer

REPO = Path(__file__).resolve().parent.parent

HOSTS = 8
RUNS = 3
BIN = Path(sys.executable).parent
FAMILY = REPO / "patches" / "sglang-0.5.12"

PLAYBOOK = """
- hosts: fleet
  gather_facts: false
  serial: [1, "100%"]
  tasks:
    - ddtree.deploy.push:
        smoke: false
"""


def main() -> None:
    if not Path("/usr/sbin/sshd").exists() or not (BIN / "ansible-playbook").exists():
        print("ansible_bench: needs OpenSSH's sshd and ansible-core in this venv "
              "(pip install -e '.[test]'); skipped")
        return
    tmp = Path(tempfile.mkdtemp(prefix="ansible-bench-"))
    try:
        env = dict(os.environ, PATH=f"{BIN}:{os.environ['PATH']}", DDTREE_DEPLOY_SNAPSHOT=str(tmp / "snapshot"),
                   DDTREE_DEPLOY_HOSTS=str(tmp / "hosts"), ANSIBLE_LOCAL_TEMP=str(tmp / "atmp"),
                   ANSIBLE_COLLECTIONS_PATH=str(tmp / "collections"), ANSIBLE_FORKS=str(HOSTS),
                   ANSIBLE_NOCOLOR="1", ANSIBLE_RETRY_FILES_ENABLED="0")
        shutil.copytree(REPO / "snapshot", tmp / "snapshot", ignore=shutil.ignore_patterns("files"))
        for cmd in (["collection", "build", str(REPO / "ansible" / "ddtree"), "--output-path", str(tmp)],):
            subprocess.run([str(BIN / "ansible-galaxy"), *cmd], env=env, check=True, capture_output=True)
        subprocess.run([str(BIN / "ansible-galaxy"), "collection", "install", str(next(tmp.glob("*.tar.gz"))),
                        "-p", str(tmp / "collections")], env=env, check=True, capture_output=True)
        touched = list(load_family(FAMILY).touched_paths())
        with SSHServer(tmp / "sshd") as sshd:
            hosts = [sshd.add_host(f"a{i}", tmp / f"a{i}", files=touched) for i in range(HOSTS)]
            lines = ["[fleet]"]
            for h in hosts:
                h.inventory(tmp / "hosts", smoke_levels=[])
                lines.append(f"{h.name} ansible_host=127.0.0.1 ansible_port={sshd.port} ansible_user={sshd.user} "
                             f"ansible_ssh_private_key_file={sshd.identity} ddtree_python={h.python} "
                             f"ddtree_state_dir={h.state_dir} "
                             f"\"ansible_ssh_common_args=-F {sshd.ssh_config} -o UserKnownHostsFile={sshd.known_hosts}\"")
            (tmp / "hosts" / "groups.toml").write_text(
                "[groups]\nfleet = [" + ", ".join(f'"{h.name}"' for h in hosts) + "]\n")
            (tmp / "inventory.ini").write_text("\n".join(lines) + "\n")
            (tmp / "push.yml").write_text(PLAYBOOK)
            pristine = {h.name: {p: h.read(p) for p in touched} for h in hosts}

            def reset() -> None:
                for h in hosts:
                    for rel, data in pristine[h.name].items():
                        if data is None:
                            h.file(rel).unlink(missing_ok=True)
                        else:
                            h.file(rel).write_bytes(data)
                    shutil.rmtree(h.state_dir, ignore_errors=True)

            def timed(argv: list[str]) -> float:
                reset()
                t = time.perf_counter()
                r = subprocess.run(argv, env=env, capture_output=True, text=True)
                took = time.perf_counter() - t
                if r.returncode != 0:
                    raise SystemExit(f"ansible_bench: {argv[0]} failed:\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}")
                for h in hosts:  # both really switched every host
                    assert h.read(touched[0]) != pristine[h.name][touched[0]], h.name
                return took

            cases = {
                f"ddtree-deploy push --group fleet --parallel {HOSTS}":
                    [str(BIN / "ddtree-deploy"), "push", "--group", "fleet", "--parallel", str(HOSTS),
                     "--no-smoke", "--family", str(FAMILY)],
                f"ansible-playbook + ddtree.deploy.push (forks {HOSTS})":
                    [str(BIN / "ansible-playbook"), "-i", str(tmp / "inventory.ini"), str(tmp / "push.yml")],
            }
            for argv in cases.values():
                timed(argv)  # warm-up: page cache, the release snapshot, sshd's first forks
            got: dict[str, list[float]] = {name: [] for name in cases}
            for _ in range(RUNS):
                for name, argv in cases.items():
                    got[name].append(timed(argv))
            reset()
        print(f"{os.cpu_count()} CPU(s), load average {os.getloadavg()[0]:.1f}; {HOSTS} hosts, real series "
              f"({len(touched)} files), no smoke; canary then the rest; medians of {RUNS} runs")
        med = {}
        for name, runs in got.items():
            med[name] = statistics.median(runs)
            print(f"  {name:<58} {med[name]:6.2f} s   (runs: {', '.join(f'{r:.2f}' for r in runs)})")
        base, ans = med[list(cases)[0]], med[list(cases)[1]]
        print(f"  ratio ansible-playbook / ddtree-deploy push --group: {ans / base:.2f}x "
              "(the collection runs one ddtree-deploy process per host, plus Ansible's own start-up)")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
