"""The host programs: stdlib-only Python that runs ON a host, with the host's interpreter.

``agent`` (the deploy agent: lock, facts, apply, journal, history), ``smoke`` (the smoke
levels), ``serve`` (the serving processes and their restart, the speed gate's scrapes and
its load step: ``load``), ``tune`` (one server at a time, bench_serving) and ``container``
(a ``[container]`` host's engine, image builds and switches) are programs; ``wire`` (JSON lines in and out, sha256, process
identity, the one test-hook point), ``server`` (a server's start, readiness wait and
process-group stop, the HTTP request: the programs' shared lifecycle) and the agent's job
modules are what they import. None of them imports anything but the standard library, this
room and ``base.codes`` (tests/integration/test_hostprog.py). ``image_apply`` is the image
build's RUN step: copied into the build context (containers/image_context.py) beside the
agent and session/plan.py's modules, which it imports there (tests/unit/test_layering.py).

A host has no ddtree-deploy installed: ``bundle`` packs a program with every module it
imports into one source, which the transport ships to ``python -c BOOTSTRAP``
(remote/program.py ProgramSession). This file itself never ships: on a host the package is a stub
the bundle makes, so it stays a docstring.
"""
