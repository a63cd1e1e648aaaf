#!/usr/bin/python
# -*- coding: utf-8 -*-
# MIT License (see the ddtree-deploy repository)
"""Documentation for ddtree.deploy.rollback; the work is done by the action plugin of the same
name, on the controller (plugins/action/rollback.py)."""

DOCUMENTATION = r"""
module: rollback
short_description: Restore a host's SGLang files from a ddtree-deploy backup
description:
  - "Runs C(ddtree-deploy rollback --json) on the controller: the newest (or I(to)) backup is restored through the same staged, verified, renamed switch as a push."
  - "C(changed) only when files were switched back; check mode is C(--dry-run); diff mode shows each restored file's diff."
  - "The host's connection comes from its inventory variables (ansible_host, ansible_user, ansible_port, ansible_ssh_private_key_file, ansible_ssh_common_args / ansible_ssh_extra_args with -J/ProxyJump, -F, UserKnownHostsFile) and C(ddtree_python), the interpreter whose sglang is patched; see docs/ansible.md."
version_added: "0.1.0"
author: ddtree-deploy
extends_documentation_fragment:
  - ddtree.deploy.toolkit
  - ddtree.deploy.toolkit.lock
options:
  to:
    description: Backup id to restore (default the newest).
    type: str
attributes:
  check_mode:
    support: full
  diff_mode:
    support: full
"""

EXAMPLES = r"""
- ddtree.deploy.rollback: {}
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

    print(json.dumps({"failed": True, "msg": "ddtree.deploy.rollback runs on the controller through its action "
                      "plugin; it cannot be executed on a host"}))
    sys.exit(1)
