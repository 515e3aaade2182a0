"""SQL INSERT's assignment casts, made by DuckDB.

``INSERT INTO t ... VALUES / SELECT`` means what it means for a DuckDB table: DuckDB casts
each value to the column's type (``'12'`` into an INTEGER column is 12, ``1.5`` into a DOUBLE
column is 1.5, ``'x'`` into an INTEGER column is a conversion error naming the statement).
The engine runs the statement's query, then :func:`cast_to_table` streams its result through
``SELECT CAST(col AS <column type>) ...`` on a cursor of the same connection (same settings,
time zone included), so the table receives values already in its types and
:mod:`flightsrv.table.types` (the rules for Arrow data from the Python API, ingest and Spark)
sees only exact pairs.
"""

from __future__ import annotations

from collections.abc import Iterator

import duckdb
import pyarrow as pa

from flightsrv.errors import SqlError
from flightsrv.sql.types import sql_type_name

_SOURCE = "__insert_source"


def _ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def duckdb_type(t: pa.DataType) -> str | None:
    """The DuckDB type a column of Arrow type ``t`` is cast to, or None if DuckDB has none."""
    if pa.types.is_map(t):
        k, v = duckdb_type(t.key_type), duckdb_type(t.item_type)
        return None if k is None or v is None else f"MAP({k}, {v})"
    if pa.types.is_struct(t):
        inner = [(t.field(i).name, duckdb_type(t.field(i).type)) for i in range(t.num_fields)]
        if any(x is None for _, x in inner):
            return None
        return "STRUCT(" + ", ".join(f"{_ident(n)} {x}" for n, x in inner) + ")"
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        inner = duckdb_type(t.value_type)
        return None if inner is None else f"{inner}[]"
    try:
        return sql_type_name(t)
    except SqlError:
        return None


def cast_to_table(cursor: duckdb.DuckDBPyConnection, reader: pa.RecordBatchReader,
                  target: pa.Schema, *, sql: str, batch_size: int = 100_000
                  ) -> pa.RecordBatchReader:
    """``reader`` (columns named and ordered as ``target``) with every column DuckDB-cast to
    the target column's type. Takes ownership of ``cursor`` (closed when the stream ends)."""
    exprs, casts = [], 0
    for f, t in zip(target, reader.schema.types):
        name = duckdb_type(f.type)
        if name is None or t == f.type:
            exprs.append(_ident(f.name))
        else:
            exprs.append(f"CAST({_ident(f.name)} AS {name}) AS {_ident(f.name)}")
            casts += 1
    if not casts:
        cursor.close()
        return reader
    cursor.register(_SOURCE, reader)
    try:
        out = cursor.sql(f"SELECT {', '.join(exprs)} FROM {_SOURCE}").to_arrow_reader(batch_size)
    except duckdb.Error as e:
        cursor.close()
        raise SqlError(str(e).splitlines()[0], statement=sql) from None

    def batches() -> Iterator[pa.RecordBatch]:
        try:
            while True:
                try:
                    b = out.read_next_batch()
                except StopIteration:
                    return
                except (duckdb.Error, pa.ArrowException) as e:
                    raise SqlError(str(e).splitlines()[0], statement=sql) from None
                yield b
        finally:
            cursor.close()

    return pa.RecordBatchReader.from_batches(out.schema, batches())
