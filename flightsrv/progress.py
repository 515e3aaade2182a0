"""Progress for long-running CLI work: a bar on a terminal, periodic lines otherwise.

The last line says how the work ended: ``done in 1.2s``, ``failed after 1.2s: <error>`` or
``interrupted after 1.2s``. ``finish()`` works that out itself when it is called while an
exception propagates (from a ``finally`` or ``__exit__``), and only the first call counts.
"""

from __future__ import annotations

import sys
import time


class Progress:
    def __init__(self, label: str, total: int | None = None, *, stream=None, unit: str = ""):
        self.label = label
        self.total = total
        self.done = 0
        self.unit = unit
        self.stream = stream or sys.stderr
        self.tty = hasattr(self.stream, "isatty") and self.stream.isatty()
        self._last = 0.0
        self._start = time.monotonic()
        self.outcome: str | None = None  # done | failed | interrupted, once finished

    def __enter__(self) -> "Progress":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.finish(exc)

    def advance(self, n: int = 1, note: str = "") -> None:
        self.done += n
        now = time.monotonic()
        if now - self._last < (0.1 if self.tty else 2.0) and (self.total is None
                                                               or self.done < self.total):
            return
        self._last = now
        self._render(note)

    def _render(self, note: str = "") -> None:
        if self.total:
            frac = min(1.0, self.done / self.total)
            bar = "#" * int(frac * 30)
            text = f"{self.label} [{bar:<30}] {self.done}/{self.total}{self.unit} {note}"
        elif self.done or self.unit:
            text = f"{self.label} {self.done}{self.unit} {note}"
        else:  # nothing counted yet, and no unit to say what: no bare "0"
            text = f"{self.label} {note}"
        if self.tty:
            self.stream.write("\r" + text[:120].ljust(120))
        else:
            self.stream.write(text + "\n")
        self.stream.flush()

    def finish(self, error: BaseException | None = None) -> None:
        """Render the final line once: done, failed (with the error) or interrupted."""
        if self.outcome is not None:
            return
        if error is None:
            error = sys.exc_info()[1]  # called from a finally block while an error propagates
        took = time.monotonic() - self._start
        if error is None:
            self.outcome, note = "done", f"done in {took:.1f}s"
        elif isinstance(error, KeyboardInterrupt):
            self.outcome, note = "interrupted", f"interrupted after {took:.1f}s"
        else:
            text = " ".join(str(error).split()) or type(error).__name__
            self.outcome, note = "failed", f"failed after {took:.1f}s: {text[:200]}"
        self._render(note)
        if self.tty:
            self.stream.write("\n")
        self.stream.flush()


def print_table(rows: list[dict], stream=None) -> None:
    """A plain aligned table of dicts (summary tables at the end of CLI work)."""
    stream = stream or sys.stdout
    if not rows:
        stream.write("(no rows)\n")
        return
    cols = list(dict.fromkeys(k for r in rows for k in r))
    widths = {c: max(len(str(c)), *(len(str(r.get(c, ""))) for r in rows)) for c in cols}
    stream.write("  ".join(str(c).ljust(widths[c]) for c in cols) + "\n")
    stream.write("  ".join("-" * widths[c] for c in cols) + "\n")
    for r in rows:
        stream.write("  ".join(str(r.get(c, "")).ljust(widths[c]) for c in cols) + "\n")
