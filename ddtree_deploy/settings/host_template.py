"""The host file ``ddtree-deploy hosts init NAME`` writes: every key, commented. Pure text.

What it writes parses as it stands (tests/integration/test_hosts_cmd.py reads it back with the
inventory's own parser, and again with every commented key line switched on), so a first
``status --host NAME`` already works once the values marked EDIT are right. The keys and
their meaning: docs/inventory.md (the inventory), docs/smoke.md ([smoke]), docs/serving.md
([serve]); the GPU example the project keeps is hosts/ct200.toml.
"""

from __future__ import annotations

import json

from ddtree_deploy.base import next_step


def _value(v: object) -> str:
    # A TOML basic string is JSON-compatible for the values written here (paths, names).
    return str(v).lower() if isinstance(v, bool) else str(v) if isinstance(v, int) else json.dumps(str(v))


def _key(name: str, value: object, note: str, *, on: bool, width: int = 40) -> str:
    """``name = value   # note``; ``on`` False: commented out (an example to switch on).
    A list value is written as a TOML array."""
    text = "[" + ", ".join(_value(v) for v in value) + "]" if isinstance(value, list) else _value(value)
    line = f"{'' if on else '# '}{name} = {text}"
    return f"{line:<{width}} # {note}"


def render(name: str, *, ssh_host: str | None = None, user: str | None = None, port: int | None = None,
           python: str | None = None, state_dir: str | None = None, local: bool = False) -> str:
    """The commented host file for host ``name``; the given values filled in, the others
    examples (``python`` and an SSH host marked EDIT when not given)."""
    edit = "EDIT: " if python is None else ""
    lines = [
        f"# Host {name}: written by {next_step.hosts_init(name)}. Check it: {next_step.status(name)}.",
        "# Keys: docs/inventory.md (inventory), docs/smoke.md ([smoke]), docs/serving.md ([serve]).",
    ]
    if local:
        lines += [_key("transport", "local", "this machine itself: no [ssh] table", on=True), ""]
    else:
        target = ssh_host or name
        lines += [
            _key("transport", "local", "this machine itself (then drop the [ssh] table)", on=False),
            "",
            "[ssh]",
            _key("host", target, ("" if ssh_host else "EDIT: ") + "hostname or ~/.ssh/config alias "
                 "(its HostName, User, Port, ProxyJump apply)", on=True),
            _key("user", user or "ubuntu", "else ~/.ssh/config's User, else yours", on=user is not None),
            _key("port", port or 22, "else ~/.ssh/config's Port, else 22", on=port is not None),
            _key("identity_file", "~/.ssh/id_ed25519", "else the agent's and the default keys", on=False),
            _key("jump", "bastion.example.org", 'ProxyJump hops, "[user@]host[:port]", comma-separated', on=False),
            _key("known_hosts", "~/.ssh/known_hosts", "strict: a new host key needs --trust-new-host once",
                 on=False),
            _key("ssh_config", "~/.ssh/config", "the ssh config read for the alias", on=False),
            _key("connect_timeout", 10, "seconds", on=True),
            "",
        ]
    lines += [
        "[host]",
        _key("python", python or "/opt/sglang/.venv/bin/python", f"{edit}the interpreter that imports the sglang "
             "to patch", on=True),
        _key("state_dir", state_dir or "~/.ddtree-deploy", "lock, journal, backups on the host", on=True),
        _key("keep_backups", 5, "the newest N backups kept (never the one in use)", on=False),
        _key("sudo", False, "true: run the host agent as `sudo -n` (a root-owned install)", on=False),
        _key("op_timeout", 120, "seconds one agent round trip may take (reads: 30)", on=False),
        "",
        "[smoke]",
        f"# After every push (a failed level rolls the push back) and by {next_step.command('smoke')}.",
        _key("levels", ["compile", "import", "cli"], "launch too, once [smoke.launch] names real models", on=True),
        _key("timeout_s", 300, "the import and the cli level's deadline, each", on=False),
        "",
        f"{'# [smoke.launch]':<40} # the launch level (a GPU): a real server, one request",
        _key("model", "/models/Qwen3-8B", "target model", on=False),
        _key("draft_model", "/models/Qwen3-8B-DFlash-b16", "DFlash draft model", on=False),
        _key("budget", 64, "DDTree budget (tree nodes per step)", on=False),
        _key("port", 30188, "a free port for the smoke's server", on=False),
        _key("min_free_gib", 40, "GPU memory that must be free before it starts", on=False),
        _key("extra_args", ["--attention-backend", "flashinfer"], "a backend with the tree mask (not FA3)",
             on=False),
        "",
        f"{'# [serve]':<40} # the server in service: a push restarts it healthy, or rolls back",
        _key("restart", ["sudo", "-n", "systemctl", "restart", "sglang"], "argv, run without a shell", on=False),
        _key("url", "http://127.0.0.1:30000", "its base URL (health, server info)", on=False),
        _key("ready_timeout_s", 900, "seconds it may take to become healthy", on=False),
        _key("budget", 64, "the budget it serves with", on=False),
    ]
    return "\n".join(lines) + "\n"


__all__ = ["render"]
