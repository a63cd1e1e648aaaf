"""`ddtree-deploy image`: write (and optionally build) a container build context that applies
the series inside the image with the toolkit's own host agent (see ddtree_deploy/interop/image.py)."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from ddtree_deploy.cli.app import app, emit_json, err, handles_errors, say
from ddtree_deploy.cli.options import inventory_option
from ddtree_deploy.cli.text import safe


@app.command("image")
@handles_errors
def image(
    base: str = typer.Option(..., "--base", help="base image, e.g. lmsysorg/sglang:v0.5.12.post1"),
    release: str = typer.Option(..., "--release", help="the SGLang release in the base image (its pristine "
                                "files are what the series is checked against)"),
    family: Optional[str] = typer.Option(None, "--family", help="family folder or name (default: the one "
                                         "covering --release)"),
    out_dir: Path = typer.Option(..., "--out", help="folder for the build context (new or empty)"),
    tag: Optional[str] = typer.Option(None, "--tag", "-t", help="image tag for --build"),
    build: bool = typer.Option(False, "--build", help="build it with docker, podman or buildah (the first "
                               "found that can build); exit 3 when none can (none installed, or docker's "
                               "daemon down)"),
    python: str = typer.Option("python3", "--python", help="the image's interpreter that imports sglang"),
    state_dir: str = typer.Option("/var/lib/ddtree-deploy", "--state-dir", help="the agent's state folder in "
                                  "the image (journal, backup of the original files)"),
    force: bool = typer.Option(False, "--force", help="replace the content of a non-empty --out folder"),
    push_to: Optional[str] = typer.Option(None, "--push-to", help="with --build --tag: tag the built image as "
                                          "this registry reference and push it there (a registry you are "
                                          "logged in to; a [container] host needs none: push builds there)"),
    k8s: Optional[Path] = typer.Option(None, "--k8s", help="with --tag: a Deployment or LeaderWorkerSet "
                                       "manifest, rendered into DIR/k8s.yaml with the tag as the SGLang "
                                       "container's image, the series labels and a readiness probe on "
                                       "/health_generate, validated against the Kubernetes API schemas (the "
                                       "k8s extra)"),
    host: Optional[List[str]] = typer.Option(None, "--host", "-H", help="a host the image is for: its NVIDIA "
                                             "driver (nvidia-smi, over SSH) must run the base's CUDA; repeatable"),
    group: Optional[List[str]] = typer.Option(None, "--group", "-g", help="the hosts of an inventory group, as "
                                              "--host"),
    inventory: Optional[Path] = inventory_option(),
    force_driver: bool = typer.Option(False, "--force-driver", help="write it even where a --host's driver "
                                      "cannot run the base's CUDA (refused without it, before anything is "
                                      "written)"),
    trust_new_host: bool = typer.Option(False, "--trust-new-host", help="record an unknown host key in "
                                        "known_hosts"),
    json_output: bool = typer.Option(False, "--json", help="print one JSON document on stdout"),
) -> None:
    """Write a Dockerfile build context FROM --base that applies the series inside the image."""
    from ddtree_deploy.interop import image as img

    drivers = _target_drivers(host or [], group or [], trust_new_host)
    for line in img.check_base_for_drivers(base, release, drivers, force=force_driver):
        err.print(f"[yellow]{safe(line)}[/]", highlight=False)

    img.check_push_to(push_to, build, tag)
    if k8s is not None and not (tag or push_to):
        from ddtree_deploy.base.errors import BadInput

        raise BadInput(f"--k8s {k8s}: needs --tag (or --push-to): the image reference the cluster pulls")
    manifest = None
    if k8s is not None:  # read and checked before anything is written
        from ddtree_deploy.interop import k8s as kube

        manifest = kube.load(k8s)
        kube.validate(manifest, k8s, "the manifest")
    ctx = img.write_context(base, release, out_dir, family=family, state_dir=state_dir, python=python,
                            force=force)
    rendered = None
    if manifest is not None:
        rendered = kube.render_file(k8s, out_dir / "k8s.yaml", base=base, image=push_to or tag,
                                    series=ctx.series, series_id=ctx.series_id)
        err.print(f"[dim]{safe(rendered['kind'])} {safe(str(rendered['name']))}: {safe(rendered['path'])} (valid "
                  f"against Kubernetes {rendered['kubernetes']})[/]", highlight=False)
    err.print(f"[dim]{safe(ctx.series)} ({ctx.series_id[:12]}) for SGLang {safe(ctx.sglang_version)}: "
              f"{len(ctx.files)} file(s); build context {safe(str(ctx.folder))}[/]", highlight=False)
    argv = img.build(ctx, tag, push_to) if build else None
    if json_output:
        emit_json({"context": str(ctx.folder), "dockerfile": str(ctx.dockerfile), "series": ctx.series,
                   "series_id": ctx.series_id, "sglang_version": ctx.sglang_version, "labels": ctx.labels,
                   "files": list(ctx.files), "built": argv is not None, "build_command": argv, "tag": tag,
                   "pushed_to": push_to if argv is not None else None, "k8s": rendered,
                   "drivers": {name: (d.version if d is not None and d.readable else None)
                               for name, d in drivers.items()}})
        return
    say(str(ctx.dockerfile))
    if rendered is not None:
        say(rendered["path"])
    if argv is None:
        err.print(f"[dim]build it: docker build -t {safe(tag or 'IMAGE')} {safe(str(ctx.folder))}[/]",
                  highlight=False)


def _target_drivers(host: List[str], group: List[str], trust_new_host: bool) -> dict:
    """host name -> its NVIDIA driver (cuda_lanes.Driver), read over SSH; {} without --host/--group."""
    if not host and not group:
        return {}
    from ddtree_deploy.fleets.rollout import select_hosts
    from ddtree_deploy.remote.transport import transport_for
    from ddtree_deploy.session.driver_gate import read_driver

    hosts = select_hosts(host, group)
    return {h.name: read_driver(h, transport_for(h, trust_new_host=trust_new_host)) for h in hosts}


__all__ = ["image"]
