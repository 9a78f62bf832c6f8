"""A dependency-free progress bar for long benchmarks, written to standard error.

On a terminal the bar is redrawn in place (at most a few times a second); otherwise (a log
file, a pipe, a test's captured output) it writes a plain line now and then, and always the
lines its caller forces, so logs stay short and readable.
"""

from __future__ import annotations

import sys
import time
from typing import TextIO

__all__ = ["ProgressBar", "format_seconds"]


def format_seconds(s: float) -> str:
    """``s`` seconds as ``"42s"``, ``"3m05s"`` or ``"1h02m"``."""
    s = max(0.0, float(s))
    if s < 60:
        return f"{s:.0f}s"
    if s < 3600:
        return f"{int(s // 60)}m{int(s % 60):02d}s"
    return f"{int(s // 3600)}h{int(s % 3600 // 60):02d}m"


class ProgressBar:
    """A bar of ``done / total`` with a label, a rate, a time left and free-form notes.

    Args:
        label: Shown first (e.g. the method being trained).
        total: The count at completion.
        initial: Where the bar starts (e.g. a resumed step).
        stream: Where it writes (default: standard error).
        width: Characters of the bar itself.
        every: Seconds between plain lines when ``stream`` is not a terminal.
    """

    def __init__(self, label: str, total: int, *, initial: int = 0,
                 stream: TextIO | None = None, width: int = 24, every: float = 30.0) -> None:
        self.label = label
        self.total = max(1, int(total))
        self.done = int(initial)
        self.stream = stream if stream is not None else sys.stderr
        self.width = width
        self.every = every
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self._start = time.monotonic()
        self._start_done = self.done
        self._drawn = float("-inf")  # the first update draws
        self._notes = ""
        self._written: tuple | None = None

    def line(self) -> str:
        """The bar as text: label, bar, count, seconds per unit, time left and notes."""
        frac = min(1.0, self.done / self.total)
        fill = round(frac * self.width)
        bar = "#" * fill + "-" * (self.width - fill)
        ran = self.done - self._start_done
        spent = time.monotonic() - self._start
        rate = f"{spent / ran:.2f} s/step" if ran > 0 else "-- s/step"
        left = format_seconds(spent / ran * (self.total - self.done)) if ran > 0 else "--"
        notes = f"  {self._notes}" if self._notes else ""
        return (f"{self.label:<12} [{bar}] {self.done:>{len(str(self.total))}}/{self.total} "
                f"{rate}  {left} left{notes}")

    def update(self, done: int, notes: str | None = None, *, force: bool = False) -> None:
        """Move to ``done`` (and replace the notes); draw when due or when ``force``."""
        self.done = int(done)
        if notes is not None:
            self._notes = notes
        now = time.monotonic()
        if self.tty:
            if force or now - self._drawn >= 0.2 or self.done >= self.total:
                self.stream.write("\r\x1b[K" + self.line())
                self.stream.flush()
                self._drawn = now
        elif force or now - self._drawn >= self.every:
            self.stream.write(self.line() + "\n")
            self.stream.flush()
            self._drawn = now
            self._written = (self.done, self._notes)

    def close(self, notes: str | None = None) -> None:
        """Draw the final state and end the line."""
        if notes is not None:
            self._notes = notes
        if not self.tty and self._written == (self.done, self._notes):
            return  # that line is already there
        self.stream.write(("\r\x1b[K" if self.tty else "") + self.line() + "\n")
        self.stream.flush()
