"""Ansible host variables -> one ddtree-deploy inventory file (``hosts/<name>.toml``).

ONE mapping, used by two callers:

* ``ddtree-deploy inventory from-ansible`` (ddtree_deploy/cli/inventory_cmd.py), which
  reads a whole Ansible inventory through ansible-core's own loader;
* the Ansible collection's action plugins (ansible/ddtree/plugins/plugin_utils/hostmap.py
  is a byte-identical copy of this file, checked by tests/e2e/test_ansible_collection.py),
  which write a host's file on the controller and run ``ddtree-deploy ... --json``.

Stdlib only, no import from ddtree_deploy, Python 3.8+ (ansible-core may run under a
different interpreter than the toolkit). Values are only FORMATTED here: the toolkit's
inventory loader validates every key of the file written (bad input: one line, exit 2).

Variables read (``get(name)`` returns the templated value or None):

    ansible_host / ansible_ssh_host          -> ssh.host (else the inventory name)
    ansible_user / ansible_ssh_user          -> ssh.user
    ansible_port / ansible_ssh_port          -> ssh.port
    ansible_ssh_private_key_file / ansible_private_key_file -> ssh.identity_file
    ansible_ssh_common_args, ansible_ssh_extra_args:
        -J HOPS / -o ProxyJump=HOPS          -> ssh.jump
        -F FILE                              -> ssh.ssh_config
        -o UserKnownHostsFile=FILE           -> ssh.known_hosts
        -o ConnectTimeout=N                  -> ssh.connect_timeout
        -o Port= / User= / IdentityFile= / -p / -l / -i  -> port / user / identity_file
        anything else (e.g. -o ProxyCommand=..., -o StrictHostKeyChecking=no) is refused:
        the toolkit's SSH client would silently not honour it
    ansible_connection = local               -> transport = "local"
    ddtree_python (required)                 -> host.python (the interpreter whose sglang is patched)
    ddtree_state_dir, ddtree_keep_backups, ddtree_sudo, ddtree_op_timeout -> host.*
    ddtree_known_hosts, ddtree_ssh_config, ddtree_connect_timeout, ddtree_jump -> ssh.* (win over args)
    ddtree_smoke (a mapping: the [smoke] table) or ddtree_smoke_levels (a list) -> [smoke]
    ddtree_serve (a mapping: the [serve] table: restart argv, url, ...) -> [serve]

These names describe a HOST (HOST_VARIABLES). What one run does (push with or without the
smoke, which levels, which backup) is the collection's role and playbook options, whose names
are never one of these: a role default is a variable of every host in the play, so a role
option named like a host variable would replace the host's value with another type
(tests/e2e/test_ansible_collection.py, test_run_options_are_not_host_variables).
"""

import re
import shlex

# Every variable that describes a host to ddtree-deploy: what host_tables reads, the file's
# name (ddtree_name, read by the callers) and where the toolkit is (ddtree_deploy_cmd, read by
# the collection). The collection templates exactly these for a task's host.
HOST_VARIABLES = (
    "ansible_host", "ansible_ssh_host", "ansible_user", "ansible_ssh_user", "ansible_port", "ansible_ssh_port",
    "ansible_ssh_private_key_file", "ansible_private_key_file", "ansible_ssh_common_args",
    "ansible_ssh_extra_args", "ansible_connection", "ddtree_python", "ddtree_state_dir", "ddtree_keep_backups",
    "ddtree_sudo", "ddtree_op_timeout", "ddtree_known_hosts", "ddtree_ssh_config", "ddtree_connect_timeout",
    "ddtree_jump", "ddtree_smoke", "ddtree_smoke_levels", "ddtree_serve", "ddtree_name", "ddtree_deploy_cmd",
)

# The toolkit's host names (the file's stem): see ddtree_deploy/settings/inventory.py.
HOST_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}$")

# ssh -o options we translate, by lower-case name -> key of the [ssh] table.
_OPTIONS = {
    "proxyjump": "jump",
    "userknownhostsfile": "known_hosts",
    "connecttimeout": "connect_timeout",
    "port": "port",
    "user": "user",
    "identityfile": "identity_file",
}
# ssh flags with a value -> key of the [ssh] table.
_FLAGS = {"-J": "jump", "-F": "ssh_config", "-p": "port", "-l": "user", "-i": "identity_file"}
# Options that change nothing the toolkit does differently; accepted and dropped.
_HARMLESS = {"controlmaster", "controlpersist", "controlpath", "serveraliveinterval", "serveralivecountmax",
             "identitiesonly", "loglevel", "compression", "forwardagent", "batchmode"}


class MappingError(ValueError):
    """A variable that cannot become an inventory key; the message names the host and the variable."""


def parse_ssh_args(text, host, var):
    """``ansible_ssh_common_args``-style text -> {ssh key: value}; refuses what we cannot honour."""
    out = {}
    try:
        words = shlex.split(text or "")
    except ValueError as exc:
        raise MappingError("%s: %s: cannot split %r (%s)" % (host, var, text, exc))
    i = 0
    while i < len(words):
        w = words[i]
        flag, value = w[:2], w[2:]
        if flag == "-o" or flag in _FLAGS:
            if not value:
                i += 1
                if i >= len(words):
                    raise MappingError("%s: %s: %s needs a value" % (host, var, flag))
                value = words[i]
            if flag == "-o":
                if "=" in value:
                    name, val = value.split("=", 1)
                else:
                    name, _, val = value.partition(" ")
                    if not val and i + 1 < len(words):
                        i += 1
                        val = words[i]
                key = _OPTIONS.get(name.strip().lower())
                if key is None:
                    if name.strip().lower() in _HARMLESS:
                        i += 1
                        continue
                    raise MappingError(
                        "%s: %s: ssh option %s is not supported by ddtree-deploy's SSH client; remove it, "
                        "or put it in an ssh config file passed with -F (ProxyJump, User, Port, "
                        "IdentityFile, UserKnownHostsFile, ConnectTimeout are mapped)" % (host, var, name))
                out[key] = val.strip()
            else:
                out[_FLAGS[flag]] = value
        else:
            raise MappingError("%s: %s: argument %r is not supported by ddtree-deploy's SSH client; "
                               "use -o Name=Value, -J, -F, -p, -l or -i" % (host, var, w))
        i += 1
    for key in ("port", "connect_timeout"):
        if key in out:
            try:
                out[key] = int(out[key])
            except ValueError:
                raise MappingError("%s: %s: %s %r is not a number" % (host, var, key, out[key]))
    return out


def host_tables(name, get):
    """(transport, {table: {key: value}}) for host ``name``; ``get(var)`` -> value or None."""
    if not HOST_NAME.match(name or ""):
        raise MappingError("%s: not usable as a ddtree-deploy host name (letters, digits, '.', '-', '_'); "
                           "set ddtree_name for this host" % (name,))
    python = get("ddtree_python")
    if not python:
        raise MappingError("%s: ddtree_python is not set: the interpreter whose sglang is patched, e.g. "
                           "ddtree_python=/opt/sglang/.venv/bin/python" % name)
    host = {"python": python}
    for var, key in (("ddtree_state_dir", "state_dir"), ("ddtree_keep_backups", "keep_backups"),
                     ("ddtree_sudo", "sudo"), ("ddtree_op_timeout", "op_timeout")):
        value = get(var)
        if value is not None:
            host[key] = _typed(value, key, name, var)
    tables = {"host": host}
    transport = "local" if (get("ansible_connection") or "") == "local" else "ssh"
    if transport == "ssh":
        ssh = {}
        for var in ("ansible_ssh_common_args", "ansible_ssh_extra_args"):
            ssh.update(parse_ssh_args(get(var), name, var))
        ssh["host"] = get("ansible_host") or get("ansible_ssh_host") or ssh.get("host") or name
        for key, names in (("user", ("ansible_user", "ansible_ssh_user")),
                           ("port", ("ansible_port", "ansible_ssh_port")),
                           ("identity_file", ("ansible_ssh_private_key_file", "ansible_private_key_file")),
                           ("known_hosts", ("ddtree_known_hosts",)),
                           ("ssh_config", ("ddtree_ssh_config",)),
                           ("connect_timeout", ("ddtree_connect_timeout",)),
                           ("jump", ("ddtree_jump",))):
            for var in names:
                value = get(var)
                if value is not None and value != "":
                    ssh[key] = _typed(value, key, name, var)
                    break
        tables["ssh"] = dict(sorted(ssh.items()))
    smoke = get("ddtree_smoke")
    levels = get("ddtree_smoke_levels")
    if smoke is not None:
        if not isinstance(smoke, dict):
            raise MappingError("%s: ddtree_smoke must be a mapping (the host's [smoke] table, e.g. {levels: "
                               "[compile, import]}), not %r; whether a push runs the smoke is the run's choice: "
                               "the role's ddtree_push_smoke, the push task's smoke, push --no-smoke"
                               % (name, smoke))
        tables["smoke"] = dict(smoke)
    if levels is not None:
        if isinstance(levels, str):
            levels = [x for x in re.split(r"[,\s]+", levels) if x]
        tables.setdefault("smoke", {})["levels"] = list(levels)
    serve = get("ddtree_serve")
    if serve is not None:
        if not isinstance(serve, dict):
            raise MappingError("%s: ddtree_serve must be a mapping (the [serve] table: restart, url, ...)" % name)
        tables["serve"] = dict(serve)
    return transport, tables


def host_toml(name, get):
    """The text of ``hosts/<name>.toml`` for one Ansible host."""
    transport, tables = host_tables(name, get)
    lines = ["# Written by ddtree-deploy from Ansible host variables (ansible_map.py).", ""]
    if transport == "local":
        lines += ['transport = "local"', ""]
    for table in ("ssh", "host", "smoke", "serve"):
        if table in tables:
            _emit(lines, table, tables[table])
    return "\n".join(lines).rstrip("\n") + "\n"


def groups_toml(groups):
    """``hosts/groups.toml`` text from an ordered {group: [host, ...]}."""
    lines = ["# Written by ddtree-deploy from an Ansible inventory; the first member is the default canary.",
             "", "[groups]"]
    for group, members in groups.items():
        lines.append("%s = [%s]" % (group, ", ".join(_value(m) for m in members)))
    return "\n".join(lines) + "\n"


def _typed(value, key, host, var):
    """Inventory values arrive as strings from INI files: give keys their TOML types."""
    if key in ("port", "keep_backups"):
        try:
            return int(value)
        except (TypeError, ValueError):
            raise MappingError("%s: %s=%r is not an integer" % (host, var, value))
    if key in ("connect_timeout", "op_timeout"):
        try:
            number = float(value)
        except (TypeError, ValueError):
            raise MappingError("%s: %s=%r is not a number of seconds" % (host, var, value))
        return int(number) if number == int(number) else number
    if key == "sudo":
        if isinstance(value, bool):
            return value
        text = str(value).strip().lower()
        if text in ("true", "yes", "1", "on"):
            return True
        if text in ("false", "no", "0", "off"):
            return False
        raise MappingError("%s: %s=%r is not true or false" % (host, var, value))
    return str(value)


def _emit(lines, name, table):
    scalars = [(k, v) for k, v in table.items() if not isinstance(v, dict)]
    subtables = [(k, v) for k, v in table.items() if isinstance(v, dict)]
    lines.append("[%s]" % name)
    for k, v in scalars:
        lines.append("%s = %s" % (_key(k), _value(v)))
    lines.append("")
    for k, v in subtables:
        _emit(lines, "%s.%s" % (name, _key(k)), v)


def _key(k):
    k = str(k)
    return k if re.match(r"^[A-Za-z0-9_-]+$", k) else _value(k)


def _value(v):
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_value(x) for x in v) + "]"
    text = str(v)
    out = []
    for ch in text:
        if ch == "\\":
            out.append("\\\\")
        elif ch == '"':
            out.append('\\"')
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append("\\u%04x" % ord(ch))
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'
