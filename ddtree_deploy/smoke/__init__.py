"""Smoke levels after a switch: which levels run (compile, import, cli, launch), their
report, and the run on a host through the smoke program. Imports ``base``, ``settings``,
``engine`` and ``remote``.
"""
