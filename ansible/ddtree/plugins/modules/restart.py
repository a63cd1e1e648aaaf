#!/usr/bin/python
# -*- coding: utf-8 -*-
# MIT License (see the ddtree-deploy repository)
"""Documentation for ddtree.deploy.restart; the work is done by the action plugin of the same
name, on the controller (plugins/action/restart.py)."""

DOCUMENTATION = r"""
module: restart
short_description: Restart a host's serving SGLang through ddtree-deploy, gated on its health
description:
  - "Runs C(ddtree-deploy restart --json) on the controller: under the host's deploy lock, the host's C([serve]) restart command (an argv, never a shell), then the health wait and, where DDTree is deployed, the DDTree proof from C(/server_info); recorded in the host's journal and history."
  - "The C([serve]) table comes from C(ddtree_serve), a mapping (restart, url, ready_timeout_s, proof, budget, drain...); see docs/serving.md."
  - "C(changed) when the restart command ran (handler-friendly: notify it from a task that changed the files); failed when the server was not healthy in time or failed the proof. Check mode reports C(changed) and restarts nothing. Use C(serial) for waves: a push of hosts with a C([serve]) table restarts them itself."
version_added: "0.1.0"
author: ddtree-deploy
extends_documentation_fragment:
  - ddtree.deploy.toolkit
  - ddtree.deploy.toolkit.lock
attributes:
  check_mode:
    support: full
  diff_mode:
    support: none
"""

EXAMPLES = r"""
# A handler: restart the server once the series changed on the host.
- ddtree.deploy.push:
    smoke: true
  notify: restart sglang
# handlers:
- name: restart sglang
  ddtree.deploy.restart: {}
"""

RETURN = r"""
ddtree:
  description: The toolkit's JSON document for this host (restart, with state, detail, health, tree proof, pids).
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

    print(json.dumps({"failed": True, "msg": "ddtree.deploy.restart runs on the controller through its action "
                      "plugin; it cannot be executed on a host"}))
    sys.exit(1)
