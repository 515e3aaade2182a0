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


# Modules a test's worker process needs; the fork server imports them once.
_PRELOAD = ["pyarrow", "pyarrow.parquet", "pyarrow.compute", "duckdb", "sqlglot",
            "flightsrv.store.s3", "flightsrv.store.local", "flightsrv.warehouse",
            "flightsrv.engine.duck", "flightsrv.table.maintenance", "flightsrv.table.erase"]


def worker_processes():
    """The ``multiprocessing`` context for the separate writer/crasher processes tests start.

    A fork server that imported flightsrv, pyarrow and DuckDB once forks each process, so it
    starts at once instead of importing them again (about a second of CPU per process on the
    2-core CI machine, a minute over the suite). Each is still its own fresh process: the
    fork server holds no table, connection, thread or store, only the imported modules, and
    the test's function, arguments and ``sys.path`` reach it as with ``spawn``."""
    import multiprocessing as mp

    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(_PRELOAD)  # no effect once this worker's server runs
    return ctx
