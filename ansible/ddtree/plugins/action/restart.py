# -*- coding: utf-8 -*-
# MIT License (see the ddtree-deploy repository)
"""ddtree.deploy.restart: runs `ddtree-deploy restart --json` on the controller (see plugin_utils/toolkit.py)."""

from ansible_collections.ddtree.deploy.plugins.plugin_utils.toolkit import action_module

ActionModule = action_module("restart")
