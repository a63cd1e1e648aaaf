"""The engine's command lines for a ``[container]`` host (hostprog/engine_cli.py), by exact
equality: the run configuration read from ``inspect`` (docker's and podman 4's shapes) and
the ``create`` that makes its twin with another image, plus the plain commands."""

from __future__ import annotations

from ddtree_deploy.hostprog import engine_cli as cli

# Docker's inspect of `docker run -d --name sglang --gpus all --ipc host --shm-size 32g -p 30000:30000
# -v /models:/models:ro -e HF_TOKEN=x --restart unless-stopped lmsysorg/sglang:v0.5.12.post1
# python3 -m sglang.launch_server --model-path /models/m --port 30000` (the fields read).
DOCKER = {
    "Id": "c" * 64, "Image": "sha256:" + "a" * 64,
    "Config": {"Env": ["HF_TOKEN=x", "PATH=/usr/bin", "CUDA_VERSION=12.9"],
               "Cmd": ["python3", "-m", "sglang.launch_server", "--model-path", "/models/m", "--port", "30000"],
               "Entrypoint": ["/opt/nvidia/nvidia_entrypoint.sh"], "Labels": {"maintainer": "sgl", "team": "infer"},
               "User": "", "WorkingDir": "/sgl-workspace"},
    "HostConfig": {"NetworkMode": "default", "PortBindings": {"30000/tcp": [{"HostIp": "", "HostPort": "30000"}]},
                   "RestartPolicy": {"Name": "unless-stopped", "MaximumRetryCount": 0}, "IpcMode": "host",
                   "ShmSize": 34359738368, "PidMode": "", "Privileged": False, "CapAdd": None, "CapDrop": None,
                   "Init": None, "Ulimits": [{"Name": "memlock", "Soft": -1, "Hard": -1}], "ExtraHosts": None,
                   "SecurityOpt": None, "Memory": 0, "NanoCpus": 0, "Devices": [],
                   "DeviceRequests": [{"Driver": "", "Count": -1, "DeviceIDs": None, "Capabilities": [["gpu"]]}]},
    "Mounts": [{"Type": "bind", "Source": "/models", "Destination": "/models", "Mode": "ro", "RW": False,
                "Propagation": "rprivate"}],
}
DOCKER_IMAGE = {"Config": {"Env": ["PATH=/usr/bin", "CUDA_VERSION=12.9"], "Labels": {"maintainer": "sgl"},
                           "Entrypoint": ["/opt/nvidia/nvidia_entrypoint.sh"], "WorkingDir": "/sgl-workspace"}}

# Podman 4.3's inspect (its shapes: the entrypoint a string, the engine's own env, an init
# annotation, a device, a named volume, a port on one address).
PODMAN = {
    "Id": "d" * 64, "Image": "e" * 64,
    "Config": {"Env": ["PATH=/usr/bin", "TERM=xterm", "container=podman", "HOSTNAME=box", "HOME=/root", "A=b"],
               "Cmd": ["-m", "http.server"], "Entrypoint": "python3 -u", "Labels": {"io.buildah.version": "1.28.2"},
               "Annotations": {"io.podman.annotations.init": "TRUE"}, "WorkingDir": "/"},
    "HostConfig": {"NetworkMode": "bridge", "PortBindings": {"8000/tcp": [{"HostIp": "127.0.0.1",
                                                                            "HostPort": "18600"}]},
                   "RestartPolicy": {"Name": "on-failure", "MaximumRetryCount": 3}, "IpcMode": "shareable",
                   "ShmSize": 65536000, "CapAdd": ["SYS_PTRACE"], "Devices": [{"PathOnHost": "/dev/fuse",
                                                                               "PathInContainer": "/dev/fuse",
                                                                               "CgroupPermissions": "rwm"}]},
    "Mounts": [{"Type": "volume", "Name": "hf-cache", "Source": "/var/lib/containers/storage/volumes/hf-cache/_data",
                "Destination": "/root/.cache", "RW": True, "Propagation": ""}],
}
PODMAN_IMAGE = {"Config": {"Env": ["PATH=/usr/bin"], "Labels": {"io.buildah.version": "1.28.2"}}}


def test_docker_run_configuration_and_its_twin():
    config = cli.run_config(DOCKER, DOCKER_IMAGE)
    assert cli.create_argv("/usr/bin/docker", "sglang", "sha256:" + "b" * 64, config) == [
        "/usr/bin/docker", "create", "--name", "sglang",
        "--env", "HF_TOKEN=x",
        "--label", "team=infer",
        "--volume", "/models:/models:ro",
        "--publish", "30000:30000/tcp",
        "--gpus", "all",
        "--restart", "unless-stopped",
        "--ipc", "host",
        "--ulimit", "memlock=-1:-1",
        "sha256:" + "b" * 64,
        "python3", "-m", "sglang.launch_server", "--model-path", "/models/m", "--port", "30000"]


def test_podman_run_configuration_and_its_twin():
    config = cli.run_config(PODMAN, PODMAN_IMAGE)
    assert config["entrypoint"] == ["python3", "-u"] and config["env"] == ["A=b"] and config["init"]
    assert cli.create_argv("/usr/bin/podman", "web", "f" * 64, config) == [
        "/usr/bin/podman", "create", "--name", "web",
        "--env", "A=b",
        "--volume", "hf-cache:/root/.cache",
        "--publish", "127.0.0.1:18600:8000/tcp",
        "--network", "bridge",
        "--device", "/dev/fuse:/dev/fuse:rwm",
        "--restart", "on-failure:3",
        "--shm-size", "65536000",
        "--cap-add", "SYS_PTRACE",
        "--init",
        "--entrypoint", "python3",
        "f" * 64,
        "-u", "-m", "http.server"]


def test_gpu_requests_by_count_and_by_device():
    def gpus(request):
        return cli.run_config({"HostConfig": {"DeviceRequests": [request]}}, {})["gpus"]

    assert gpus({"Count": 2, "Capabilities": [["gpu"]]}) == "2"
    assert gpus({"Count": 0, "DeviceIDs": ["0", "3"], "Capabilities": [["gpu", "utility"]]}) == "device=0,3"
    assert gpus({"Count": -1, "Capabilities": [["compute"]]}) is None


def test_plain_commands_and_names():
    assert cli.stop_argv("podman", "sglang", 30) == ["podman", "stop", "-t", "30", "sglang"]
    assert cli.rename_argv("podman", "a", "a-ddtree-prev") == ["podman", "rename", "a", "a-ddtree-prev"]
    assert cli.build_argv("podman", "/s/build/r1", "t:1") == ["podman", "build", "-t", "t:1", "-f",
                                                              "/s/build/r1/Dockerfile", "/s/build/r1"]
    assert cli.kept_tag("SGLang_Prod", "sha256:" + "a" * 64) == "localhost/ddtree-deploy/sglang_prod:was-aaaaaaaaaaaa"
    assert cli.built_tag("x", "1" * 64, "abcdef123456") == "localhost/ddtree-deploy/x:ddtree-111111111111-abcdef123456"
    assert cli.run_probe_argv("docker", "img", "python3", "print(1)", ["a/b.py"]) == [
        "docker", "run", "--rm", "--network", "none", "--entrypoint", "python3", "img", "-c", "print(1)", "a/b.py"]
    assert cli.probe_argv("/usr/bin/docker", "docker") == ["/usr/bin/docker", "version", "--format",
                                                           "{{.Server.Version}}"]


def test_compose_recreates_the_service_with_the_image_overridden():
    assert cli.compose_up_argv("/usr/bin/docker", "/opt/sglang/compose.yaml", "/s/compose.override.json", "sglang") == [
        "/usr/bin/docker", "compose", "-f", "/opt/sglang/compose.yaml", "-f", "/s/compose.override.json", "up", "-d",
        "--no-deps", "--force-recreate", "sglang"]
    import json

    assert json.loads(cli.compose_override("sglang", "sha256:" + "b" * 64)) == {
        "services": {"sglang": {"image": "sha256:" + "b" * 64}}}
