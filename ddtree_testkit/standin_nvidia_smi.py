"""A stand-in ``nvidia-smi`` for sandbox hosts: a shell script printing the real tool's formats.

No machine here has an NVIDIA driver. The stand-in answers the two reads the host probe makes
(ddtree_deploy/hostprog/gpu_driver.py) in the real tool's output formats, with the driver
version each test sets:

- ``--query-gpu=driver_version,name --format=csv,noheader``: one ``<driver>, <name>`` line per
  GPU, as NVIDIA's nvidia-smi documents its CSV query output (``--help-query-gpu``: fields in
  the order asked, comma and space between them, no header with ``noheader``);
- no argument: the banner, whose first box holds ``NVIDIA-SMI <v>  Driver Version: <v>  CUDA
  Version: <cuda>`` (the layout every driver since 450 prints).

``query_output`` overrides the query's answer (a driver string the tool cannot parse), and
``exit_code`` makes it fail as a driver that is not loaded does. A test names it as a stand-in.
"""

from __future__ import annotations

import shlex
from pathlib import Path

BANNER = """\
{date}
+-----------------------------------------------------------------------------------------+
| NVIDIA-SMI {driver:<22} Driver Version: {driver:<14} CUDA Version: {cuda:<9}|
|-----------------------------------------+------------------------+----------------------+
| GPU  Name                 Persistence-M | Bus-Id          Disp.A | Volatile Uncorr. ECC |
| Fan  Temp   Perf          Pwr:Usage/Cap |           Memory-Usage | GPU-Util  Compute M. |
|=========================================+========================+======================|
{rows}+-----------------------------------------------------------------------------------------+
"""
ROW = """\
|   {i}  {name:<27}   On  |   00000000:{bus:02X}:00.0 Off |                    0 |
| N/A   31C    P0             71W /  700W |       1MiB /  81559MiB |      0%      Default |
+-----------------------------------------+------------------------+----------------------+
"""
NOT_LOADED = ("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
              "Make sure that the latest NVIDIA driver is installed and running.")


def query_lines(driver: str, names: list[str]) -> str:
    return "".join(f"{driver}, {name}\n" for name in names)


def banner(driver: str, cuda: str, names: list[str]) -> str:
    rows = "".join(ROW.format(i=i, name=n[:27], bus=0x18 + i) for i, n in enumerate(names))
    return BANNER.format(date="Wed Dec  2 12:00:00 2026", driver=driver, cuda=cuda, rows=rows)


def install(bin_dir: Path, driver: str = "570.124.06", cuda: str = "12.8",
            names: list[str] | None = None, *, query_output: str | None = None, exit_code: int = 0) -> Path:
    """Write the stand-in as ``bin_dir/nvidia-smi`` (replacing any) and return its path."""
    names = names or ["NVIDIA H100 80GB HBM3", "NVIDIA H100 80GB HBM3"]
    query = query_output if query_output is not None else query_lines(driver, names)
    script = bin_dir / "nvidia-smi"
    bin_dir.mkdir(parents=True, exist_ok=True)
    failing = f"echo {shlex.quote(NOT_LOADED)}\nexit {exit_code}\n" if exit_code else ""
    script.write_text(
        "#!/bin/sh\n"
        "# A stand-in nvidia-smi (ddtree_testkit/standin_nvidia_smi.py): no NVIDIA driver here.\n"
        + failing
        + 'case "$1" in\n'
        f"  --query-gpu=*) printf '%s' {shlex.quote(query)} ;;\n"
        f"  *) printf '%s' {shlex.quote(banner(driver, cuda, names))} ;;\n"
        "esac\n"
    )
    script.chmod(0o755)
    return script


def remove(bin_dir: Path) -> None:
    """No nvidia-smi on the host (a CPU or demo host)."""
    (bin_dir / "nvidia-smi").unlink(missing_ok=True)
