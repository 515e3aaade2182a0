"""Writing results: ``--format table|csv|json|jsonl|parquet`` and ``--output FILE``.

- ``table``: an aligned text table for people, at most ``--max-rows`` rows (it says so when
  it stopped early), then ``(N rows)``.
- ``csv``: a header line, then RFC 4180 rows (pyarrow's CSV writer), streamed; NULL is an
  empty field, an empty string is ``""``, binary is ``\\x`` and lower-case hex.
- In every text format a date, timestamp or time that Python's ``datetime`` cannot hold (BC,
  a year past 9999, ±infinity, ``24:00:00``) is spelled by DuckDB (``CAST(v AS VARCHAR)``:
  ``infinity``, ``0044-03-15 (BC)``), which its casts, and so ``table append``, read back
  (``_DuckSpelling``); the values Python holds keep the format's own spelling.
- ``jsonl``: one JSON object per row, streamed. Timestamps and dates are ISO 8601 strings,
  decimals are strings (exact), binary is base64, NaN/Infinity are strings, a map is an
  object whose keys are its keys as text (as DuckDB's ``to_json`` writes it).
- ``json``: the same objects as one JSON array (DuckDB's CLI ``-json``), streamed.
- ``parquet``: one Parquet file (zstd); needs ``--output`` or a redirected stdout.
- ``line``: one ``column | value`` line per column, records under ``-[ RECORD n ]-`` (psql's
  ``\\x``, duckdb's ``.mode line``), for wide rows; ``table`` switches to it by itself when
  ``args.max_width`` is set and the table would be wider (the shell's ``\\x auto``).

``--output FILE`` is written to a temporary name next to it and renamed when complete, so a
failed or interrupted command leaves no file, and never half of one.
"""

from __future__ import annotations

import base64
import contextlib
import datetime as dt
import decimal
import json
import math
import os
import sys
from typing import Iterator

import pyarrow as pa
import pyarrow.compute as pc

from flightsrv.cli.common import UsageError, is_temporal

FORMATS = ("table", "csv", "json", "jsonl", "parquet", "line")
DEFAULT_MAX_ROWS = 1000
_MAX_CELL = 80


def add_output_options(parser, *, default: str = "table") -> None:
    g = parser.add_argument_group("output")
    g.add_argument("--format", choices=FORMATS, default=default,
                   help="result format: an aligned table, CSV, a JSON array, JSON lines, "
                   "Parquet, or line: a record per row, a line per column")
    g.add_argument("--output", "-o", metavar="FILE",
                   help="write the result to FILE (atomically) instead of stdout")
    g.add_argument("--max-rows", type=int, default=DEFAULT_MAX_ROWS, metavar="N",
                   help="rows shown by --format table or line (0: all); other formats write "
                   "every row")


def check_output_args(args) -> None:
    """Usage errors found before anything runs."""
    if getattr(args, "max_rows", 0) < 0:
        raise UsageError("--max-rows must be 0 or more")
    if args.format == "parquet" and not args.output and sys.stdout.isatty():
        raise UsageError("parquet is binary: give --output FILE or redirect stdout")
    out = args.output
    if out:
        parent = os.path.dirname(os.path.abspath(out))
        if not os.path.isdir(parent):
            raise UsageError(f"--output: no such directory: {parent}")
        if os.path.isdir(out):
            raise UsageError(f"--output: {out} is a directory")


@contextlib.contextmanager
def _binary_target(output: str | None):
    """A binary stream for the result: a temp file renamed to ``output`` on success (removed
    on failure), or stdout."""
    if output is None:
        sys.stdout.flush()
        yield sys.stdout.buffer
        sys.stdout.buffer.flush()
        return
    tmp = os.path.join(os.path.dirname(os.path.abspath(output)),
                       f".{os.path.basename(output)}.{os.getpid()}.partial")
    f = open(tmp, "wb")
    try:
        yield f
        f.close()
        os.replace(tmp, output)
    except BaseException:
        f.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def _is_interval(t: pa.DataType) -> bool:
    return pa.types.is_duration(t) or t == pa.month_day_nano_interval()


def _intervals_as_text(reader: pa.RecordBatchReader) -> pa.RecordBatchReader:
    """``reader`` with its top-level duration and interval columns as DuckDB's text of the
    INTERVAL it reads them as (``00:01:30``, ``1 month 2 days``): what DuckDB shows, and
    what ``table append`` reads back into such a column, in every text format (they were
    seconds, microseconds, a timedelta or a Python repr, by format)."""
    schema = reader.schema
    cols = [i for i, f in enumerate(schema) if _is_interval(f.type)]
    if not cols:
        return reader
    import duckdb

    from flightsrv.errors import ConfigurationError

    out_schema = schema
    for i in cols:
        out_schema = out_schema.set(i, pa.field(schema[i].name, pa.string(),
                                                schema[i].nullable, schema[i].metadata))

    def batches():
        con = duckdb.connect(":memory:")
        try:
            for batch in reader:
                arrays = list(batch.columns)
                for i in cols:
                    con.register("_iv", pa.table({"v": batch.column(i)}))
                    try:
                        arrays[i] = con.sql("SELECT CAST(v AS VARCHAR) FROM _iv") \
                            .to_arrow_table().column(0).combine_chunks()
                    except duckdb.Error as exc:  # a duration no INTERVAL holds
                        raise ConfigurationError(
                            "a value of this column is a duration DuckDB's INTERVAL cannot "
                            f"hold, so no text shows it ({str(exc).splitlines()[0]}); use "
                            "--format parquet", column=schema[i].name) from None
                    finally:
                        con.unregister("_iv")
                yield pa.RecordBatch.from_arrays(arrays, schema=out_schema)
        finally:
            con.close()

    return pa.RecordBatchReader.from_batches(out_schema, batches())


def write_json_documents(docs: list, args) -> int:
    """``--json``: each document as one line of JSON, to ``--output`` or stdout (``--json``
    is its own format: with another ``--format`` it is a usage error)."""
    if getattr(args, "format", "table") not in (None, "table"):
        raise UsageError("--json and --format exclude each other (--json is its own format)")
    with _binary_target(getattr(args, "output", None)) as out:
        for doc in docs:
            out.write((json.dumps(doc, sort_keys=True, default=str) + "\n").encode("utf-8"))
    return len(docs)


def write_result(reader: pa.RecordBatchReader, args) -> int:
    """Write every batch of ``reader`` in ``args.format`` to ``args.output`` or stdout;
    returns the number of rows written."""
    fmt = args.format
    if fmt != "parquet":
        reader = _intervals_as_text(reader)
    with _binary_target(getattr(args, "output", None)) as out:
        if fmt in ("table", "line"):
            return _write_table(reader, out, getattr(args, "max_rows", DEFAULT_MAX_ROWS),
                                vertical=fmt == "line",
                                max_width=getattr(args, "max_width", None),
                                hint=getattr(args, "more_hint", None) or MORE_HINT)
        if fmt == "csv":
            return _write_csv(reader, out)
        if fmt == "jsonl":
            return _write_jsonl(reader, out)
        if fmt == "json":
            return _write_json(reader, out)
        if fmt == "parquet":
            return _write_parquet(reader, out)
    raise UsageError(f"unknown format {fmt}")


def write_rows(rows: list[dict], args, columns=None) -> int:
    """``write_result`` for a small list of dicts (summaries, listings). ``columns``: the
    columns to show when there are no rows (text columns then). JSON lines keep each value's
    own type (a metric/value listing mixes numbers, booleans and text)."""
    if args.format in ("json", "jsonl"):
        cols = list(dict.fromkeys([*(columns or ()), *(k for r in rows for k in r)]))
        array = args.format == "json"
        with _binary_target(getattr(args, "output", None)) as out:
            for i, r in enumerate(rows):
                row = {c: _plain(r.get(c)) for c in cols}
                text = json.dumps(_finite(row), default=_json_default, ensure_ascii=False,
                                  allow_nan=False)
                if array:
                    text = ("[" if i == 0 else ",\n") + text
                else:
                    text += "\n"
                out.write(text.encode("utf-8"))
            if array:
                out.write(b"]\n" if rows else b"[]\n")
        return len(rows)
    if not rows and columns:
        table = pa.table({c: pa.array([], pa.string()) for c in columns})
    elif rows:
        cols = list(dict.fromkeys(k for r in rows for k in r))
        data = {c: [_plain(r.get(c)) for r in rows] for c in cols}
        for c, values in data.items():  # a column of mixed types becomes text
            if len({type(v) for v in values if v is not None and v != ""}) > 1 \
                    or any(v == "" for v in values):
                data[c] = [None if v is None else _text(v) for v in values]
        table = pa.table(data)
    else:
        table = pa.table({})
    return write_result(table.to_reader(), args)


def _text(v) -> str:
    """A value of a mixed listing column as text: booleans as SQL spells them."""
    if isinstance(v, bool):
        return "true" if v else "false"
    return str(v)


def _plain(v):
    """Nested values become JSON text, so a listing always fits flat columns."""
    if isinstance(v, (dict, list, tuple)):
        return json.dumps(v, default=str)
    return v


# -- values Python's datetime cannot hold -------------------------------------------------


class _DuckSpelling:
    """DuckDB's text for the dates, timestamps and times of a batch that Python's
    ``datetime`` cannot hold: BC, years past 9999, ±infinity (DuckDB's and the table
    format's, docs/PROTOCOL.md §4.3), ``24:00:00``. Which values those are and how they read
    is DuckDB's to say, never a calendar of ours: it answers ``CAST(v AS VARCHAR)`` for the
    values outside Python's range (``infinity``, ``0044-03-15 (BC)``,
    ``10000-01-01 00:00:00+00``; time zone aware ones in the column's zone), which its own
    casts (``table append``'s CSV and JSON lines) read back. A context manager: one
    in-memory DuckDB connection, opened at the first temporal column."""

    def __init__(self):
        self._con = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if self._con is not None:
            self._con.close()
            self._con = None

    def columns(self, batch: pa.RecordBatch) -> dict[int, pa.Array]:
        """For each top-level temporal column of ``batch`` holding such a value: a string
        array, DuckDB's text where Python cannot hold the value, NULL elsewhere."""
        out = {}
        for i, f in enumerate(batch.schema):
            col = batch.column(i)
            if is_temporal(f.type) and col.null_count < len(col):
                spelled = self._spell(col)
                if spelled.null_count < len(spelled):
                    out[i] = spelled
        return out

    def nested(self, batch: pa.RecordBatch) -> dict[int, list]:
        """The Python values of each list, struct or map column of ``batch`` that holds a
        date, timestamp or time: as Python holds them, or, when some value is one Python
        cannot hold, every row as DuckDB's ``to_json`` reads it (a date or timestamp as its
        text, ``"infinity"``), parsed (``[DATE 'infinity']`` is ``["infinity"]``). Each
        column is converted once."""
        import duckdb

        out = {}
        for i, f in enumerate(batch.schema):
            col = batch.column(i)
            if not _nested_temporal(f.type) or col.null_count == len(col):
                continue
            try:
                out[i] = col.to_pylist(maps_as_pydicts="strict")
                continue
            except (OverflowError, ValueError):
                pass
            if self._con is None:
                self._con = duckdb.connect(":memory:")
            self._con.register("_spell", pa.table({"i": pa.array(range(len(col)), pa.int64()),
                                                   "v": col}))
            try:
                got = self._con.sql("SELECT CAST(to_json(v) AS VARCHAR) FROM _spell "
                                    "ORDER BY i").fetchall()
            finally:
                self._con.unregister("_spell")
            out[i] = [None if t is None else json.loads(t) for (t,) in got]
        return out

    def rows(self, batch: pa.RecordBatch) -> list[dict]:
        """``batch.to_pylist()``, with DuckDB's text for the values Python cannot hold."""
        spelled = self.columns(batch)
        nested = self.nested(batch)
        if not spelled and not nested:
            return batch.to_pylist(maps_as_pydicts="strict")
        cols = []
        for i, col in enumerate(batch.columns):
            s = spelled.get(i)
            if i in nested:
                cols.append(nested[i])
            elif s is None:
                cols.append(col.to_pylist(maps_as_pydicts="strict"))
            else:
                cols.append([v if t is None else t for v, t in
                             zip(_without(col, s).to_pylist(), s.to_pylist(), strict=True)])
        names = batch.schema.names
        return [dict(zip(names, values, strict=True)) for values in zip(*cols, strict=True)]

    def _spell(self, col: pa.Array) -> pa.Array:
        import duckdb

        if self._con is None:
            self._con = duckdb.connect(":memory:")
        con = self._con
        tz = getattr(col.type, "tz", None)
        if tz is not None:  # a TIMESTAMPTZ's local time and text are in the session's zone
            try:
                con.execute(f"SET TimeZone = '{tz.replace(chr(39), '')}'")
            except duckdb.Error:
                con.execute("SET TimeZone = 'UTC'")
        # DuckDB has no isfinite(TIMESTAMPTZ_NS): ask it of the microsecond value
        v = "CAST(v AS TIMESTAMPTZ)" if tz is not None and col.type.unit == "ns" else "v"
        held = ("v < TIME '24:00:00'" if pa.types.is_time(col.type)
                else f"isfinite({v}) AND CAST(v AS TIMESTAMP) >= TIMESTAMP '0001-01-01' "
                "AND CAST(v AS TIMESTAMP) < TIMESTAMP '10000-01-01'")
        con.register("_spell", pa.table({"i": pa.array(range(len(col)), pa.int64()),
                                         "v": col}))
        try:
            got = con.sql(f"SELECT CASE WHEN v IS NULL OR ({held}) THEN NULL "
                          "ELSE CAST(v AS VARCHAR) END FROM _spell ORDER BY i").to_arrow_table()
        finally:
            con.unregister("_spell")
        return got.column(0).combine_chunks()


def _nested_temporal(t: pa.DataType) -> bool:
    """A list, struct or map type holding a date, timestamp or time at any depth."""
    if pa.types.is_struct(t):
        return any(is_temporal(t.field(i).type) or _nested_temporal(t.field(i).type)
                   for i in range(t.num_fields))
    if pa.types.is_map(t):
        return any(is_temporal(x) or _nested_temporal(x) for x in (t.key_type, t.item_type))
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        return is_temporal(t.value_type) or _nested_temporal(t.value_type)
    return False


def _without(col: pa.Array, spelled: pa.Array) -> pa.Array:
    """``col`` with NULL where ``spelled`` has DuckDB's text (Python converts the rest)."""
    return pc.if_else(pc.is_null(spelled), col, pa.nulls(len(col), col.type))


# -- table -------------------------------------------------------------------------


def _cell(v) -> str:
    if v is None:
        return "NULL"
    if isinstance(v, bool):  # as DuckDB and --format csv spell it
        s = "true" if v else "false"
    elif isinstance(v, dt.datetime):
        s = v.isoformat(sep=" ")
    elif isinstance(v, (bytes, bytearray)):
        s = "\\x" + bytes(v).hex()
    elif isinstance(v, float):
        s = repr(v)
    elif isinstance(v, (dict, list)):
        s = json.dumps(_finite(v), default=_json_default, ensure_ascii=False)
    else:
        s = str(v)
    s = s.replace("\n", "\\n").replace("\t", " ")
    return s if len(s) <= _MAX_CELL else s[:_MAX_CELL - 1] + "…"


#: what a cut table's footer suggests (the shell names its own commands)
MORE_HINT = "--max-rows 0 for all, or --format csv"


def _write_table(reader: pa.RecordBatchReader, out, max_rows: int, *, vertical: bool = False,
                 max_width: int | None = None, hint: str = MORE_HINT) -> int:
    names = reader.schema.names
    numeric = [pa.types.is_integer(f.type) or pa.types.is_floating(f.type)
               or pa.types.is_decimal(f.type) for f in reader.schema]
    rows: list[list[str]] = []
    more = False
    with _DuckSpelling() as spell:
        for batch in reader:
            if max_rows:
                batch = batch.slice(0, max_rows + 1 - len(rows))
            for row in spell.rows(batch):
                if max_rows and len(rows) >= max_rows:
                    more = True
                    break
                rows.append([_cell(row[n]) for n in names])
            if more:
                break
    enc = "utf-8"
    if not names:
        out.write(b"(no columns)\n")
        return 0
    widths = [max(len(n), *(len(r[i]) for r in rows)) if rows else len(n)
              for i, n in enumerate(names)]
    if vertical or (max_width and rows and sum(widths) + 2 * (len(widths) - 1) > max_width):
        _write_vertical(names, rows, out)
        return _write_footer(out, len(rows), more, hint)

    def line(cells):
        return "  ".join(c.rjust(w) if num else c.ljust(w)
                         for c, w, num in zip(cells, widths, numeric, strict=True)).rstrip() + "\n"

    out.write(line(names).encode(enc))
    out.write(("  ".join("-" * w for w in widths) + "\n").encode(enc))
    for r in rows:
        out.write(line(r).encode(enc))
    return _write_footer(out, len(rows), more, hint)


def _write_vertical(names: list[str], rows: list[list[str]], out) -> None:
    width = max(len(n) for n in names)
    for i, r in enumerate(rows, 1):
        out.write(f"-[ RECORD {i} ]-\n".encode())
        for n, c in zip(names, r, strict=True):
            out.write(f"{n.ljust(width)} | {c}\n".encode())


def _write_footer(out, n: int, more: bool, hint: str = MORE_HINT) -> int:
    if more:
        out.write(f"({n} rows shown; more rows were not read: use {hint})\n".encode())
    else:
        out.write(f"({n} row{'' if n == 1 else 's'})\n".encode())
    return n


# -- csv ---------------------------------------------------------------------------


def _write_csv(reader: pa.RecordBatchReader, out) -> int:
    import pyarrow.csv as pcsv

    from flightsrv.errors import ConfigurationError

    for f in reader.schema:
        if pa.types.is_nested(f.type):
            raise ConfigurationError("CSV cannot hold a nested column; use --format jsonl or "
                                     "parquet", column=f.name, type=str(f.type))
    binary = [i for i, f in enumerate(reader.schema) if _is_binary(f.type)]
    schema = reader.schema
    for i in binary:  # binary values are written as \\x<hex>, as --format table shows them
        schema = schema.set(i, pa.field(schema.field(i).name, pa.string()))
    # the header, then each batch on its own: a batch with values that DuckDB spells has text
    # in those columns (quoted, as pyarrow writes text)
    pcsv.write_csv(schema.empty_table(), out)
    rows = pcsv.WriteOptions(include_header=False)
    n = 0
    with _DuckSpelling() as spell:
        for batch in reader:
            cols = list(batch.columns)
            for i in binary:
                cols[i] = pa.array([None if v is None else "\\x" + v.hex()
                                    for v in cols[i].to_pylist()], pa.string())
            for i, spelled in spell.columns(batch).items():
                text = pc.cast(_without(cols[i], spelled), pa.string())
                cols[i] = pc.if_else(pc.is_null(spelled), text, spelled)
            batch = pa.record_batch(cols, names=schema.names)
            pcsv.write_csv(batch, out, rows)
            n += batch.num_rows
    return n


def _is_binary(t: pa.DataType) -> bool:
    return pa.types.is_binary(t) or pa.types.is_large_binary(t) or \
        pa.types.is_fixed_size_binary(t) or pa.types.is_binary_view(t)


# -- jsonl -------------------------------------------------------------------------


def _json_default(v):
    if isinstance(v, (dt.datetime, dt.date, dt.time)):
        return v.isoformat()
    if isinstance(v, decimal.Decimal):
        return str(v)
    if isinstance(v, (bytes, bytearray)):
        return base64.b64encode(bytes(v)).decode()
    if isinstance(v, dt.timedelta):
        return v.total_seconds()
    return str(v)


def _key(k) -> str:
    """A map key as a JSON object key, spelled as DuckDB's ``to_json`` spells it."""
    if isinstance(k, str):
        return k
    if isinstance(k, bool):
        return "true" if k else "false"
    if isinstance(k, float):
        return json.dumps(_finite(k), default=_json_default, allow_nan=False).strip('"')
    return str(_json_default(k)) if not isinstance(k, int) else str(k)


def _finite(v):
    if isinstance(v, float) and not math.isfinite(v):
        return "NaN" if math.isnan(v) else ("Infinity" if v > 0 else "-Infinity")
    if isinstance(v, dict):
        return {_key(k): _finite(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_finite(x) for x in v]
    return v


def jsonl_lines(reader: pa.RecordBatchReader) -> Iterator[str]:
    with _DuckSpelling() as spell:
        for batch in reader:
            # a map is a JSON object, as DuckDB writes it (and reads it back into a MAP column)
            for row in spell.rows(batch):
                yield json.dumps(_finite(row), default=_json_default, ensure_ascii=False,
                                 allow_nan=False) + "\n"


def _write_jsonl(reader: pa.RecordBatchReader, out) -> int:
    n = 0
    for text in jsonl_lines(reader):
        out.write(text.encode("utf-8"))
        n += 1
    return n


def _write_json(reader: pa.RecordBatchReader, out) -> int:
    """The rows as one JSON array, an object a line (``[]`` for none)."""
    n = 0
    for text in jsonl_lines(reader):
        out.write((("[" if n == 0 else ",\n") + text.rstrip("\n")).encode("utf-8"))
        n += 1
    out.write(b"]\n" if n else b"[]\n")
    return n


# -- parquet -----------------------------------------------------------------------


def _write_parquet(reader: pa.RecordBatchReader, out) -> int:
    import pyarrow.parquet as pq

    n = 0
    with pq.ParquetWriter(out, reader.schema, compression="zstd") as w:
        for batch in reader:
            w.write_batch(batch)
            n += batch.num_rows
    return n
