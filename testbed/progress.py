"""A one-line progress bar on stderr: round, loss, ε spent. Silent with --quiet."""

from __future__ import annotations

import sys
import time


class Progress:
    def __init__(self, total_rounds: int, enabled: bool = True, stream=None):
        self.total = max(1, total_rounds)
        self.enabled = enabled
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty()
        self.start = time.monotonic()
        self._last_decile = -1

    def update(self, round_done: int, loss: float, epsilon: float) -> None:
        if not self.enabled:
            return
        frac = round_done / self.total
        width = 30
        bar = "#" * int(frac * width) + "-" * (width - int(frac * width))
        line = (f"[{bar}] round {round_done}/{self.total}  loss {loss:.4f}  "
                f"eps {epsilon:.4g}  {time.monotonic() - self.start:.1f}s")
        if self.tty:
            self.stream.write("\r" + line)
            self.stream.flush()
        elif int(frac * 10) > self._last_decile:  # logs get a line per tenth, not a line per round
            self._last_decile = int(frac * 10)
            self.stream.write(line + "\n")

    def close(self) -> None:
        if self.enabled and self.tty:
            self.stream.write("\n")
