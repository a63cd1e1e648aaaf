"""The host programs: stdlib-only Python that runs ON a host, with the host's interpreter.

``agent`` (the deploy agent: lock, facts, apply, journal, history), ``smoke`` (the smoke
levels), ``serve`` (the serving processes and their restart, the speed gate's scrapes and
its load step: ``load``), ``tune`` (one server at a time, bench_serving) and ``container``
(a ``[container]`` host's engine, image builds and switches) are programs; ``wire`` (JSON lines in and out, sha256, process
identity, the one test-hook point) and the agent's job modules are what they import. None
of them imports anything but the standard library and this room (tests/integration/test_hostprog.py).

A host has no ddtree-deploy installed: ``bundle`` packs a program with every module it
imports into one source, which the transport ships to ``python -c BOOTSTRAP``
(remote/program.py ProgramSession). This file itself never ships: on a host the package is a stub
the bundle makes, so it stays a docstring.
"""
