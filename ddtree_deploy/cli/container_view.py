"""`status` of a ``[container]`` host: its block (fleets/container_gate.py's document). Every
value comes from the host (the engine's inspect, the journal, the lock): ``say`` prints it inert."""

from __future__ import annotations

from ddtree_deploy.cli.app import say


def _short(image_id) -> str:
    return str(image_id or "?").split(":", 1)[-1][:12]


def print_container_status(doc: dict) -> None:
    c = doc.get("container")
    image = doc.get("image") or {}
    say(f"{doc['host']}: {doc['engine']} container "
        + (f"{c['name']} ({_short(c['id'])}): {c['status']}, started {c['started']}" if c else "(none)"))
    if c:
        tags = ", ".join(image.get("tags") or ()) or "no tag"
        say(f"  image: {_short(c['image'])} ({tags}) digest {image.get('digest') or '?'}")
    if doc.get("sglang_version"):
        say(f"  sglang {doc['sglang_version']} at {doc['package_root']} (inside the container)")
    carried = doc.get("image_series")
    if carried:
        say(f"  image labels: series {carried['name']} ({_short(carried['id'])})")
    driver = doc.get("driver")
    if driver:  # the HOST's driver, and whether it runs the CUDA of the container's image
        say(f"  {driver['line']}")
    say(f"  phase: {doc['phase']}: {doc['explanation']}")
    journal = doc.get("journal") or {}
    if journal.get("previous"):
        prev = journal["previous"]
        say(f"  kept image: {prev.get('tag') or '-'} ({_short(prev.get('id'))}): what rollback runs")
    for f in doc.get("files") or ():
        say(f"  {f['state']:<9} {f['path']}  {(f['sha256'] or 'absent')[:12]}")
    aside = doc.get("aside")
    if aside:
        say(f"  kept aside: container {aside['name']} ({_short(aside['id'])}, image {_short(aside['image'])}, "
            f"{aside['status']})")
    health = doc.get("health")
    if health:
        say(f"  health {health['url']}: {health['status'] if health['status'] is not None else 'no answer'}")
    from ddtree_deploy.cli.deploy_cmd import print_lock

    print_lock(doc.get("lock"))


__all__ = ["print_container_status"]
