"""A real process supervisor for the serving tests: supervisord (``supervisor`` from PyPI, the
test extra), one per sandbox host, running one program (the stand-in SGLang server) the way
a GPU host runs its server under systemd or supervisord.

systemd cannot run on the test machines (no init of our own in a container); supervisord is
a real, widely used supervisor whose ``supervisorctl restart NAME`` is one of the restart
commands an inventory's ``[serve] restart`` names. Nothing here is a stand-in: the restart
really stops the process group (TERM, then KILL after stopwaitsecs) and starts the
command again, which reads the package's files anew.

    with Supervised(tmp / "sup", "sglang", [python, standin, "--port", "30001", ...]) as sup:
        sup.restart_argv            # ["<python>", "-m", "supervisor.supervisorctl", "-c", conf, "restart", "sglang"]
        sup.pid()                   # the program's pid (supervisorctl pid)
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def _quote(arg: str) -> str:
    """supervisord splits ``command`` with shlex: quote each argument for it."""
    import shlex

    return shlex.quote(arg)


class Supervised:
    def __init__(self, folder: Path, name: str, argv: list[str], *, stopwaitsecs: int = 5,
                 environment: dict[str, str] | None = None):
        self.dir = Path(folder)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.name = name
        self.argv = list(argv)
        self.conf = self.dir / "supervisord.conf"
        # A unix socket's path is limited to 107 bytes (sun_path), and pytest's folders under
        # xdist (/tmp/pytest-of-USER/pytest-N/popen-gwK/test_.../host/supervisor/) pass it:
        # supervisord then exits at once ("AF_UNIX path too long"). The socket gets a short
        # folder of its own, removed by stop().
        self.sock_dir = Path(tempfile.mkdtemp(prefix="ddsup-"))
        self.sock = self.sock_dir / "s.sock"
        self.log = self.dir / f"{name}.log"
        env = ",".join(f'{k}="{v}"' for k, v in (environment or {}).items())
        self.conf.write_text("\n".join([
            "[unix_http_server]", f"file={self.sock}", "",
            "[supervisord]", f"logfile={self.dir / 'supervisord.log'}", f"pidfile={self.dir / 'supervisord.pid'}",
            "nodaemon=true", "loglevel=info", "",
            "[rpcinterface:supervisor]",
            "supervisor.rpcinterface_factory = supervisor.rpcinterface:make_main_rpcinterface", "",
            "[supervisorctl]", f"serverurl=unix://{self.sock}", "",
            f"[program:{name}]", "command=" + " ".join(_quote(a) for a in self.argv),
            f"directory={self.dir}", "autostart=true", "autorestart=unexpected", "startsecs=0",
            f"stopwaitsecs={stopwaitsecs}", "stopasgroup=true", "killasgroup=true", "redirect_stderr=true",
            f"stdout_logfile={self.log}", *([f"environment={env}"] if env else []), "",
        ]))
        self.proc: subprocess.Popen | None = None

    @property
    def ctl(self) -> list[str]:
        return [sys.executable, "-m", "supervisor.supervisorctl", "-c", str(self.conf)]

    @property
    def restart_argv(self) -> list[str]:
        return [*self.ctl, "restart", self.name]

    def start(self) -> "Supervised":
        errors = self.dir / "supervisord.stderr"
        with errors.open("wb") as err:
            self.proc = subprocess.Popen([sys.executable, "-m", "supervisor.supervisord", "-c", str(self.conf)],
                                         stdout=err, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.pid():
                return self
            if self.proc.poll() is not None:
                break
            time.sleep(0.1)
        said = "".join(f.read_text(errors="replace")[-2000:] for f in (self.dir / "supervisord.log", errors)
                       if f.exists())
        raise RuntimeError(f"supervisord did not start {self.name}: {said or 'no log'}")

    def pid(self) -> int | None:
        r = subprocess.run([*self.ctl, "pid", self.name], capture_output=True, text=True, timeout=30)
        out = r.stdout.strip()
        return int(out) if out.isdigit() and int(out) > 0 else None

    def stop(self) -> None:
        if self.proc is None:
            shutil.rmtree(self.sock_dir, ignore_errors=True)
            return
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)  # supervisord stops its program, then exits
            self.proc.wait(timeout=30)
        except ProcessLookupError:
            pass
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        self.proc = None
        shutil.rmtree(self.sock_dir, ignore_errors=True)

    def __enter__(self) -> "Supervised":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


__all__ = ["Supervised"]
