"""The host's NVIDIA driver, as ``nvidia-smi`` says it: read on the host, parsed here.

Two reads, each with a deadline (``nvidia-smi`` can take seconds on a GPU without
persistence mode, and hangs outright on a wedged driver):

- ``nvidia-smi --query-gpu=driver_version,name --format=csv,noheader``: one line per GPU,
  ``<driver>, <name>`` (NVIDIA's documented CSV form: fields in the order asked, ", "
  between them, no header line);
- plain ``nvidia-smi``: its banner's ``CUDA Version: 12.8`` is the newest CUDA the driver
  supports (the query has no field for it on the drivers fleets run).

``probe`` never raises: a host without ``nvidia-smi`` is a fact (``found`` false: a CPU or
demo host), and output the parsers cannot read is reported as read (``error`` names it,
``read`` holds it), so the controller can say it in one line. The parsers are pure and
shared with the controller (ddtree_deploy/release/cuda_lanes.py), so the host and the
controller can never read one string two ways. Stdlib only, Python 3.8 (a host program).
"""

import os
import re
import shutil
import subprocess

QUERY = ["--query-gpu=driver_version,name", "--format=csv,noheader"]
TIMEOUT_S = 10.0  # each read; two stay inside status's 30 s agent deadline (op_timeout)

# A Linux driver version: the branch (3 digits, 4 one day), then one or two dotted parts
# (570.124.06, 580.65.06, 535.86.10; some data-center builds have two parts, 550.54).
DRIVER_RE = re.compile(r"^(\d{3,4})\.(\d{1,3})(?:\.(\d{1,3}))?$")
# The banner's "CUDA Version: 12.8" (older tools pad with spaces; a broken one says "N/A").
CUDA_RE = re.compile(r"CUDA Version\s*:\s*(\d+\.\d+)")
#: How much of unreadable output a report keeps (it goes into one line).
READ_KEEP = 200


def parse_driver(text):
    """``(branch, minor, patch)`` ints of a driver version string, else None."""
    m = DRIVER_RE.match((text or "").strip())
    if m is None:
        return None
    return int(m.group(1)), int(m.group(2)), int(m.group(3) or 0)


def parse_query(text):
    """``(driver, [gpu names], error)`` from the query's CSV lines.

    Every GPU of a host shares one driver; lines that disagree, or a line that is not
    ``<version>, <name>``, make ``error`` (what was read, kept short) and no driver.
    """
    rows = [line.strip() for line in (text or "").splitlines() if line.strip()]
    if not rows:
        return None, [], "nvidia-smi listed no GPU (empty output)"
    drivers, names = [], []
    for row in rows:
        driver, _, name = row.partition(",")
        driver, name = driver.strip(), name.strip()
        if parse_driver(driver) is None:
            return None, [], "cannot read a driver version in nvidia-smi's output: %r" % shorten(row)
        drivers.append(driver)
        names.append(name)
    if len(set(drivers)) > 1:
        return None, names, "nvidia-smi reports different drivers per GPU: %s" % ", ".join(sorted(set(drivers)))
    return drivers[0], names, None


def parse_cuda(text):
    """The ``CUDA Version`` of nvidia-smi's banner ("12.8"), else None."""
    m = CUDA_RE.search(text or "")
    return m.group(1) if m else None


def shorten(text):
    text = " ".join((text or "").split())
    return text if len(text) <= READ_KEEP else text[:READ_KEEP] + "..."


def _run(argv, timeout_s):
    """(exit code, stdout + stderr); exit None when it timed out (the child is killed)."""
    try:
        proc = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                              timeout=timeout_s, env=dict(os.environ, LC_ALL="C"))
    except subprocess.TimeoutExpired:
        return None, ""
    return proc.returncode, proc.stdout.decode("utf-8", "replace")


def probe(timeout_s=TIMEOUT_S, which=shutil.which):
    """What the host's nvidia-smi says: a dict, never an exception.

    ``found``: nvidia-smi is on the PATH. ``driver``: its version string, when it could be
    read; ``cuda``: the banner's CUDA version (None when the banner has none); ``gpus``: the
    GPU names; ``error``: why no driver could be read (then ``read``: what was read).
    """
    exe = which("nvidia-smi")
    out = {"found": exe is not None, "path": exe, "driver": None, "cuda": None, "gpus": [], "error": None,
           "read": None}
    if exe is None:
        return out
    rc, text = _run([exe] + QUERY, timeout_s)
    if rc is None:
        out["error"] = "nvidia-smi did not answer within %g s" % timeout_s
        return out
    if rc != 0:
        out["error"] = "nvidia-smi failed (exit %d)" % rc
        out["read"] = shorten(text)
        return out
    driver, gpus, error = parse_query(text)
    out.update(driver=driver, gpus=gpus, error=error, read=shorten(text) if error else None)
    if driver is None:
        return out
    rc, banner = _run([exe], timeout_s)
    if rc == 0:
        out["cuda"] = parse_cuda(banner)
    return out
