"""The patch engine and the series: parse unified diffs, apply them hunk by hunk the way GNU
patch does (exact, offset, fuzz, already applied), verify, write unified diffs, load a family
(version range, ordered entries, path safety) and check a series against files in memory.
Pure (texts in, texts out, plus reading the family folders). Imports ``base`` and
``settings`` (a family's ``[smoke]`` table).
"""
