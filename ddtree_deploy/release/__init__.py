"""SGLang releases and what the series makes of them: the PyPI listing and the verified wheel
cache, facts about a release's files, snapshots (a host's or a release's pristine files), the
release matrix (the series against every release, with its import/tree levels) and porting a
family to a new release. Imports the rooms below it (``base`` to ``smoke``).
"""
