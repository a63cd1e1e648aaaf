"""The serving host's server: which processes serve, and restarting them on the switched
files through the ``[serve]`` table and the serve program, with a health wait. Imports the
rooms below it (``base`` to ``tuning``).
"""
