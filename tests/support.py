"""Helpers shared by several test modules (importable: pytest puts tests/ on sys.path)."""

from __future__ import annotations


class Hook:
    """A progress object that runs ``action`` once, on the first ``advance`` — for
    compaction: after it pinned its read version and before it commits."""

    def __init__(self, action):
        self.action, self.fired = action, False
        self.total, self.unit = None, ""

    def advance(self, n=1, note=""):
        if not self.fired:
            self.fired = True
            self.action()

    def finish(self):
        pass
