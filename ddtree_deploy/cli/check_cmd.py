"""`ddtree-deploy check` (placeholder until the foundation lands)."""
