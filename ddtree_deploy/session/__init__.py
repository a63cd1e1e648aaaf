"""The deploy session on one host: the pure plan (drift check, what switches), what a series
makes of a host (``desired``: family, snapshot, check, hashes, once per fleet), and the one
agent session that pushes, rolls back, marks and reads status; the host's audit log and lock.
Imports the rooms below it (``base`` to ``release``); never ``fleets`` or the CLI.
"""
