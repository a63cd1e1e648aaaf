"""A whole new file added by the matrix test family (stands for the real payload module)."""

DDTREE_MARKER = "matrix-test-family"
