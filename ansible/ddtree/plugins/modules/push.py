#!/usr/bin/python
# -*- coding: utf-8 -*-
# MIT License (see the ddtree-deploy repository)
"""Documentation for ddtree.deploy.push; the work is done by the action plugin of the same
name, on the controller (plugins/action/push.py)."""

DOCUMENTATION = r"""
module: push
short_description: Deploy the DDTree series into a host's SGLang with ddtree-deploy
description:
  - "Runs C(ddtree-deploy push --json) on the controller for the task's host: lock, drift check, series check, back up, stage and verify, switch by rename, journal, smoke (auto-rollback on failure)."
  - "C(changed) only when files were switched. Check mode is C(--dry-run) (changed when files would switch). Diff mode shows each switched file's diff."
  - "Use the play's C(serial) (e.g. [1, '25%', '100%']: a canary, then waves), C(max_fail_percentage) and forks for fleets."
  - "The host's connection comes from its inventory variables (ansible_host, ansible_user, ansible_port, ansible_ssh_private_key_file, ansible_ssh_common_args / ansible_ssh_extra_args with -J/ProxyJump, -F, UserKnownHostsFile) and C(ddtree_python), the interpreter whose sglang is patched; see docs/ansible.md."
version_added: "0.1.0"
author: ddtree-deploy
extends_documentation_fragment:
  - ddtree.deploy.toolkit
  - ddtree.deploy.toolkit.lock
options:
  family:
    description: Patch family (default the one covering the host's SGLang version).
    type: str
  smoke:
    description: Run the smoke levels after the switch (false is C(--no-smoke)).
    type: bool
    default: true
  levels:
    description: Smoke levels to run (default the host's C(ddtree_smoke_levels), else the toolkit's).
    type: list
    elements: str
  rollback_on_failure:
    description: Roll back when a smoke level fails (false is C(--no-rollback)).
    type: bool
    default: true
attributes:
  check_mode:
    support: full
  diff_mode:
    support: full
"""

EXAMPLES = r"""
- name: Canary first, then waves of a quarter of the fleet
  hosts: gpu
  gather_facts: false
  serial: [1, "25%", "100%"]
  max_fail_percentage: 10
  tasks:
    - ddtree.deploy.push:
        levels: [compile, import]
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

    print(json.dumps({"failed": True, "msg": "ddtree.deploy.push runs on the controller through its action "
                      "plugin; it cannot be executed on a host"}))
    sys.exit(1)
