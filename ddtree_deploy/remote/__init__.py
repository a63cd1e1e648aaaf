"""Reaching a host: run a command, read, write, ship a host program and talk JSON with it over
SSH (fabric/paramiko) or locally, with bounded replies and deadlines; ``inflight`` knows
which links are open so Ctrl-C can drop them. Imports ``base``, ``hostprog`` (the programs it
ships and their protocol) and ``settings``.
"""
