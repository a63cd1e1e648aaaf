# -*- coding: utf-8 -*-
# MIT License (see the ddtree-deploy repository)
"""The options every ddtree.deploy module shares (how the controller runs the toolkit), and
the lock option of the modules that change a host, documented once for ansible-doc."""


class ModuleDocFragment(object):
    DOCUMENTATION = r"""
options:
  ddtree_deploy:
    description: Path of the C(ddtree-deploy) executable on the controller (default C(ddtree_deploy_cmd), else C(ddtree-deploy) on PATH).
    type: str
  trust_new_host:
    description: Record an unknown host key in the known_hosts file (a changed key is always refused).
    type: bool
    default: false
  timeout:
    description: Seconds the toolkit may run for this host.
    type: int
    default: 3600
"""

    LOCK = r"""
options:
  break_lock:
    description: Take the deploy lock even if another run holds it.
    type: bool
    default: false
"""
