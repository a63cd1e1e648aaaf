"""Fleet push: 8 loopback hosts with --parallel 8 against 1 host, in the same run.

    python -m bench fleet_bench

Eight real OpenSSH sshd on loopback (one per host: own port, own keys), each host its
own venv holding SGLang 0.5.12.post1's real files. Both figures are the whole push as
``ddtree-deploy push`` runs it, called through ``rollout.push`` (what the CLI calls
after parsing: inventories, the series check, connect, lock, back up, stage, switch,
journal, the ``compile`` smoke level), so the ratio shows what the fleet path adds over
one host: the canary first (alone), then the seven others at once on threads.

The series is the real DDTree series when it applies to 0.5.12.post1, else the small
real test series (tests/data/deploy_series). Every run starts from pristine hosts (reset
untimed); single and fleet runs alternate, so both see the same machine load; the
figures are medians of RUNS runs after one warm-up of each.

On this loopback setup the "hosts" run their side (sshd, the login shell, the host
agent, the compile level) on the same cores as the controller, so the benchmark also
measures, per push, the CPU seconds spent by the controller (this process) and by the
host side (the sshd processes' reaped children), and the same 8 hosts with --parallel
1, to show what the threads buy and where the remaining time goes.
"""

from __future__ import annotations

import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from ddtree_deploy.base.errors import DeployError
from ddtree_deploy.engine.series import load_family
from ddtree_deploy.fleets import rollout
from ddtree_deploy.remote.transport import transport_for
from ddtree_deploy.sandbox import SSHServer
from ddtree_deploy.session.desired import desired_for

REPO = Path(__file__).resolve().parent.parent
# The tests' small real series (data, read from the checkout like patches/).
DEPLOY_SERIES = REPO / "tests" / "data" / "deploy_series"

HOSTS = 8
RUNS = 5
SERIAL_RUNS = 3  # the --parallel 1 comparison (it takes HOSTS times longer)
TARGET = 2.0  # fleet of 8 (--parallel 8) <= 2x one host


def choose_family() -> tuple[Path, str]:
    """The real series when it applies to the release, else the tests' small real series."""
    real = REPO / "patches" / "sglang-0.5.12"
    facts = {"sglang_version": "0.5.12.post1", "files": {}, "package_root": "-"}
    try:
        series = load_family(real)
        desired_for(series, "bench", facts)
        return real, f"the real series {series.name} ({len(series.touched_paths())} files)"
    except DeployError as exc:  # BadInput too
        fallback = DEPLOY_SERIES / "patches" / "sglang-0.5.12"
        return fallback, f"the test series {fallback} (the real one does not apply: {exc.message})"


def _self_cpu() -> float:
    t = os.times()
    return t.user + t.system  # this process's threads: the controller


def _host_cpu(servers: list[SSHServer]) -> float:
    """CPU seconds of the sshd listeners' reaped children: every session's sshd, shell, agent."""
    total = 0
    for s in servers:
        try:
            fields = Path(f"/proc/{s.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            return float("nan")
        total += int(fields[13]) + int(fields[14])  # cutime, cstime
    return total / os.sysconf("SC_CLK_TCK")


def main() -> None:
    if not Path("/usr/sbin/sshd").exists():
        print("fleet_bench: needs OpenSSH's sshd (apt-get install openssh-server); skipped")
        return
    tmp = Path(tempfile.mkdtemp(prefix="fleet-bench-"))
    servers: list[SSHServer] = []
    saved = {k: os.environ.get(k) for k in ("DDTREE_DEPLOY_SNAPSHOT", "DDTREE_DEPLOY_HOSTS", "DDTREE_DEPLOY_PATCHES")}
    try:
        os.environ["DDTREE_DEPLOY_SNAPSHOT"] = str(tmp / "snapshot")
        os.environ["DDTREE_DEPLOY_HOSTS"] = str(tmp / "hosts")
        family, why = choose_family()
        touched = list(load_family(family).touched_paths())
        print(f"series: {why}")
        hosts = []
        for i in range(HOSTS):
            server = SSHServer(tmp / f"sshd{i}")
            server.start()
            servers.append(server)
            h = server.add_host(f"f{i}", tmp / f"f{i}", files=[p for p in touched if not p.endswith("_marker.py")])
            h.inventory(tmp / "hosts", smoke_levels=["compile"])
            hosts.append(h)
        pristine = {h.name: {p: h.read(p) for p in touched} for h in hosts}

        def reset() -> None:
            for h in hosts:
                for rel, data in pristine[h.name].items():
                    p = h.file(rel)
                    if data is None:
                        p.unlink(missing_ok=True)
                    else:
                        p.write_bytes(data)
                shutil.rmtree(h.state_dir, ignore_errors=True)

        def push(names: list[str], parallel: int | None = None) -> tuple[float, float, float]:
            """(wall, controller CPU, host-side CPU) seconds of one push (inventories read included)."""
            reset()
            options = rollout.PushOptions(family=str(family), parallel=parallel)
            cpu0, host0, t = _self_cpu(), _host_cpu(servers), time.perf_counter()
            report = rollout.push(rollout.select_hosts(names, []), transport_for, options)
            took = time.perf_counter() - t
            if not report.ok:
                bad = [f"{r.host}: {r.kind.value}: {r.message}" for r in report.results if not r.kind.ok]
                raise SystemExit("fleet_bench: push failed:\n" + "\n".join(bad))
            time.sleep(0.2)  # let sshd reap the sessions' processes (their CPU is counted then)
            return took, _self_cpu() - cpu0, _host_cpu(servers) - host0

        names = [h.name for h in hosts]
        cases = {
            "1 host": lambda: push(names[:1]),
            f"{HOSTS} hosts, canary + --parallel {HOSTS}": lambda: push(names, parallel=HOSTS),
            f"{HOSTS} hosts, canary + --parallel 1": lambda: push(names, parallel=1),
        }
        runs = {name: RUNS if i < 2 else SERIAL_RUNS for i, name in enumerate(cases)}
        for fn in cases.values():
            fn()  # warm-up: imports, page cache, the release snapshot, sshd's first forks
        got: dict[str, list[tuple[float, float, float]]] = {name: [] for name in cases}
        for i in range(RUNS):  # interleaved: every case sees the same machine load
            for name, fn in cases.items():
                if i < runs[name]:
                    got[name].append(fn())
        reset()
        load = os.getloadavg()[0]
        print(f"{os.cpu_count()} CPU(s), load average {load:.1f}; push + compile smoke; medians "
              f"({RUNS} runs; {SERIAL_RUNS} for --parallel 1)")
        print(f"  {'':<36} {'wall':>7} {'controller CPU':>15} {'host-side CPU':>14}")
        med = {}
        for name, rows in got.items():
            wall, ctl, remote = (statistics.median(r[k] for r in rows) for k in range(3))
            med[name] = wall
            print(f"  push, {name:<30} {wall:6.2f} s {ctl:13.2f} s {remote:12.2f} s"
                  f"   (runs: {', '.join(f'{r[0]:.2f}' for r in rows)})")
        one, fleet, serial = (med[n] for n in cases)
        # What the cores allow at best: all the CPU the 8-host push needed, spread on every core.
        _w, ctl8, host8 = (statistics.median(r[k] for r in got[list(cases)[1]]) for k in range(3))
        floor = (ctl8 + host8) / (os.cpu_count() or 1)
        print(f"  CPU floor of the {HOSTS}-host push on {os.cpu_count()} idle cores: {floor:.2f} s "
              f"= {floor / one:.2f}x the 1-host wall (the hosts' side shares these cores here)")
        ratio = fleet / one
        verdict = "meets" if ratio <= TARGET else "MISSES"
        print(f"  ratio {HOSTS} hosts (--parallel {HOSTS}) / 1 host: {ratio:.2f}x ({verdict} the target <= {TARGET:g}x)")
        print(f"  --parallel {HOSTS} vs --parallel 1 on the same {HOSTS} hosts: {serial / fleet:.2f}x faster")
    finally:
        for s in servers:
            s.stop()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
