"""``image --k8s MANIFEST``: the user's Kubernetes manifest with the patched image, validated.

No cluster runs here, so the path from ``image`` to a cluster is output that is checked, not
commands that are run: the manifest (a ``Deployment``, apps/v1, or a ``LeaderWorkerSet``,
leaderworkerset.x-k8s.io/v1, SGLang's multi-node route) with

- the SGLang container's image replaced by the image ``image`` builds (``--tag``): the
  container whose image is ``--base``, else the only container of the pod template;
- the series' labels added to the object and its pod template(s) (a pod template that
  changes is what makes ``kubectl rollout`` replace the pods) and the full series sha256
  as an annotation (a label value holds 63 characters);
- a readiness probe on ``/health_generate`` at the server's port (its ``--port`` argument,
  else its first container port, else 30000): a pod joins the Service only once SGLang
  generates, the gate ``rollout status`` waits on (the leader's, for a LeaderWorkerSet).

The result is validated against the Kubernetes API schemas packaged by ``kubernetes-validate``
(strict: an unknown field is an error). A LeaderWorkerSet is a custom resource whose schema
that package does not carry: its pod templates are validated as ``PodTemplate``s and its own
fields (``leaderWorkerTemplate``, ``size``) checked here. A manifest that is not YAML, of
another kind, without the SGLang container, or invalid before or after: one line, exit 2.
"""

from __future__ import annotations

import copy
from pathlib import Path

from ddtree_deploy.base.errors import BadInput
from ddtree_deploy.base.fsutil import read_regular

HEALTH_PATH = "/health_generate"
DEFAULT_PORT = 30000
MAX_MANIFEST_BYTES = 1 << 20
KINDS = {("apps/v1", "Deployment"), ("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet")}
LABEL_SERIES = "io.ddtree-deploy/series"
LABEL_SERIES_ID = "io.ddtree-deploy/series-id"
ANNOTATION_SHA = "io.ddtree-deploy/series-sha256"
# The readiness probe's timing: SGLang loads a model for minutes (the startup), then a
# /health_generate answers within seconds once ready.
PROBE = {"periodSeconds": 10, "timeoutSeconds": 10, "failureThreshold": 3, "initialDelaySeconds": 30}


def _yaml():
    try:
        import yaml  # PyYAML, a dependency of kubernetes-validate (the `k8s` extra)
        import kubernetes_validate
    except ImportError:
        raise BadInput("--k8s needs the k8s extra (kubernetes-validate and PyYAML)",
                       hint="pip install 'ddtree-deploy[k8s]'") from None
    return yaml, kubernetes_validate


def load(path: Path) -> dict:
    """The manifest's one object (the first of several documents that is a Deployment or an LWS)."""
    yaml, _ = _yaml()
    try:
        text = read_regular(path, MAX_MANIFEST_BYTES).decode("utf-8", "replace")
    except OSError as exc:  # NotARegularFile (a folder, a device, too large) says why; ENOENT likewise
        raise BadInput(f"--k8s {path}: {getattr(exc, 'strerror', None) or exc}", hint="give the manifest file") \
            from None
    try:
        docs = [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.YAMLError as exc:
        where = getattr(exc, "problem_mark", None)
        at = f"line {where.line + 1}: " if where is not None else ""
        raise BadInput(f"{path}: {at}not valid YAML: {getattr(exc, 'problem', None) or exc}; fix the file") from None
    objects = [d for d in docs if isinstance(d, dict)]
    for d in objects:
        if (d.get("apiVersion"), d.get("kind")) in KINDS:
            return d
    found = ", ".join(f"{d.get('kind')} ({d.get('apiVersion')})" for d in objects) or "no object"
    raise BadInput(f"{path}: holds {found}: --k8s renders a Deployment (apps/v1) or a LeaderWorkerSet "
                   "(leaderworkerset.x-k8s.io/v1)", hint="give the manifest of the workload that runs SGLang")


def _templates(obj: dict, path: Path) -> list[tuple[str, dict]]:
    """(where, pod template spec) of the object: the Deployment's, or the LWS's leader and worker."""
    spec = obj.get("spec")
    if not isinstance(spec, dict):
        raise BadInput(f"{path}: {obj.get('kind')} has no spec")
    if obj["kind"] == "Deployment":
        t = spec.get("template")
        if not isinstance(t, dict):
            raise BadInput(f"{path}: spec.template: missing; a Deployment needs its pod template")
        return [("spec.template", t)]
    lwt = spec.get("leaderWorkerTemplate")
    if not isinstance(lwt, dict) or not isinstance(lwt.get("workerTemplate"), dict):
        raise BadInput(f"{path}: spec.leaderWorkerTemplate.workerTemplate: missing; a LeaderWorkerSet needs it")
    size = lwt.get("size", 1)
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise BadInput(f"{path}: spec.leaderWorkerTemplate.size: {size!r} is not a positive integer")
    out = []
    if isinstance(lwt.get("leaderTemplate"), dict):
        out.append(("spec.leaderWorkerTemplate.leaderTemplate", lwt["leaderTemplate"]))
    out.append(("spec.leaderWorkerTemplate.workerTemplate", lwt["workerTemplate"]))
    return out


def _sglang_container(where: str, template: dict, base: str, path: Path) -> dict:
    containers = ((template.get("spec") or {}).get("containers")) or []
    if not isinstance(containers, list) or not containers:
        raise BadInput(f"{path}: {where}.spec.containers: none; the pod template runs no container")
    matching = [c for c in containers if isinstance(c, dict) and c.get("image") == base]
    if len(matching) == 1:
        return matching[0]
    if len(containers) == 1 and isinstance(containers[0], dict):
        return containers[0]
    names = ", ".join(f"{c.get('name')} ({c.get('image')})" for c in containers if isinstance(c, dict))
    raise BadInput(f"{path}: {where}: no single container runs {base}: {names}",
                   hint="give --base the image of the container that runs SGLang")


def _port(container: dict) -> int:
    words = [str(w) for w in (container.get("command") or []) + (container.get("args") or [])]
    for i, w in enumerate(words):
        if w == "--port" and i + 1 < len(words) and words[i + 1].isdigit():
            return int(words[i + 1])
        if w.startswith("--port=") and w[7:].isdigit():
            return int(w[7:])
    for p in container.get("ports") or ():
        if isinstance(p, dict) and isinstance(p.get("containerPort"), int):
            return p["containerPort"]
    return DEFAULT_PORT


def render(obj: dict, path: Path, *, base: str, image: str, series: str, series_id: str) -> dict:
    """The changed object (``obj`` is left as it was)."""
    out = copy.deepcopy(obj)
    labels = {LABEL_SERIES: series, LABEL_SERIES_ID: series_id[:12]}
    for meta in [out.setdefault("metadata", {})]:
        meta.setdefault("labels", {}).update(labels)
        meta.setdefault("annotations", {})[ANNOTATION_SHA] = series_id
    templates = _templates(out, path)
    for n, (where, template) in enumerate(templates):
        meta = template.setdefault("metadata", {})
        meta.setdefault("labels", {}).update(labels)
        meta.setdefault("annotations", {})[ANNOTATION_SHA] = series_id
        container = _sglang_container(where, template, base, path)
        container["image"] = image
        if n == 0:  # the leader (or the Deployment's pods) serves HTTP
            container["readinessProbe"] = {"httpGet": {"path": HEALTH_PATH, "port": _port(container)}, **PROBE}
    return out


def validate(obj: dict, path: Path, what: str) -> str:
    """Validate against the packaged Kubernetes schemas (strict); the Kubernetes version used."""
    _, kv = _yaml()
    version = kv.latest_version()
    if obj["kind"] == "Deployment":
        checks = [(what, obj)]
    else:  # a custom resource: its pod templates as PodTemplates (their schema is Kubernetes' own)
        checks = [(f"{what} {where}", {"apiVersion": "v1", "kind": "PodTemplate",
                                       "metadata": {"name": (obj.get("metadata") or {}).get("name") or "lws"},
                                       "template": t}) for where, t in _templates(obj, path)]
    for label, doc in checks:
        try:
            kv.validate(doc, version, strict=True)
        except kv.ValidationError as exc:
            at = ".".join(str(p) for p in exc.absolute_path) or "(top)"
            raise BadInput(f"{path}: {label} is not valid against the Kubernetes {version} API schema: {at}: "
                           f"{exc.message}", hint="fix the manifest; nothing was written") from None
    return version


def render_file(path: Path, out: Path, *, base: str, image: str, series: str, series_id: str) -> dict:
    """Read, check, render, check again, write ``out``: {path, kind, name, image, kubernetes}."""
    yaml, _ = _yaml()
    obj = load(path)
    validate(obj, path, "the manifest")
    changed = render(obj, path, base=base, image=image, series=series, series_id=series_id)
    version = validate(changed, path, "the rendered manifest")
    out.write_text(f"# Rendered by ddtree-deploy image from {path.name}: image {image}, DDTree series {series} "
                   f"({series_id[:12]}), readiness on {HEALTH_PATH}; valid against Kubernetes {version}\n"
                   + yaml.safe_dump(changed, sort_keys=False))
    return {"path": str(out), "kind": obj["kind"], "name": (obj.get("metadata") or {}).get("name"), "image": image,
            "kubernetes": version}


__all__ = ["HEALTH_PATH", "load", "render", "render_file", "validate"]
