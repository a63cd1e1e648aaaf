"""How a long step tells its caller what it is doing: one type for every room.

``Progress`` hears one line per step as it begins ("connect", "lock + discover", "smoke
import"); the CLI shows it as a spinner or a fleet row. ``Heartbeat`` hears that a long
step is still running (its name, seconds so far). ``Counted`` is the release matrix's:
a phase ("download", "apply"), how many of its items are done, and how many there are.
``quiet`` is the default listener that ignores every step.
"""

from __future__ import annotations

from typing import Callable

Progress = Callable[[str], None]
Heartbeat = Callable[[str, float], None]
Counted = Callable[[str, int, int], None]


def quiet(_step: str) -> None:
    """A ``Progress`` that ignores every step (the default of every function that takes one)."""


__all__ = ["Counted", "Heartbeat", "Progress", "quiet"]
