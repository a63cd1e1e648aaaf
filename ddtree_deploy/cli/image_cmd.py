"""`ddtree-deploy image`: write (and optionally build) a container build context that applies
the series inside the image with the toolkit's own host agent (see ddtree_deploy/interop/image.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from ddtree_deploy.cli.app import app, emit_json, err, handles_errors, say
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
    json_output: bool = typer.Option(False, "--json", help="print one JSON document on stdout"),
) -> None:
    """Write a Dockerfile build context FROM --base that applies the series inside the image."""
    from ddtree_deploy.interop import image as img

    ctx = img.write_context(base, release, out_dir, family=family, state_dir=state_dir, python=python,
                            force=force)
    err.print(f"[dim]{safe(ctx.series)} ({ctx.series_id[:12]}) for SGLang {safe(ctx.sglang_version)}: "
              f"{len(ctx.files)} file(s); build context {safe(str(ctx.folder))}[/]", highlight=False)
    argv = img.build(ctx, tag) if build else None
    if json_output:
        emit_json({"context": str(ctx.folder), "dockerfile": str(ctx.dockerfile), "series": ctx.series,
                   "series_id": ctx.series_id, "sglang_version": ctx.sglang_version, "labels": ctx.labels,
                   "files": list(ctx.files), "built": argv is not None, "build_command": argv, "tag": tag})
        return
    say(str(ctx.dockerfile))
    if argv is None:
        err.print(f"[dim]build it: docker build -t {safe(tag or 'IMAGE')} {safe(str(ctx.folder))}[/]",
                  highlight=False)


__all__ = ["image"]
