"""Reading a data file under the table's current schema, by field id (docs/PROTOCOL.md
§14.2).

A data file holds the columns of the schema it was written with (``DataFile.schema_id``),
under their *physical* names. For every current column, :func:`projection` says how to get
it from such a file: read physical column ``p`` (cast to the current type when the column
was widened since), or, when the file predates the column, take the column's
``initial_default`` (NULL when it has none). Columns dropped since are never read. Both read
paths use it: the masked Arrow scan (:func:`read_columns`) and DuckDB's Parquet reader
(:mod:`flightsrv.engine.relations` renders it as SQL).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from flightsrv.table.schema import physical_name, type_from_json, value_from_json
from flightsrv.table.stored import from_stored, needs_conversion, widen


@dataclass(frozen=True)
class ColumnRead:
    name: str  # the current (logical) column name
    type: pa.DataType  # its current type
    physical: str | None  # the column inside the file; None: the file predates the column
    file_type: pa.DataType | None  # its type inside the file
    default: Any = None  # Python value of the current type for rows of older files

    @property
    def cast(self) -> bool:
        """Whether the file's column needs converting: widened since, or stored as another
        type (a timestamp in seconds is stored in milliseconds, :mod:`.stored`)."""
        return self.physical is not None and (self.file_type != self.type
                                              or needs_conversion(self.file_type))


def _key(schema: dict) -> str:
    import json

    return json.dumps(schema, sort_keys=True)


@functools.lru_cache(maxsize=1024)
def _projection(current_key: str, file_key: str, columns: tuple[str, ...]) -> tuple:
    import json

    current, written = json.loads(current_key), json.loads(file_key)
    have = {int(f["id"]): f for f in written["fields"] if "id" in f}
    by_name = {f["name"]: f for f in current["fields"]}
    out = []
    for c in columns:
        f = by_name[c]
        t = type_from_json(f["type"])
        old = have.get(int(f["id"])) if "id" in f else written_by_name(written, c)
        if old is None:
            d = f.get("initial_default")
            out.append(ColumnRead(c, t, None, None,
                                  value_from_json(d, t).as_py() if d is not None else None))
        else:
            out.append(ColumnRead(c, t, physical_name(old), type_from_json(old["type"])))
    return tuple(out)


def written_by_name(schema: dict, name: str) -> dict | None:
    for f in schema["fields"]:
        if f["name"] == name:
            return f
    return None


def projection(manifest, schema_id: int, columns) -> tuple[ColumnRead, ...]:
    """How to read ``columns`` (current names) from a file written with ``schema_id``."""
    written = manifest.schema_by_id(schema_id)
    return _projection(_key(manifest.schema), _key(written), tuple(columns))


def identity(reads) -> bool:
    """Whether a projection is a plain read of same-named, same-typed columns."""
    return all(r.physical == r.name and not r.cast for r in reads)


def default_array(r: ColumnRead, n: int) -> pa.Array:
    if r.default is None:
        return pa.nulls(n, r.type)
    return pa.repeat(pa.scalar(r.default, r.type), n)


def read_columns(reads) -> list[str]:
    """The physical columns a projection reads from the file."""
    return [r.physical for r in reads if r.physical is not None]


def apply(table: pa.Table, reads) -> list[pa.Array]:
    """The projected columns from ``table`` (the file's physical columns)."""
    out = []
    n = table.num_rows
    for r in reads:
        if r.physical is None:
            out.append(default_array(r, n))
            continue
        col = table.column(r.physical)
        if r.cast:
            col = from_stored(col, r.file_type)
            if col.type != r.type:
                col = widen(col, r.type)
        out.append(col)
    return out


__all__ = ["ColumnRead", "apply", "default_array", "identity", "projection", "read_columns"]
