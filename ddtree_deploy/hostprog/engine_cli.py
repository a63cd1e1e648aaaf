"""The container engine's command lines, built purely (stdlib only, Python 3.8+).

Docker and Podman share the CLI used here (``inspect``, ``image inspect``, ``tag``,
``build``, ``stop``, ``rename``, ``create``, ``start``, ``rm``, ``exec``, ``run``, ``logs``,
``compose up``): each function takes plain values and returns an argv list, run by
``container.py`` without a shell, and is tested by exact equality (tests/unit/test_container_cli.py).

``run_config`` reads a container's run configuration from its ``inspect`` document (and its
image's, to leave out what the image itself sets), engine-neutral and JSON-able: what the
journal keeps and what ``create_argv`` turns back into ``create`` options. What is carried:
the command and entrypoint, the environment and labels the container adds to its image's,
mounts (bind, volume, tmpfs), published ports, the network, GPU requests (``--gpus``) and
devices, the restart policy, IPC and PID namespaces, shared memory, user, working folder,
privileges and capabilities, ``--init``, ulimits, extra hosts, security options, memory
and CPU limits. The full inspect document is kept beside it on the host (nothing is lost).
"""

import json
import re

ENGINES = ("docker", "podman")
#: Each engine's "can you run containers now?" question: docker is a client of a daemon,
#: podman of its own storage (and, remotely, a service). Shared with ``image --build``.
PROBES = {"docker": ["version", "--format", "{{.Server.Version}}"], "podman": ["info", "--format", "{{.Host.Arch}}"]}
#: The repository every image the tool tags lives in (never pushed anywhere).
REPO_PREFIX = "localhost/ddtree-deploy/"
ASIDE_SUFFIX = "-ddtree-prev"  # the old container's name while the new one proves itself

# What engines add to a container's environment by themselves (podman: container=podman,
# HOSTNAME, HOME, TERM): never carried, the new container gets its own.
_ENGINE_ENV = ("HOSTNAME", "HOME", "container")
_DEFAULT_NETWORKS = ("", "default")
_PRIVATE_IPC = ("", "private", "shareable")


def repo_for(name):
    """The image repository of the container ``name``: lower case, as image names must be."""
    return REPO_PREFIX + re.sub(r"[^a-z0-9._-]", "-", name.lower()).strip("._-")


def kept_tag(name, image_id):
    """The tag that keeps the image ``name`` ran before the tool changed it (rollback runs it)."""
    return "%s:was-%s" % (repo_for(name), _short(image_id))


def built_tag(name, series_id, run_id):
    return "%s:ddtree-%s-%s" % (repo_for(name), series_id[:12], run_id[:12])


def _short(image_id):
    return str(image_id).split(":", 1)[-1][:12]


def aside_name(name):
    return name + ASIDE_SUFFIX


# --------------------------------------------------------------------- plain commands


def probe_argv(engine_path, engine):
    return [engine_path] + PROBES[engine]


def list_names_argv(engine_path):
    """Every container's name, one line each (a line may hold several, comma-separated)."""
    return [engine_path, "ps", "-a", "--format", "{{.Names}}"]


def inspect_argv(engine_path, what, ref):
    """``what``: "container" or "image"; one JSON array on stdout."""
    return [engine_path, what, "inspect", ref]


def tag_argv(engine_path, image_id, tag):
    return [engine_path, "tag", image_id, tag]


def build_argv(engine_path, folder, tag):
    return [engine_path, "build", "-t", tag, "-f", folder + "/Dockerfile", folder]


def stop_argv(engine_path, name, timeout_s):
    return [engine_path, "stop", "-t", str(int(max(0, timeout_s))), name]


def rename_argv(engine_path, old, new):
    return [engine_path, "rename", old, new]


def start_argv(engine_path, name):
    return [engine_path, "start", name]


def rm_argv(engine_path, name):
    return [engine_path, "rm", "-f", name]


def logs_argv(engine_path, name, lines=20):
    return [engine_path, "logs", "--tail", str(lines), name]


def exec_argv(engine_path, name, python, code, args):
    """``code`` run by ``python`` inside the running container ``name``."""
    return [engine_path, "exec", name, python, "-c", code] + list(args)


def run_probe_argv(engine_path, image, python, code, args):
    """``code`` run by ``python`` in a throwaway container of ``image`` (one that is not
    running cannot be exec'd into): no network, removed at its end."""
    return [engine_path, "run", "--rm", "--network", "none", "--entrypoint", python, image, "-c", code] + list(args)


def compose_up_argv(engine_path, compose_file, override, service):
    """Recreate ``service`` from its compose file with the image overridden (``override``: a
    file of the tool's that names the image): its own configuration, as `compose up -d` makes it."""
    return [engine_path, "compose", "-f", compose_file, "-f", override, "up", "-d", "--no-deps", "--force-recreate",
            service]


def compose_override(service, image):
    """The override file's text: JSON is YAML, and needs no YAML writer."""
    return json.dumps({"services": {service: {"image": image}}}, indent=1) + "\n"


# --------------------------------------------------------------------- the run configuration


def _list(value):
    """An inspect field that is a list, null, or (podman 4's entrypoint) a string joined by spaces."""
    if value is None or value == "":
        return []
    if isinstance(value, str):
        return value.split(" ")
    return [str(v) for v in value]


def run_config(container, image):
    """The run configuration of ``container`` (its inspect document), leaving out what its
    image (``image``: that image's inspect document) sets itself. Pure; JSON-able."""
    cfg = container.get("Config") or {}
    host = container.get("HostConfig") or {}
    icfg = (image or {}).get("Config") or {}
    image_env = set(_list(icfg.get("Env")))
    env = [e for e in _list(cfg.get("Env")) if e not in image_env and e.split("=", 1)[0] not in _ENGINE_ENV
           and e != "TERM=xterm"]
    image_labels = icfg.get("Labels") or {}
    labels = {k: v for k, v in sorted((cfg.get("Labels") or {}).items()) if image_labels.get(k) != v}
    entrypoint = _list(cfg.get("Entrypoint"))
    out = {
        "entrypoint": None if entrypoint == _list(icfg.get("Entrypoint")) else entrypoint,
        "cmd": _list(cfg.get("Cmd")),
        "env": env,
        "labels": labels,
        "mounts": [_mount(m) for m in container.get("Mounts") or ()],
        "ports": _ports(host.get("PortBindings") or {}),
        "publish_all": bool(host.get("PublishAllPorts")),
        "network": None if host.get("NetworkMode") in _DEFAULT_NETWORKS else host.get("NetworkMode"),
        "gpus": _gpus(host.get("DeviceRequests")),
        "devices": [_device(d) for d in host.get("Devices") or ()],
        "restart": _restart(host.get("RestartPolicy") or {}),
        "ipc": None if host.get("IpcMode") in _PRIVATE_IPC else host.get("IpcMode"),
        "pid": host.get("PidMode") if host.get("PidMode") not in ("", "private", None) else None,
        "shm_size": host.get("ShmSize") or None,
        "user": cfg.get("User") if cfg.get("User") and cfg.get("User") != icfg.get("User") else None,
        "workdir": (cfg.get("WorkingDir") if cfg.get("WorkingDir") and cfg.get("WorkingDir") != icfg.get("WorkingDir")
                    and cfg.get("WorkingDir") != "/" else None),
        "privileged": bool(host.get("Privileged")),
        "cap_add": sorted(host.get("CapAdd") or ()),
        "cap_drop": sorted(host.get("CapDrop") or ()),
        "init": bool(host.get("Init")) or (cfg.get("Annotations") or {}).get("io.podman.annotations.init") == "TRUE",
        "ulimits": ["%s=%s:%s" % (u.get("Name"), u.get("Soft"), u.get("Hard")) for u in host.get("Ulimits") or ()],
        "extra_hosts": list(host.get("ExtraHosts") or ()),
        "security_opt": list(host.get("SecurityOpt") or ()),
        "memory": host.get("Memory") or None,
        "nano_cpus": host.get("NanoCpus") or None,
    }
    return out


def _mount(m):
    kind = m.get("Type") or "bind"
    source = m.get("Name") if kind == "volume" else m.get("Source")
    return {"type": kind, "source": source, "destination": m.get("Destination"), "ro": m.get("RW") is False,
            "propagation": m.get("Propagation") if m.get("Propagation") not in ("", "rprivate", None) else None}


def _ports(bindings):
    out = []
    for port in sorted(bindings):
        for b in bindings[port] or ({},):
            out.append({"container": port, "host_ip": b.get("HostIp") or "", "host_port": b.get("HostPort") or ""})
    return out


def _gpus(requests):
    """Docker's ``--gpus`` from its DeviceRequests (None: none asked)."""
    for r in requests or ():
        caps = [c for group in r.get("Capabilities") or () for c in group]
        if "gpu" not in caps:
            continue
        if r.get("DeviceIDs"):
            return "device=" + ",".join(r["DeviceIDs"])
        return "all" if r.get("Count") in (-1, None) else str(r.get("Count"))
    return None


def _device(d):
    return {"host": d.get("PathOnHost"), "container": d.get("PathInContainer"),
            "permissions": d.get("CgroupPermissions") or ""}


def _restart(policy):
    name = policy.get("Name") or ""
    if name in ("", "no"):
        return None
    retries = policy.get("MaximumRetryCount") or 0
    return "%s:%d" % (name, retries) if name == "on-failure" and retries else name


def _publish(p):
    """``--publish``: [IP:][HOSTPORT:]PORT/PROTO, as the binding was."""
    if p["host_ip"]:
        return "%s:%s:%s" % (p["host_ip"], p["host_port"], p["container"])
    return "%s:%s" % (p["host_port"], p["container"]) if p["host_port"] else p["container"]


def _device_spec(d):
    """``--device``: HOST[:CONTAINER[:PERMISSIONS]] (a CDI name such as nvidia.com/gpu=all alone)."""
    if not d.get("container") or (d["container"] == d["host"] and not d.get("permissions")):
        return d["host"]
    return "%s:%s%s" % (d["host"], d["container"], ":" + d["permissions"] if d.get("permissions") else "")


def create_argv(engine_path, name, image, config):
    """``create`` for a container named ``name`` of ``image`` with ``config`` (``run_config``'s)."""
    argv = [engine_path, "create", "--name", name]
    for e in config.get("env") or ():
        argv += ["--env", e]
    for k, v in sorted((config.get("labels") or {}).items()):
        argv += ["--label", "%s=%s" % (k, v)]
    for m in config.get("mounts") or ():
        if m["type"] == "tmpfs":
            argv += ["--tmpfs", m["destination"]]
            continue
        opts = ["ro"] if m.get("ro") else []
        if m.get("propagation"):
            opts.append(m["propagation"])
        argv += ["--volume", "%s:%s%s" % (m["source"], m["destination"], ":" + ",".join(opts) if opts else "")]
    for p in config.get("ports") or ():
        argv += ["--publish", _publish(p)]
    if config.get("publish_all"):
        argv.append("--publish-all")
    if config.get("network"):
        argv += ["--network", config["network"]]
    if config.get("gpus"):
        argv += ["--gpus", config["gpus"]]
    for d in config.get("devices") or ():
        argv += ["--device", _device_spec(d)]
    if config.get("restart"):
        argv += ["--restart", config["restart"]]
    if config.get("ipc"):
        argv += ["--ipc", config["ipc"]]
    elif config.get("shm_size"):  # an IPC namespace of the host's (or another's) has no shm size of its own
        argv += ["--shm-size", str(config["shm_size"])]
    if config.get("pid"):
        argv += ["--pid", config["pid"]]
    if config.get("user"):
        argv += ["--user", config["user"]]
    if config.get("workdir"):
        argv += ["--workdir", config["workdir"]]
    if config.get("privileged"):
        argv.append("--privileged")
    for c in config.get("cap_add") or ():
        argv += ["--cap-add", c]
    for c in config.get("cap_drop") or ():
        argv += ["--cap-drop", c]
    if config.get("init"):
        argv.append("--init")
    for u in config.get("ulimits") or ():
        argv += ["--ulimit", u]
    for h in config.get("extra_hosts") or ():
        argv += ["--add-host", h]
    for s in config.get("security_opt") or ():
        argv += ["--security-opt", s]
    if config.get("memory"):
        argv += ["--memory", str(config["memory"])]
    if config.get("nano_cpus"):
        argv += ["--cpus", "%g" % (config["nano_cpus"] / 1e9)]
    cmd = list(config.get("cmd") or ())
    entrypoint = config.get("entrypoint")
    if entrypoint is not None:
        # One word for --entrypoint (docker takes no list), the rest before the command.
        argv += ["--entrypoint", entrypoint[0] if entrypoint else ""]
        cmd = list(entrypoint[1:]) + cmd
    return argv + [image] + cmd


__all__ = ["ASIDE_SUFFIX", "ENGINES", "PROBES", "REPO_PREFIX", "aside_name", "build_argv", "built_tag",
           "compose_override", "compose_up_argv", "create_argv", "exec_argv", "inspect_argv", "kept_tag",
           "list_names_argv", "logs_argv", "probe_argv", "rename_argv", "repo_for", "rm_argv", "run_config",
           "run_probe_argv", "start_argv", "stop_argv", "tag_argv"]
