"""The toolkit's one test hook point: the ``DDTREE_DEPLOY_TEST_HOOKS`` environment variable.

Fault-injection tests need a host program to fail at an exact step: killed after its Nth
rename, stopped before each request, a file system that fills up after the preflight. The
real failure is injected by the real program, so the test exercises the real recovery; the
tests set this variable to a JSON object, and this module is the only place that reads it.
Unset (every real run), ``hooks()`` is ``{}`` and nothing below changes behaviour.

Where the keys act:

- the host agent: the whole object travels in the agent's ``init`` request (``hooks``) and
  the agent acts on its own keys (``exit_after_renames``, ``stop_after_renames``,
  ``immutable_after_renames``, ``stop_in_guard_after_renames``, ``no_hard_links``, ``fill_after_staging``,
  ``stop_before_each_request``, ``exit_after_*`` / ``stop_after_*`` at its named steps);
- the container program (a ``[container]`` host): the object travels in its ``init`` request
  too; it acts on ``exit_after_rename`` (killed between the old container's rename aside and
  the new one's creation);
- ``smoke_heartbeat_s``: the smoke program's keep-alive interval during a push (20 s
  otherwise), so that a test sees a heartbeat in under a second.

Nothing else in the package reads test-only input; a new hook is added here (and to this
list), never as another variable or a branch elsewhere.
"""

from __future__ import annotations

import json
import os
from typing import Any

TEST_HOOKS_ENV = "DDTREE_DEPLOY_TEST_HOOKS"


def hooks() -> dict[str, Any]:
    """The hooks a test set ({} when none): the agent's ``init`` request carries them."""
    raw = os.environ.get(TEST_HOOKS_ENV)
    return json.loads(raw) if raw else {}


def smoke_heartbeat_s() -> float | None:
    """The smoke program's keep-alive interval a test asked for, else None (the default)."""
    beat = hooks().get("smoke_heartbeat_s")
    return float(beat) if beat else None


__all__ = ["TEST_HOOKS_ENV", "hooks", "smoke_heartbeat_s"]
