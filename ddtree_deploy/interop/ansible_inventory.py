"""Read an existing Ansible inventory (INI, YAML, a folder with group_vars/host_vars, any
source ansible-core reads) into ddtree-deploy host files and groups.

The inventory is parsed by ansible-core's own loader (``InventoryManager``) and each
host's variables are merged by its ``VariableManager`` (group_vars, host_vars, group
precedence, ``all``) and templated by its ``Templar``: no hand-written parser. The
mapping of variables to inventory keys is ansible_map.py (shared with the collection).

ansible-core is an optional extra (``ddtree-deploy[ansible]``; base/install.add_extra says how to add it).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ddtree_deploy.base.errors import BadInput
from ddtree_deploy.base.fsutil import require_writable_folder
from ddtree_deploy.interop.ansible_map import MappingError, groups_toml, host_toml


@dataclass(frozen=True)
class Imported:
    hosts: dict[str, str]  # host name -> its .toml text, inventory order
    groups: dict[str, list[str]]  # group -> members (hosts we imported), inventory order
    groups_text: str


def _ansible():
    try:
        from ansible.inventory.manager import InventoryManager
        from ansible.parsing.dataloader import DataLoader
        from ansible.template import Templar
        from ansible.vars.manager import VariableManager
    except ImportError:
        from ddtree_deploy.base.install import add_extra

        raise BadInput("reading an Ansible inventory needs ansible-core, which is not installed",
                       hint=f"install it where ddtree-deploy runs: {add_extra('ansible')}") from None
    return InventoryManager, DataLoader, VariableManager, Templar


def read_inventory(source: str, *, limit: str | None = None) -> Imported:
    """Every host of ``source`` (or those matching the ``limit`` pattern) and every group with members."""
    InventoryManager, DataLoader, VariableManager, Templar = _ansible()
    if not Path(source).exists():
        raise BadInput(f"{source}: no such Ansible inventory (a file or folder)")
    loader = DataLoader()
    try:
        inventory = InventoryManager(loader=loader, sources=[source])
    except Exception as exc:  # ansible raises its own error types
        raise BadInput(f"{source}: ansible-core cannot read this inventory: {exc}") from None
    variables = VariableManager(loader=loader, inventory=inventory)
    hosts = inventory.get_hosts(limit or "all")
    if not hosts:
        raise BadInput(f"{source}: no host{' matches ' + repr(limit) if limit else ''} in this inventory "
                       "(ansible-core parsed it as empty: check the file's format)")
    texts: dict[str, str] = {}
    for h in hosts:
        hv = variables.get_vars(host=h, include_hostvars=False)
        templar = Templar(loader=loader, variables=hv)

        def get(var, hv=hv, templar=templar):
            if var not in hv:
                return None
            try:
                return templar.template(hv[var])
            except Exception as exc:
                raise MappingError(f"{h.name}: {var}: cannot template {hv[var]!r} ({exc})") from None

        name = get("ddtree_name") or h.name
        if name in texts:
            raise BadInput(f"{source}: hosts {h.name!r} and another both map to the host name {name!r}",
                           hint="give each host its own ddtree_name")
        if name == "groups":  # hosts/groups.toml holds the groups
            raise BadInput(f"{source}: host {h.name!r}: the name 'groups' is reserved by ddtree-deploy",
                           hint="set ddtree_name for this host")
        try:
            texts[name] = host_toml(name, get)
        except MappingError as exc:
            raise BadInput(f"{source}: host {exc}", hint="set the variable in the inventory, "
                           "its host_vars/ or group_vars/ (see docs/ansible.md)") from None
    names = {h.name: n for h, n in zip(hosts, texts)}
    groups: dict[str, list[str]] = {}
    for group in inventory.groups.values():
        if group.name in ("all", "ungrouped"):
            continue
        members = [names[h.name] for h in group.get_hosts() if h.name in names]
        if members:
            groups[group.name] = members
    return Imported(texts, groups, groups_toml(groups) if groups else "")


def write_hosts(imported: Imported, out: Path, *, force: bool) -> list[Path]:
    """Write ``out/<name>.toml`` per host and ``out/groups.toml``; refuse to overwrite unless ``force``.

    Every target is checked before the first write, so a refusal leaves the folder as it was.
    """
    files = {out / f"{n}.toml": text for n, text in imported.hosts.items()}
    if imported.groups_text:
        files[out / "groups.toml"] = imported.groups_text
    require_writable_folder(out, "--out")
    existing = [p for p in files if p.exists()]
    if existing and not force:
        raise BadInput(f"--out {out}: {', '.join(p.name for p in existing)} already exist; nothing was written",
                       hint="pass --force to replace them, or choose another --out folder")
    out.mkdir(parents=True, exist_ok=True)
    for path, text in files.items():
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(text, encoding="utf-8")
        tmp.replace(path)
    return list(files)
