"""The basics every room shares: error types and codes, where files live, file and TOML
reading, the "run this next" texts, sha256, the Progress type and the one test hook point.
Imports nothing from the package but ``ddtree_deploy.__version__``; every other room may
import it.
"""
