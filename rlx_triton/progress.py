"""Progress of the long commands (tune, audit, bench, perf): per unit of work, with a total and an ETA.

On a terminal it is a tqdm bar on stderr. Elsewhere (CI logs, output sent to a file) it is plain
lines in the same format, one at the first unit, then at most one every `interval` seconds, and the
last: a log keeps a readable record instead of carriage-return redraws.

    with Progress(len(cases), "tune", unit="case") as progress:
        for case in cases:
            progress.set_label(case.name)
            ...
            progress.update()
"""
from __future__ import annotations

import os
import sys
import time
from typing import IO, Any, Optional

LINE_FORMAT = "{desc}: {n_fmt}/{total_fmt} {unit} [{elapsed}<{remaining}, {rate_fmt}{postfix}]"
# on a terminal: the narrowest bar worth drawing, the width assumed when the terminal does not say, the room
# kept for counts and times that grow, and the shortest clipped label worth showing
MIN_BAR, DEFAULT_COLUMNS, TIMING_SLACK, MIN_LABEL = 20, 80, 10, 8


class Progress:
    def __init__(self, total: int, desc: str, unit: str = "it", *, enabled: bool = True,
                 stream: Optional[IO[str]] = None, interval: float = 5.0) -> None:
        self.total, self.desc, self.unit = total, desc, unit
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = enabled
        self.interval = interval
        self.done = 0
        self.label = ""
        self._started = time.monotonic()
        self._last_line = float("-inf")
        self._bar: Optional[Any] = None  # a tqdm bar (tqdm ships no types)
        if enabled and _is_terminal(self.stream):
            from tqdm import tqdm

            self._bar = tqdm(total=total, desc=desc, unit=unit, file=self.stream, dynamic_ncols=True, leave=True)

    def set_total(self, total: int) -> None:
        """The number of units, where it is known only once the work has started (the audit's variants)."""
        self.total = total
        if self._bar is not None:
            self._bar.total = total
            self._bar.refresh()

    def set_label(self, label: str) -> None:
        """What is being worked on now (shown after the counts; on a terminal, clipped so the bar keeps
        MIN_BAR columns of the terminal's width)."""
        self.label = label
        if self._bar is not None:
            self._bar.set_postfix_str(self._fitted(self._bar, label), refresh=True)

    def _fitted(self, bar: Any, label: str) -> str:
        from tqdm import tqdm

        try:
            columns = os.get_terminal_size(self.stream.fileno()).columns
        except (AttributeError, OSError, ValueError):
            columns = DEFAULT_COLUMNS
        # the line without bar and label, as it is drawn now; counts and times may grow by a few characters
        meter = tqdm.format_meter(**{**bar.format_dict, "bar_format": "{l_bar}{r_bar}", "postfix": None})
        room = columns - len(meter) - len(", ") - MIN_BAR - TIMING_SLACK
        if len(label) <= room:
            return label
        return label[:room - 1] + "…" if room >= MIN_LABEL else ""

    def update(self, n: int = 1) -> None:
        self.done += n
        if self._bar is not None:
            self._bar.update(n)
        elif self.enabled:
            now = time.monotonic()
            if self.done == n or self.done >= self.total or now - self._last_line >= self.interval:
                self._last_line = now
                print(self.line(now - self._started), file=self.stream, flush=True)

    def line(self, elapsed: float) -> str:
        from tqdm import tqdm

        return tqdm.format_meter(self.done, self.total, elapsed, prefix=self.desc, unit=self.unit,
                                 bar_format=LINE_FORMAT, postfix=self.label or None)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def __enter__(self) -> "Progress":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _is_terminal(stream: IO[str]) -> bool:
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty())
