#!/usr/bin/python
# -*- coding: utf-8 -*-
# MIT License (see the ddtree-deploy repository)
"""Documentation for ddtree.deploy.status; the work is done by the action plugin of the same
name, on the controller (plugins/action/status.py)."""

DOCUMENTATION = r"""
module: status
short_description: Report a host's DDTree deployment state with ddtree-deploy
description:
  - "Runs C(ddtree-deploy status --json) on the controller: SGLang version, journal phase and what it means, per-file state, backups, lock holder. Never changed."
  - "The host's connection comes from its inventory variables (ansible_host, ansible_user, ansible_port, ansible_ssh_private_key_file, ansible_ssh_common_args / ansible_ssh_extra_args with -J/ProxyJump, -F, UserKnownHostsFile) and C(ddtree_python), the interpreter whose sglang is patched; see docs/ansible.md."
version_added: "0.1.0"
author: ddtree-deploy
extends_documentation_fragment:
  - ddtree.deploy.toolkit
options:
  family:
    description: Patch family to compare the files against (default the one covering the host's SGLang).
    type: str
attributes:
  check_mode:
    support: full
  diff_mode:
    support: none
"""

EXAMPLES = r"""
- ddtree.deploy.status:
  register: st
- ansible.builtin.debug:
    msg: "{{ st.ddtree.phase }}"
"""

RETURN = r"""
ddtree:
  description: The toolkit's JSON document for this host (plan, summary, phase, backup_id, smoke...).
  returned: when the toolkit answered
  type: dict
hint:
  description: What to do, with the toolkit's one-line error in C(msg).
  returned: on failure, when the toolkit gives one
  type: str
"""

if __name__ == "__main__":
    import json
    import sys

    print(json.dumps({"failed": True, "msg": "ddtree.deploy.status runs on the controller through its action "
                      "plugin; it cannot be executed on a host"}))
    sys.exit(1)
