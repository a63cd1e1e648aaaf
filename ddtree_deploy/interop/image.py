"""`ddtree-deploy image`: a container build context that applies the series inside the image.

The context (``--out DIR``: Dockerfile, ``ddtree/`` with the in-image client, the host agent,
the plan modules, the apply request, the series; labels.json) is containers/image_context.py's,
made in memory (a ``[container]`` host's push builds the same one on its host) and written here:
the patched bytes are ``push``'s, checked against the release's pristine files from the
verified wheel. ``build`` (and ``push`` for ``--push-to``) are the only functions that run a
container tool; ``--k8s`` is k8s.py's.
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from packaging.version import Version

from ddtree_deploy.base.codes import Code
from ddtree_deploy.base.errors import BadInput, DeployError
from ddtree_deploy.base.fsutil import require_writable_folder
from ddtree_deploy.containers.image_context import DEFAULT_STATE_DIR, context_files
from ddtree_deploy.hostprog.engine_cli import PROBES
from ddtree_deploy.release.cuda_lanes import cuda_of_image

BUILDERS = ("docker", "podman", "buildah")  # tried in this order by --build
#: Exit code of `image --build` when no container builder can build here (the context is
#: written): none installed, or docker installed without a daemon that answers.
EXIT_NO_BUILDER = 3
PROBE_S = 30.0


@dataclass(frozen=True)
class Context:
    folder: Path
    dockerfile: Path
    series: str
    series_id: str
    sglang_version: str
    labels: dict[str, str]
    files: tuple[str, ...]


def write_context(base: str, release: str, out: Path, *, family: str | None = None,
                  state_dir: str = DEFAULT_STATE_DIR, python: str = "python3", force: bool = False) -> Context:
    """Check the series against ``release`` and write the build context into ``out``."""
    from ddtree_deploy.engine.series import choose_series, require_finished
    from ddtree_deploy.session.desired import desired_for
    from ddtree_deploy.settings.inventory import state_dir_problem

    if not base or any(c.isspace() for c in base):
        raise BadInput(f"--base {base!r}: an image reference without spaces, e.g. lmsysorg/sglang:v{release}")
    if not state_dir.startswith("/") or state_dir_problem(state_dir):
        raise BadInput(f"--state-dir {state_dir!r}: an absolute path, e.g. {DEFAULT_STATE_DIR}")
    if not python or any(c.isspace() or c in "\"'$`\\" for c in python):
        raise BadInput(f"--python {python!r}: the image's interpreter as one word, e.g. python3")
    if out.exists() and (not out.is_dir() or (any(out.iterdir()) and not force)):
        raise BadInput(f"--out {out}: exists and is not an empty folder; nothing was written",
                       hint="choose a new folder, or pass --force to replace an earlier build context")
    if force and out.is_dir() and any(out.iterdir()) and not (out / "ddtree" / "series.json").is_file():
        # --force replaces what this command wrote before, never an arbitrary folder.
        raise BadInput(f"--out {out}: not a build context written by `ddtree-deploy image` (no ddtree/series.json); "
                       "--force does not delete it; nothing was written", hint="choose a new folder")
    require_writable_folder(out, "--out")
    series = choose_series(release, family)
    require_finished(series, "image")  # an image deploys the series: never an unfinished port
    facts = {"sglang_version": release, "files": {}, "package_root": f"<sglang {release} release>"}
    desired = desired_for(series, "image", facts, forced=bool(family))
    files, labels = context_files(series, desired, base, state_dir=state_dir, python=python)

    if out.exists():
        shutil.rmtree(out)
    for rel, data in files.items():
        (out / rel).parent.mkdir(parents=True, exist_ok=True)
        (out / rel).write_bytes(data)
    return Context(out, out / "Dockerfile", desired.series, desired.series_id, release, labels,
                   tuple(t.path for t in desired.targets))


def check_base_for_drivers(base: str, release: str, drivers: dict, *, force: bool = False) -> list[str]:
    """Whether every target host's driver (name -> cuda_lanes.Driver) runs the base image's CUDA
    (its tag's ``cuNNN``, else the release's lane). BadInput (exit 2, before anything is
    written) naming the hosts that cannot, unless ``force``; the warning lines to print (a
    host without nvidia-smi, a refusal forced past)."""
    from ddtree_deploy.engine.series import families
    from ddtree_deploy.release.cuda_lanes import DRIVER_FLOOR, floor_text, newest_covered

    cuda, source = cuda_of_image(base, release)
    if not cuda or not drivers:
        return []
    major = int(cuda.split(".")[0])
    warnings = [f"{name}: no NVIDIA driver found (no nvidia-smi on the host): --base not checked against it"
                for name, d in drivers.items() if d is not None and not d.found]
    cannot = {name: d for name, d in drivers.items() if d is not None and d.found and
              (not d.readable or (major in DRIVER_FLOOR and not d.runs_major(major)))}
    if not cannot:
        return warnings
    said = "; ".join(f"{name}'s driver {d.version} supports CUDA {d.cuda}" if d.readable
                     else f"{name}: {d.error}" for name, d in cannot.items())
    floor = f" (driver {floor_text(major)})" if major in DRIVER_FLOOR else ""
    line = (f"--base {base} needs CUDA {cuda}{floor}, from its {'tag' if source == 'tag' else 'release lane'}: "
            f"{said}")
    if force:
        return [*warnings, f"{line}; writing it anyway (--force-driver)"]
    # The newest release every refused host runs and a family covers (their oldest driver's).
    newest = [newest_covered(d, families()) for d in cannot.values() if d.readable]
    where = ""
    if newest and None in newest:
        where = "; no release DDTree covers runs on every one of those hosts"
    elif newest:
        where = f"; the newest release DDTree covers on those hosts is {min(newest, key=Version)}"
    raise BadInput(f"{line}{where}; nothing was written", code=Code.DRIVER_TOO_OLD,
                   hint="choose a base those drivers run (a -cu129 tag for CUDA 12: SGLang up to 0.5.19), upgrade "
                        "the hosts' NVIDIA drivers, or write it anyway with --force-driver")


def find_builder(which=shutil.which) -> tuple[str, str] | None:
    for name in BUILDERS:
        path = which(name)
        if path:
            return name, path
    return None


def build_argv(builder: tuple[str, str], folder: Path, tag: str | None) -> list[str]:
    name, path = builder
    tagging = ["-t", tag] if tag else []
    if name == "buildah":
        return [path, "build", *tagging, "-f", str(folder / "Dockerfile"), str(folder)]
    return [path, "build", *tagging, str(folder)]


def builder_problem(builder: tuple[str, str]) -> str | None:
    """Why ``builder`` cannot build now (its daemon does not answer: its own last line), else None."""
    name, path = builder
    probe = PROBES.get(name)
    if probe is None:
        return None
    try:
        proc = subprocess.run([path, *probe], capture_output=True, text=True, timeout=PROBE_S)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"{name} {' '.join(probe[:1])} did not answer ({exc})"
    if proc.returncode == 0:
        return None
    said = (proc.stderr.strip() or proc.stdout.strip() or f"exit {proc.returncode}").splitlines()[-1]
    return f"{name} is installed ({path}) but cannot build: {said[:300]}"


def build(ctx: Context, tag: str | None, push_to: str | None = None) -> list[str]:
    """Run the first container builder found that can build now; DeployError (exit 3) when
    none is installed or none can (docker without its daemon), or when the build fails."""
    problems = []
    builder = None
    for name in BUILDERS:
        path = shutil.which(name)
        if path is None:
            continue
        problem = builder_problem((name, path))
        if problem is None:
            builder = (name, path)
            break
        problems.append(problem)
    if builder is None:
        why = "; ".join(problems) or f"no container builder found on PATH ({', '.join(BUILDERS)})"
        err = DeployError(f"{why}; the build context is written at {ctx.folder}", code=Code.NO_BUILDER,
                          hint=("start the builder's daemon (e.g. `sudo systemctl start docker`) and rerun, or "
                                if problems else "") + f"build it where one is: docker build -t {tag or 'IMAGE'} "
                          f"{ctx.folder}", exit_code=EXIT_NO_BUILDER)
        raise err
    argv = build_argv(builder, ctx.folder, tag)
    proc = subprocess.run(argv)
    if proc.returncode != 0:
        raise DeployError(f"{builder[0]} build failed (exit {proc.returncode}); its output is above",
                          code=Code.BUILD_FAILED,
                          hint="a drifted or different sglang in the base image is named by the "
                          "'ddtree-deploy image: error:' line of the RUN step")
    if push_to:
        push(builder, tag, push_to)
    return argv


def push_argvs(builder: tuple[str, str], tag: str, ref: str) -> list[list[str]]:
    """``--push-to REF``: the built image tagged REF, then pushed there by the same builder."""
    _name, path = builder
    return [[path, "tag", tag, ref], [path, "push", ref]]


def push(builder: tuple[str, str], tag: str, ref: str) -> None:
    for argv in push_argvs(builder, tag, ref):
        proc = subprocess.run(argv, capture_output=True, text=True)
        if proc.returncode != 0:
            said = (proc.stderr.strip() or proc.stdout.strip() or f"exit {proc.returncode}").splitlines()[-1]
            raise DeployError(f"{builder[0]} {argv[1]} {ref} failed: {said[:300]}; the image is built here as {tag}",
                              code=Code.BUILD_FAILED, hint="log in to the registry (`docker login HOST`) and push "
                              f"it: {builder[0]} push {ref}")


def check_push_to(ref: str | None, build_asked: bool, tag: str | None) -> None:
    """``--push-to`` is a registry reference, and only with ``--build --tag`` (bad input before anything)."""
    if ref is None:
        return
    if not build_asked or not tag:
        raise BadInput(f"--push-to {ref}: needs --build and --tag (the image built here is pushed there)",
                       hint="without a registry, a [container] host builds the image on the host itself: "
                       "push --host HOST")
    if "/" not in ref or any(c.isspace() for c in ref) or ref.startswith(("/", "-")):
        raise BadInput(f"--push-to {ref!r}: a registry image reference, e.g. registry.example.org/team/sglang:tag")

