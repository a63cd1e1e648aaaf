"""The deploy session on one host: the pure plan (drift check, what switches) and decision
(``decide``: the journal's phases), what a series makes of a host (``desired``: family,
snapshot, check, hashes, once per fleet), the push and rollback as stages over one agent
session (``push``), the read-only status (``status``) and ``snapshot pull`` (``pull``); the
host's audit log and lock. Imports the rooms below it (``base`` to ``release``); never
``fleets`` or the CLI.
"""
