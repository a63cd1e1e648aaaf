"""Other tools' formats: Ansible inventories (the mapping the Ansible collection carries a
byte-identical copy of) and container images (a build context whose RUN step applies the
series with the host agent). Imports the rooms below it.
"""
