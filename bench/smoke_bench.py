"""What the smoke program adds on top of what it measures.

    python -m bench smoke_bench

1. compile level: the host program (a fresh interpreter reading its request, compiling
   the series' SGLang 0.5.12.post1 files from the release wheel, answering JSON) against
   the two things it cannot avoid, measured here in the same run: starting an interpreter
   (`python -c pass`) and compiling the same files in this process.
2. launch level against ddtree_testkit/standin_server.py (a STAND-IN for SGLang's server: no GPU
   here): the full level (port check, start, readiness poll, /generate probe,
   /server_info, TERM of the process group, check that nothing is left) against a bare
   start-until-listening-then-kill of the same stand-in.

Medians of a few runs; ratios are against the baselines above. Nothing is asserted.
"""

from __future__ import annotations

import json
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

from ddtree_deploy.hostprog import smoke as smoke_agent
from ddtree_deploy.release import releases
from ddtree_testkit import STANDIN_SERVER

AGENT = Path(smoke_agent.__file__)
STANDIN = STANDIN_SERVER
FILES = ["sglang/srt/speculative/spec_info.py", "sglang/srt/server_args.py",
         "sglang/srt/speculative/dflash_info.py", "sglang/srt/speculative/dflash_worker.py",
         "sglang/srt/speculative/spec_registry.py"]


def median_s(fn, runs: int) -> float:
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def agent(request: dict) -> dict:
    out = subprocess.run([sys.executable, str(AGENT)], input=json.dumps(request) + "\n",
                         capture_output=True, text=True, check=True, timeout=120).stdout
    answer = json.loads(out.splitlines()[-1])
    if not answer["ok"]:
        raise RuntimeError(f"smoke program failed: {answer['levels']}")
    return answer


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def bare_standin() -> None:
    port = free_port()
    proc = subprocess.Popen([sys.executable, str(STANDIN), "--model-path", "m", "--port", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                break
        time.sleep(0.02)
    proc.terminate()
    proc.wait()


def launch_request(log: Path) -> dict:
    port = free_port()
    return {"levels": ["launch"], "launch": {
        "argv": ["{python}", str(STANDIN), "--model-path", "m", "--speculative-algorithm", "DDTREE",
                 "--port", str(port)],
        "host": "127.0.0.1", "port": port, "log_path": str(log), "gpu_check": False,
        "ready_timeout_s": 30, "poll_s": 0.05, "term_grace_s": 5, "expect_algorithm": "DDTREE",
        "probe": {"text": "bench", "max_new_tokens": 16}}}


def main() -> None:
    wheel = releases.ensure_wheel("0.5.12.post1")
    with tempfile.TemporaryDirectory(prefix="smoke-bench-") as tmp:
        root = Path(tmp)
        with zipfile.ZipFile(wheel) as zf:
            for name in FILES:
                zf.extract(name, root)
        paths = [str(root / f) for f in FILES]
        size = sum(Path(p).stat().st_size for p in paths)

        start = median_s(lambda: subprocess.run([sys.executable, "-c", "pass"], check=True), 5)

        def compile_here():
            for p in paths:
                compile(Path(p).read_bytes(), p, "exec", dont_inherit=True)

        here = median_s(compile_here, 5)
        level = median_s(lambda: agent({"levels": ["compile"], "compile": {"files": paths}}), 5)
        print(f"compile level, {len(FILES)} SGLang files ({size / 1e6:.2f} MB), median of 5:")
        print(f"  interpreter start (python -c pass)   {start * 1000:8.1f} ms")
        print(f"  compile in this process              {here * 1000:8.1f} ms")
        print(f"  smoke program, compile level         {level * 1000:8.1f} ms   "
              f"= {level / (start + here):.2f} x (start + compile)")

        bare = median_s(bare_standin, 3)
        runs = iter(range(100))
        full = median_s(lambda: agent(launch_request(root / f"log{next(runs)}")), 3)
        print("launch level against the STAND-IN server, median of 3:")
        print(f"  stand-in start until listening, kill {bare * 1000:8.1f} ms")
        print(f"  smoke program, launch level          {full * 1000:8.1f} ms   = {full / bare:.2f} x bare")


if __name__ == "__main__":
    main()
