"""Test payload: a whole new module that the test series adds to SGLang."""


def tree_budget_is_valid(budget: int, block_size: int) -> bool:
    # A tree of `budget` nodes plus its root must fit the verify width.
    return 0 < budget and block_size > 1
