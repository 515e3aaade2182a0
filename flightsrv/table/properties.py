"""Table properties: the typed registry of every property flightsrv reads, and the one check
that every entry point runs before a property reaches a manifest.

A manifest stores properties as strings (docs/PROTOCOL.md §4). ``normalize`` parses each
value against its type and returns the canonical string that is stored, so readers never
meet a value they cannot parse: a size written ``64MB`` or ``1GiB`` is stored as its byte
count, a boolean as ``true``/``false``, a fraction as a plain decimal. ``Warehouse.create_table``
and ``Table.set_properties`` call it (and so does everything built on them: the CLI, SQL
``CREATE``/``ALTER TABLE ... SET``, Spark's ``option("property.<k>")``).

Names outside the registry are refused, naming the known ones, because a misspelt name would
otherwise be stored and silently ignored. Properties of your own (owner, team, lineage, ...)
go under the ``user.`` prefix, which flightsrv stores as given and never interprets.

Sizes: a number of bytes with an optional unit, case-insensitive, as DuckDB writes them:
``B``; ``KB``/``MB``/``GB``/``TB`` are powers of 1000; ``KiB``/``MiB``/``GiB``/``TiB`` are
powers of 1024 (``64MB`` = 64,000,000 bytes, ``64MiB`` = 67,108,864).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from flightsrv.errors import ConfigurationError

#: prefix of free-form properties of the user's own, stored as given
USER_PREFIX = "user."

_UNITS = {
    "": 1, "b": 1,
    "kb": 1000, "mb": 1000 ** 2, "gb": 1000 ** 3, "tb": 1000 ** 4,
    "kib": 1024, "mib": 1024 ** 2, "gib": 1024 ** 3, "tib": 1024 ** 4,
}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$")
_TRUE = {"true", "1", "yes", "on"}
_FALSE = {"false", "0", "no", "off"}


def parse_size(text, *, name: str = "size") -> int:
    """``64MB`` -> 64000000, ``1GiB`` -> 1073741824, ``4096`` -> 4096 (see module doc)."""
    if isinstance(text, bool):
        raise ConfigurationError(f"{name} must be a size such as 64MB or 1GiB", value=text)
    if isinstance(text, int):
        return text
    m = _SIZE.match(str(text))
    unit = _UNITS.get(m.group(2).lower()) if m else None
    if m is None or unit is None:
        raise ConfigurationError(
            f"{name} must be a size such as 64MB or 1GiB (units B, KB, MB, GB, TB, KiB, MiB, "
            "GiB, TiB)", value=text)
    value = float(m.group(1)) * unit
    if value != int(value):
        raise ConfigurationError(f"{name} is not a whole number of bytes", value=text)
    return int(value)


def format_size(n: int) -> str:
    """The shortest exact spelling of ``n`` bytes: ``256MiB``, ``64MB``, ``1000B``."""
    exact = [(n // _UNITS[u.lower()], u) for u in ("TiB", "GiB", "MiB", "KiB", "TB", "GB", "MB",
                                                    "KB") if n and n % _UNITS[u.lower()] == 0]
    if not exact:
        return f"{n}B"
    q, unit = min(exact, key=lambda e: e[0])
    return f"{q}{unit}"


@dataclass(frozen=True)
class Property:
    """One known property: its type, default (None: unset) and what reads it."""

    name: str
    kind: str  # size | int | fraction | bool | choice | columns | duration | formats
    default: Any
    help: str
    choices: tuple[str, ...] = ()
    minimum: int | None = None

    def parse(self, text, columns: list[str] | None = None) -> Any:
        """The typed value of ``text``; ConfigurationError naming the property if it does not
        fit. ``columns`` (the table's column names) checks a ``columns`` property."""
        raw = str(text).strip() if not isinstance(text, (int, float)) else text
        try:
            value = _PARSERS[self.kind](self, raw)
        except ConfigurationError as exc:
            raise ConfigurationError(exc.message, property=self.name, **exc.context) from None
        if self.kind == "columns" and columns is not None:
            missing = [c for c in value if c not in columns]
            if missing:
                raise ConfigurationError("property names columns the table does not have",
                                         property=self.name, missing=",".join(missing),
                                         columns=",".join(columns))
        return value

    def to_text(self, value) -> str:
        """The canonical stored string of a parsed value."""
        if self.kind == "bool":
            return "true" if value else "false"
        if self.kind in ("columns", "formats"):
            return ",".join(value)
        return str(value)

    def describe_default(self) -> str:
        if self.default is None:
            return "unset"
        if self.kind == "size":
            return format_size(self.default)
        return self.to_text(self.default)


def _int(p: Property, raw) -> int:
    if isinstance(raw, bool):
        raise ConfigurationError("must be a whole number", value=raw)
    try:
        v = int(raw)
    except (TypeError, ValueError):
        raise ConfigurationError("must be a whole number", value=raw) from None
    return _at_least(p, v, raw)


def _at_least(p: Property, v: int, raw) -> int:
    if p.minimum is not None and v < p.minimum:
        raise ConfigurationError(f"must be at least {p.minimum}", value=raw)
    return v


def _size(p: Property, raw) -> int:
    return _at_least(p, parse_size(raw, name="value"), raw)


def _fraction(p: Property, raw) -> float:
    try:
        v = float(raw)
    except (TypeError, ValueError):
        raise ConfigurationError("must be a number between 0 and 1", value=raw) from None
    if not 0 <= v <= 1:
        raise ConfigurationError("must be a number between 0 and 1", value=raw)
    return v


def _bool(p: Property, raw) -> bool:
    if isinstance(raw, bool):
        return raw
    s = str(raw).lower()
    if s in _TRUE:
        return True
    if s in _FALSE:
        return False
    raise ConfigurationError("must be true or false", value=raw)


def _choice(p: Property, raw) -> str:
    s = str(raw).lower()
    if s not in p.choices:
        raise ConfigurationError(f"must be one of {'|'.join(p.choices)}", value=raw)
    return s


_DURATION = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([wdhms])?\s*")


def _duration(p: Property, raw) -> str:
    """A duration such as ``4w``, ``30d``, ``12h``, ``90m``, ``3600s`` (a bare number: days), kept
    as written (lower case); readers convert it (``erasure_status.parse_duration_ms``)."""
    text = str(raw).strip().lower()
    if isinstance(raw, bool) or not _DURATION.fullmatch(text):
        raise ConfigurationError("must be a duration such as 4w, 30d, 12h, 90m or 3600s",
                                 value=raw)
    return text


def _formats(p: Property, raw) -> list[str]:
    """A comma-separated subset of ``p.choices`` (``all``: every one), canonical order."""
    names = [c.strip().lower() for c in str(raw).split(",") if c.strip()]
    if not names or any(n not in p.choices + ("all",) for n in names):
        raise ConfigurationError(f"must be a comma-separated list of {'|'.join(p.choices)} "
                                 "(or all)", value=raw)
    return [c for c in p.choices if c in names or "all" in names]


def _columns(p: Property, raw) -> list[str]:
    cols = [c.strip() for c in str(raw).split(",")]
    if not raw or any(not c for c in cols):
        raise ConfigurationError("must be a comma-separated list of column names", value=raw)
    return cols


_PARSERS: dict[str, Callable[[Property, Any], Any]] = {
    "size": _size, "int": _int, "fraction": _fraction, "bool": _bool, "choice": _choice,
    "columns": _columns, "duration": _duration, "formats": _formats,
}

#: every property flightsrv reads, by name
PROPERTIES: dict[str, Property] = {p.name: p for p in (
    Property("target_file_size", "size", 256 * 1024 ** 2,
             "data files roll over at this size (writes, compaction)", minimum=1),
    Property("row_group_bytes", "size", 16 * 1024 ** 2,
             "uncompressed bytes per Parquet row group", minimum=1),
    Property("row_group_rows", "int", 122_880,
             "at most this many rows per Parquet row group (DuckDB's own row-group size): a "
             "point read decodes one row group of the column it filters on",
             minimum=1024),
    Property("data_page_bytes", "size", 128 * 1024,
             "uncompressed bytes per Parquet data page (a point read decodes one page per "
             "column, not the row group's)", minimum=4096),
    Property("compression", "choice", "auto",
             "Parquet codec of new data files (auto: ZSTD for each column it shrinks by more "
             "than a fifth in a sample of the first rows, Snappy for the others)",
             choices=("auto", "zstd", "snappy", "gzip", "brotli", "lz4", "none")),
    Property("delete_mode", "choice", "dv",
             "how DELETE removes rows: deletion vectors, or splice (physical erasure)",
             choices=("dv", "splice")),
    Property("sort_key", "columns", None,
             "the columns the table is appended in order of (documents range deletes)"),
    Property("compact.min_deleted_fraction", "fraction", 0.1,
             "compaction rewrites files with more than this fraction of rows deleted"),
    Property("compact.small_file_fraction", "fraction", 0.5,
             "files under this fraction of target_file_size are small and get bin-packed"),
    Property("auto_compact", "bool", True,
             "background maintenance (the server's worker, writers with maintain=True) "
             "compacts this table's small files and coalesces its DVs (docs/MAINTENANCE.md)"),
    Property("auto_compact.min_small_files", "int", 16,
             "automatic compaction starts when the table has this many small files",
             minimum=2),
    Property("auto_compact.max_bytes", "size", 64 * 1024 ** 2,
             "bytes of small files one automatic compaction rewrites at most (smallest "
             "first)", minimum=1),
    Property("auto_compact.min_dv_objects", "int", 16,
             "automatic maintenance coalesces DVs when they are spread over this many "
             "tombstone objects", minimum=2),
    Property("maintenance.max_versions", "int", 100,
             "table stats recommend expiry above this many retained versions", minimum=1),
    Property("vacuum.allow_short_grace", "bool", False,
             "allow VACUUM with a grace period under 1 hour (only when no writer is active)"),
    Property("erasure.deadline", "duration", "30d",
             "how long deleted rows' bytes may stay stored before erasure-status, VACUUM "
             "and OPTIMIZE report them overdue"),
    Property("erasure.orphan_grace", "duration", "1h",
             "PURGE ... EXPIRE deletes unreferenced objects older than this"),
    Property("publish.formats", "formats", None,
             "publish every commit as these open formats (delta, iceberg or all), best "
             "effort, after the commit (docs/INTEROP.md)", choices=("delta", "iceberg")),
    Property("inline.max_rows", "int", 0,
             "appends of at most this many rows are inlined into the manifest chunks "
             "instead of a Parquet file each (0: off; docs/PROTOCOL.md §18)", minimum=0),
    Property("inline.max_bytes", "size", 64 * 1024,
             "an append is inlined only while its encoded bytes stay at most this",
             minimum=1),
    Property("inline.flush_rows", "int", 10000,
             "inlined rows are flushed into a Parquet file once a version holds more than "
             "this many", minimum=1),
    Property("inline.flush_files", "int", 64,
             "inlined appends are flushed into a Parquet file once a version holds more "
             "than this many", minimum=1),
    Property("publish.delta.checkpoint_interval", "int", 100,
             "the Delta mirror writes a checkpoint every this many versions", minimum=1),
)}


def known_names() -> str:
    return ",".join(sorted(PROPERTIES))


def check_name(name: str) -> Property | None:
    """The registry entry of ``name``; None for a ``user.`` property; ConfigurationError for
    anything else."""
    if not isinstance(name, str) or not name:
        raise ConfigurationError("a property name must be a non-empty string", name=repr(name))
    if name.startswith(USER_PREFIX) and len(name) > len(USER_PREFIX):
        return None
    prop = PROPERTIES.get(name)
    if prop is None:
        raise ConfigurationError(
            f"unknown table property (use the {USER_PREFIX} prefix for properties of your own)",
            property=name, known=known_names())
    return prop


def normalize(props: Mapping[str, Any] | None, columns: list[str] | None = None,
              *, table: str | None = None) -> dict[str, str]:
    """Check every ``name: value`` and return the canonical strings to store. ``columns``
    are the table's column names (checked by column-list properties). Raises
    ConfigurationError naming the table, the property and the value."""
    out: dict[str, str] = {}
    for name, value in (props or {}).items():
        try:
            prop = check_name(name)
            if prop is None:
                if value is None:
                    raise ConfigurationError("a property value must not be None", property=name)
                out[name] = str(value)
            else:
                out[name] = prop.to_text(prop.parse(value, columns))
        except ConfigurationError as exc:
            raise ConfigurationError(f"invalid table property: {exc.message}", table=table,
                                     **exc.context) from None
    return out


def value(props: Mapping[str, str], name: str) -> Any:
    """The typed value of known property ``name`` in a manifest's ``props``, or its default.
    Values stored before the registry existed are parsed leniently (``64MB`` works)."""
    prop = PROPERTIES[name]
    raw = props.get(name)
    if raw is None:
        return prop.default
    return prop.parse(raw)
