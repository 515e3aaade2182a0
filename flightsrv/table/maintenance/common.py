"""Shared pieces of maintenance: defaults, the logger, durations and progress."""

from __future__ import annotations

import datetime as dt
import logging


from flightsrv.errors import ConfigurationError, CorruptObject

log = logging.getLogger("flightsrv.maintenance")

DEFAULT_MIN_DELETED_FRACTION = 0.1
DEFAULT_SMALL_FILE_FRACTION = 0.5  # a file under half the target size is "small"
DEFAULT_SORT_GROUP_BYTES = 512 * 1024 * 1024  # largest input group sorted in memory
DEFAULT_GRACE = dt.timedelta(days=7)
#: key prefixes vacuum may delete from; everything else under the table prefix is left alone
VACUUM_PREFIXES = ("data/", "tombstone/", "chunks/")
#: stats recommends expiry above this many retained versions (table property overrides)
DEFAULT_MAX_VERSIONS = 100


def duration(seconds: float) -> dt.timedelta:
    """``seconds`` as a timedelta, a duration past the longest one Python holds (about 2.7
    million years) as that longest one: "keep everything" spelled as a huge number means the
    same thing, and must not fail with an OverflowError."""
    if seconds >= dt.timedelta.max.total_seconds():
        return dt.timedelta.max
    return dt.timedelta(seconds=seconds)


def _table_ctx(table) -> dict:
    return {"table": table.name}


def _overdue(table, result) -> list | None:
    """The erasure-deadline report of ``result`` (``erasures_overdue``). It reads every
    retained manifest, after the work is done (a compaction committed, objects deleted): an
    old manifest that cannot be read must not turn that work into a reported failure (a
    retry would repeat it), so the report is then None (unknown) and ``result.warnings``
    names the object."""
    from flightsrv.table.erasure_status import overdue_erasures

    try:
        return overdue_erasures(table)
    except CorruptObject as exc:
        result.warnings.append(f"erasure deadlines not checked: {exc}")
        log.warning("erasure deadlines not checked",
                    extra={"table": table.name, "error": str(exc)})
        return None


# ---------------------------------------------------------------------------------------
# helpers


def _seconds(value, what: str, table) -> float:
    if isinstance(value, dt.timedelta):
        s = value.total_seconds()
    elif isinstance(value, (int, float)):
        s = float(value)
    else:
        raise ConfigurationError(f"{what} must be a timedelta or seconds",
                                 table=getattr(table, "name", None), got=repr(value))
    if s < 0:
        raise ConfigurationError(f"{what} must not be negative",
                                 table=getattr(table, "name", None), seconds=s)
    return s


def _progress_start(progress, total: int | None, unit: str = "") -> None:
    if progress is not None:
        progress.total = total
        if unit:
            progress.unit = unit


def _progress_finish(progress) -> None:
    if progress is not None and hasattr(progress, "finish"):
        progress.finish()
