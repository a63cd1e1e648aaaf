"""ddtree-deploy: keep a DDTree-patched SGLang running on remote GPU hosts."""

__version__ = "0.1.0"
