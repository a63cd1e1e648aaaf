"""What an operator writes, typed and checked: a host's inventory file (``hosts/*.toml`` plus
~/.ssh/config into a ``Host``) and the ``[smoke]`` and ``[serve]`` tables of hosts and families.
Pure parsing; a bad key is one line naming file and line. Imports only ``base``.
"""
