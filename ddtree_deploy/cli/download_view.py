"""How a release wheel download shows on stderr: a progress bar (bytes, rate, time left)
on a terminal; else (piped, CI logs, ``--json``) one line per file, ``downloading X (N MiB)``.

``Downloads`` is a ``releases.DownloadProgress`` (``(file, received)``); the host views
feed it from ``rollout.Event``s, and ``downloads_shown`` wraps a command that may
download (``check --release``, ``snapshot release``). ``downloaded`` says afterwards
whether anything was fetched, so a command says "cached" only when it was.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Callable, Iterator

from ddtree_deploy.cli.app import err
from ddtree_deploy.cli.text import safe

MIB = 1 << 20


class Downloads:
    """Draws one download at a time (downloads are serialised: one release per check)."""

    def __init__(self, *, bar: bool = True, pause: Callable[[], None] | None = None,
                 resume: Callable[[], None] | None = None):
        # A bar only where someone watches: a terminal, and not a --json run.
        self.bar = bar and err.is_terminal
        self.pause, self.resume = pause, resume
        self.downloaded: list[str] = []
        self._progress = None
        self._task = None

    def __call__(self, file, received: int) -> None:
        self.update(file.filename, file.size, received)

    def update(self, name: str, size: int, received: int) -> None:
        if received == 0:
            self.close()
            self.downloaded.append(name)
            if not self.bar:
                err.print(safe(f"downloading {name} ({size / MIB:.1f} MiB)"), highlight=False, soft_wrap=True)
                return
            from rich.progress import BarColumn, DownloadColumn, Progress, TimeRemainingColumn, TransferSpeedColumn

            if self.pause is not None:
                self.pause()
            # The file's name on a line of its own, the bar's row for the numbers: squeezed into
            # one 80-column row with the name, every column was cut ("39… 23… 0:0…").
            err.print(f"[dim]downloading[/] {safe(name)} [dim]({size / MIB:.1f} MiB)[/]", highlight=False)
            self._progress = Progress(BarColumn(bar_width=None), DownloadColumn(), TransferSpeedColumn(),
                                      TimeRemainingColumn(), console=err, expand=True)
            self._task = self._progress.add_task(safe(name), total=size or None)
            self._progress.start()
        elif self._progress is not None:
            self._progress.update(self._task, completed=received)
            if size and received >= size:
                self.close()

    def close(self) -> None:
        """End a bar still drawn (a finished download, or one that failed)."""
        if self._progress is not None:
            self._progress.stop()
            self._progress = None
            if self.resume is not None:
                self.resume()


@contextmanager
def downloads_shown(*, json_output: bool) -> Iterator[Downloads]:
    """Show every release download in this block (see the module doc)."""
    from ddtree_deploy.release import releases

    shown = Downloads(bar=not json_output)
    try:
        with releases.reporting_downloads(shown):
            yield shown
    finally:
        shown.close()


__all__ = ["Downloads", "downloads_shown"]
