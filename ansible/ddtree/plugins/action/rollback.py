# -*- coding: utf-8 -*-
# MIT License (see the ddtree-deploy repository)
"""ddtree.deploy.rollback: runs `ddtree-deploy rollback --json` on the controller (see plugin_utils/toolkit.py)."""

from ansible.plugins.action import ActionBase

from ansible_collections.ddtree.deploy.plugins.plugin_utils.toolkit import SPECS, run_command


class ActionModule(ActionBase):
    # The toolkit opens its own SSH connection (strict host keys, one agent session):
    # Ansible's connection to the host is never used.
    _requires_connection = False
    _supports_check_mode = True
    _supports_async = False

    def run(self, tmp=None, task_vars=None):
        super(ActionModule, self).run(tmp, task_vars)
        _valid, args = self.validate_argument_spec(argument_spec=SPECS["rollback"])
        return run_command(self, "rollback", task_vars or {}, args)
