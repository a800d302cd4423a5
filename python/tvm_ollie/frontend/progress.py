"""Progress of the command line's long steps, shown on stderr with tqdm.

The steps (load, optimize, build, export) are single calls into TVM, so the bar advances per step,
names the step running now, and a background thread keeps its clock ticking during a long step.
It is shown only when stderr is a terminal, so that piped or captured output stays clean.
"""

from __future__ import annotations

import sys
import threading
import time
from typing import Optional, Sequence


class Stages:
    """A context manager stepping a tqdm bar through named stages.

    ``Stages(["load", "build"])`` shows "load" at once; each :meth:`next` completes the current
    stage and shows the following one.
    """

    def __init__(self, names: Sequence[str], enabled: bool = True):
        self.names = list(names)
        self.index = 0
        self.enabled = enabled and sys.stderr.isatty()
        self._bar = None
        self._start = time.perf_counter()
        self._stop = threading.Event()
        self._ticker = None

    def __enter__(self) -> "Stages":
        if self.enabled:
            try:
                # lazy: tqdm is optional (a progress bar when installed)
                from tqdm import tqdm  # pylint: disable=import-outside-toplevel
            except ImportError:
                self.enabled = False
            else:
                self._bar = tqdm(total=len(self.names), file=sys.stderr, leave=False,
                                 desc=self.names[0] if self.names else "",
                                 bar_format="{desc} [{n_fmt}/{total_fmt}] {elapsed}")  # fmt: skip
                self._ticker = threading.Thread(target=self._tick, daemon=True)
                self._ticker.start()
        return self

    def _tick(self) -> None:
        while not self._stop.wait(0.5):
            bar = self._bar
            if bar is not None:
                bar.refresh()

    def next(self, label: Optional[str] = None) -> None:
        """Mark the current stage done (optionally renaming the next one)."""
        self.index += 1
        if label is not None and self.index < len(self.names):
            self.names[self.index] = label
        if self._bar is not None:
            self._bar.update(1)
            self._show()

    def _show(self) -> None:
        if self._bar is not None and self.index < len(self.names):
            self._bar.set_description_str(self.names[self.index])

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._ticker is not None:
            self._ticker.join()
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    @property
    def elapsed_s(self) -> float:
        """Seconds since the stages were created."""
        return time.perf_counter() - self._start
