"""CLI start-up: `ddtree-deploy --help` vs a one-command typer app's `--help`, same run.

    python -m bench cli_help_bench
    python -m bench.cli_help_bench REV     # also the package as of git revision REV

Every `ddtree-deploy` command pays this start before it does anything. Baseline: a typer
app with one command (typer + rich, nothing of ours), in a fresh interpreter like ours.
Measured: `ddtree-deploy --help`, `push --help` and `lock status --help` (the package as
checked out, imported the way the console script does: a named command loads only its own
command module, bare `--help` loads all). With REV, the package of that revision (``git archive`` into a temporary
folder, first on PYTHONPATH) is measured too, to compare before/after in one run. The
runs alternate; medians of RUNS wall-clock seconds; output discarded.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
RUNS = 9
OURS = "from ddtree_deploy.cli import main; main()"
TYPER_ONLY = (
    "import typer\n"
    "app = typer.Typer(add_completion=True)\n"
    "@app.command()\n"
    "def hello(name: str = typer.Option('x', help='a name')) -> None:\n"
    "    'Say hello.'\n"
    "@app.command()\n"
    "def bye() -> None:\n"
    "    'Say bye.'\n"
    "app()\n"
)


def _once(code: str, pythonpath: str, args: list[str]) -> float:
    env = dict(os.environ, PYTHONPATH=pythonpath, COLUMNS="100")
    started = time.perf_counter()
    # cwd: a neutral folder (`python -c` puts the cwd first on sys.path, ahead of PYTHONPATH).
    done = subprocess.run([sys.executable, "-c", code, *args, "--help"], env=env, stdout=subprocess.DEVNULL,
                          cwd="/",
                          stderr=subprocess.PIPE, timeout=120)
    took = time.perf_counter() - started
    if done.returncode != 0:
        return float("nan")  # that revision has no such command
    return took


def main(argv: list[str] | None = None) -> None:
    argv = argv or []
    with tempfile.TemporaryDirectory() as tmp:
        cases = {"typer only (baseline)": (TYPER_ONLY, "", [])}
        trees = [("", str(REPO))]
        if argv:
            rev = argv[0]
            archive = subprocess.run(["git", "-C", str(REPO), "archive", rev, "ddtree_deploy"],
                                     capture_output=True, check=True).stdout
            tree = Path(tmp) / "tree"
            tree.mkdir()
            subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
            trees.append((f" at {rev}", str(tree)))
        for args in ([], ["push"], ["lock", "status"]):
            for label, path in trees:
                cases[" ".join(["ddtree-deploy", *args, "--help"]) + label] = (OURS, path, args)
        times: dict[str, list[float]] = {name: [] for name in cases}
        for _ in range(RUNS):
            for name, (code, path, args) in cases.items():
                times[name].append(_once(code, path, args))
    base = statistics.median(times["typer only (baseline)"])
    for name, ts in times.items():
        med = statistics.median(ts)
        if med != med:
            print(f"{name:<48} (no such command there)")
            continue
        print(f"{name:<48} median {med * 1000:7.1f} ms  ({med / base:.2f}x the baseline; {RUNS} runs)")


if __name__ == "__main__":
    main(sys.argv[1:])
