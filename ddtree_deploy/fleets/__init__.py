"""The main use case: push (push, smoke, mark or roll back), rollback, status, restart and
smoke on one host or a fleet (the pure canary/waves policy and the threads that run it),
with the serving gate a push or rollback passes through. Decides each host's outcome.
Imports every room below it; only the CLI (and ``interop``) import it.
"""
