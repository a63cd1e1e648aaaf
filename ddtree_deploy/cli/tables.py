"""Tables for people, on any terminal width: the table when it fits, else the same facts as lines.

A rich table squeezed below its natural width folds its cells mid-word ("0001-spec-info-
register" / "-ddtree.patch"): on an 80-column terminal the check table and the matrix were
unreadable. ``show`` prints the table when it fits the console and otherwise the caller's
narrow form: the same content as lines (wrapped between words) or a compact table.
"""

from __future__ import annotations

from typing import Callable, Iterable, Union

from rich.console import Console, RenderableType

Narrow = Callable[[], Iterable[Union[str, RenderableType]]]


def natural_width(console: Console, renderable: RenderableType) -> int:
    """The columns ``renderable`` takes when nothing limits it."""
    from rich.measure import Measurement

    return Measurement.get(console, console.options.update_width(1 << 16), renderable).maximum


def fits(console: Console, renderable: RenderableType) -> bool:
    return natural_width(console, renderable) <= console.width


def show(console: Console, table: RenderableType, narrow: Narrow) -> None:
    """``table`` when it fits ``console``, else each item of ``narrow()`` (markup lines or
    renderables)."""
    if fits(console, table):
        console.print(table)
        return
    for item in narrow():
        if isinstance(item, str):
            console.print(item, highlight=False)
        else:
            console.print(item)


__all__ = ["fits", "natural_width", "show"]
