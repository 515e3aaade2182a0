"""What every command shares: the argument parser with its global options, exit codes, opening
the warehouse (read-only commands never create one), input files, durations and secrets.

Exit codes: 0 success; 1 the command ran and failed (no such table, a SQL error, a taken
port, the store refused); 2 the command line is wrong (``UsageError``: unknown option, bad
value, missing input file), and nothing was touched; 130 interrupted (Ctrl-C).
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import threading

from flightsrv.errors import ConfigurationError, FlightsrvError

DEFAULT_WAREHOUSE = "./warehouse"
EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130
LOG_LEVELS = ("debug", "info", "warning", "error")

#: set by ``main``'s SIGINT handler when Ctrl-C comes. An error raised after it is the
#: interrupt's doing: DuckDB turns the signal into its own error (``RuntimeError: Query
#: interrupted``) when it arrives during a query, and the command exits 130 all the same
CTRL_C = threading.Event()


class UsageError(ConfigurationError):
    """The command line itself is wrong (exit code 2); nothing was read or written."""


class NoWarehouse(ConfigurationError):
    """A read-only command was pointed at a location that holds no warehouse."""


# -- the parser ------------------------------------------------------------------------


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Appends ``(default: X)`` to every option whose default is a value (not None/False)."""

    def _get_help_string(self, action):
        text = action.help or ""
        d = action.default
        if "%(default)" in text or "default" in text or d is None or d is False \
                or d is argparse.SUPPRESS or d == []:
            return text
        return f"{text} (default: %(default)s)"


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line (``UsageError``) instead of usage + exit."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)
        # the deepest command parsed sets it last: "unrecognized arguments" names its help
        self.set_defaults(command_prog=self.prog)

    def error(self, message):
        raise UsageError(f"{message} (see `{self.prog} --help`)")


def add_global_options(parser: argparse.ArgumentParser, *, top: bool) -> None:
    """The options every command accepts before or after its name. Only the top-level parser
    holds their defaults; on a subcommand they are SUPPRESS, so a value given before the
    subcommand survives unless it is given again after it."""

    def d(value):
        return value if top else argparse.SUPPRESS

    g = parser.add_argument_group("global options (before or after the command)")
    g.add_argument("--warehouse", metavar="PATH|s3://BUCKET/PREFIX",
                   default=d(os.environ.get("FLIGHTSRV_WAREHOUSE", DEFAULT_WAREHOUSE)),
                   help="where the tables live (default: $FLIGHTSRV_WAREHOUSE, else "
                        f"{DEFAULT_WAREHOUSE})")
    g.add_argument("--log-level", choices=LOG_LEVELS, default=d(None),
                   help="log verbosity on stderr (default: info for serve, warning otherwise)")
    g.add_argument("--debug", action="store_true", default=d(False),
                   help="on an error, print the full traceback instead of one line")


def global_defaults(args: argparse.Namespace) -> argparse.Namespace:
    for name, value in (("warehouse", os.environ.get("FLIGHTSRV_WAREHOUSE", DEFAULT_WAREHOUSE)),
                        ("log_level", None), ("debug", False)):
        if not hasattr(args, name):
            setattr(args, name, value)
    return args


# -- the warehouse ---------------------------------------------------------------------


def open_warehouse(args, *, must_exist: bool = True):
    """The warehouse of ``--warehouse``. ``must_exist`` (every command that only reads, or
    writes into an existing table) refuses a location holding no warehouse, creating
    nothing; ``table create``, ``serve`` and the demo create it on their first write."""
    from flightsrv.warehouse import Warehouse

    wh = Warehouse.open(args.warehouse)
    if must_exist and not wh.is_initialized():
        hint = ""
        if wh.is_table_location():
            hint = "; this is the directory of a table, its warehouse is the parent directory"
        raise NoWarehouse(f"no warehouse at {args.warehouse} (create one with "
                          f"`flightsrv table create NAME --schema ...`{hint})")
    return wh


# -- input files -----------------------------------------------------------------------

_KINDS = ((".csv", "csv"), (".csv.gz", "csv"), (".tsv", "tsv"), (".json", "json"),
          (".jsonl", "json"), (".ndjson", "json"), (".json.gz", "json"),
          (".jsonl.gz", "json"), (".parquet", "parquet"), (".pq", "parquet"))


def input_kind(path: str) -> str:
    """csv | tsv | json | parquet from the file name (case-insensitive); a directory is a
    Parquet dataset. UsageError for a missing file or an unknown extension."""
    if not os.path.exists(path):
        raise UsageError(f"no such file: {path}")
    if os.path.isdir(path):
        return "parquet"
    low = path.lower()
    for ext, kind in _KINDS:
        if low.endswith(ext):
            return kind
    raise UsageError(f"cannot tell the format of {path} from its name (use .parquet, .csv, "
                     ".tsv, .json, .jsonl or .ndjson)")


def read_input(path: str, schema=None):
    """A RecordBatchReader over one input file (kind from ``input_kind``).

    ``schema`` (the table's, when appending to it): CSV/TSV and JSON columns named like a
    table column are read as that column's type instead of a guessed one, so ``02134`` stays
    a string and ``1.50`` loads into a decimal. Text for a ``timestamptz`` column is cast by
    DuckDB (a value without an offset means what it means in SQL); text for a binary column
    is decoded as ``--format csv|jsonl`` writes it (``_decode_binary``). JSON lines are read
    by DuckDB (``_read_json``). A value that does not convert fails the read, naming the file
    and the column."""
    import pyarrow as pa
    import pyarrow.csv as pcsv
    import pyarrow.dataset as ds
    import pyarrow.json as pjson

    kind = input_kind(path)
    try:
        if kind in ("csv", "tsv"):
            parse = pcsv.ParseOptions(delimiter="\t" if kind == "tsv" else ",")
            # only an empty field is NULL, a quoted empty one ("") the empty string: what
            # ``--format csv`` writes, and what DuckDB's read_csv reads. pyarrow's default
            # NULL spellings (NA, NULL, null, N/A, NaN, nan, ...) stay values: text in a
            # string column, NaN in a float column
            nulls = dict(null_values=[""], strings_can_be_null=True,
                         quoted_strings_can_be_null=False)
            if schema is None:
                return _quotes_closed(pcsv.open_csv(
                    path, parse_options=parse, convert_options=pcsv.ConvertOptions(**nulls)),
                    path, parse)
            names = _csv_header(path, parse)
            types, later = _read_types(schema, names)
            reader = pcsv.open_csv(path, parse_options=parse, convert_options=pcsv.ConvertOptions(
                column_types=types, **nulls))
            return _typed(_quotes_closed(_named_errors(reader, kind, path, names, parse),
                                         path, parse), later, path, "hex")
        if kind == "json":
            if schema is None:
                return pjson.read_json(path).to_reader()
            return _read_json(path, schema)
        return ds.dataset(path, format="parquet").scanner().to_reader()
    except (pa.ArrowException, OSError) as exc:
        raise _read_error(kind, exc, path, locals().get("names"),
                          locals().get("parse")) from None


def _read_json(path: str, schema):
    """JSON lines read by DuckDB's ``read_json`` with the table's column types, so what
    ``--format jsonl`` writes reads back: DuckDB converts a JSON string to a date, timestamp,
    decimal or double (``"NaN"``, ``"-Infinity"``) and a JSON number or boolean to text, as
    SQL's CAST would. Binary columns are read as text and base64-decoded. Keys that are not
    table columns are kept as JSON text, so the append refuses them by name.

    The columns are the keys of any object in the file (a key missing from some objects is
    NULL there). A value that does not convert raises ConfigurationError naming the file,
    the column, the row (1 = the first object) and the value as JSON."""
    import duckdb
    import pyarrow as pa

    con = duckdb.connect(":memory:")
    try:
        keys = {r[0] for r in con.execute(
            "SELECT DISTINCT unnest(json_keys(json)) FROM read_ndjson_objects(?)",
            [path]).fetchall()}
    except duckdb.Error as exc:
        con.close()
        raise ConfigurationError(f"cannot read json file: {_duck_text(exc)}",
                                 file=path) from None
    if not keys:
        con.close()
        raise ConfigurationError("cannot read json file: it holds no JSON object", file=path)
    fields = [f for f in schema if f.name in keys]
    for f in fields:
        if _nested_binary(f.type):
            con.close()
            raise ConfigurationError("cannot read binary values inside a nested column from "
                                     "JSON lines; load a Parquet file", file=path,
                                     column=f.name)
    duck = _duck_types(con, fields)
    columns = {f.name: "VARCHAR" if _is_binary(f.type) else duck[f.name] for f in fields}
    columns.update({k: "JSON" for k in sorted(keys - set(columns))})
    # an integer or decimal column is read as JSON, cast as read_json would, and its JSON
    # text kept to check the cast changed no value (DuckDB rounds 9.999 into DECIMAL(12,2)
    # and 1.7 into an integer; the CSV reader refuses them)
    exact = [f.name for f in fields if pa.types.is_integer(f.type) or pa.types.is_decimal(f.type)]
    select = [f"CAST({_q(n)} AS {columns[n]}) AS {_q(n)}" if n in exact else _q(n)
              for n in columns]
    select += [f"json_extract_string({_q(n)}, '$')" for n in exact]
    select += [f"CAST({_q(n)} AS VARCHAR)" for n in exact]  # as written, for the error
    read = {n: "JSON" if n in exact else t for n, t in columns.items()}
    try:
        reader = con.sql(f"SELECT {', '.join(select)} FROM read_json($path, "
                         "format='newline_delimited', columns=$columns)",
                         params={"path": path, "columns": read}).to_arrow_reader()
    except duckdb.Error as exc:
        con.close()
        raise _json_error(path, fields, exc) from None
    wanted = {f.name: f.type for f in fields}
    out_schema = pa.schema([(n, wanted.get(n, pa.string())) for n in columns])
    names = list(columns)

    def batches():
        done = 0
        try:
            while True:
                try:
                    batch = reader.read_next_batch()
                except StopIteration:
                    return
                except (duckdb.Error, pa.ArrowException, OSError) as exc:
                    raise _json_error(path, fields, exc) from None
                texts = batch.columns[len(names):len(names) + len(exact)]
                written = batch.columns[len(names) + len(exact):]
                for name, text, raw in zip(exact, texts, written, strict=True):
                    _check_exact(batch.column(names.index(name)), text, raw, path=path,
                                 column=name, type_name=columns[name], first_row=done + 1)
                cols = []
                for name, col in zip(names, batch.columns[:len(names)], strict=True):
                    typ = wanted.get(name, pa.string())
                    if _is_binary(typ):
                        col = _decode_binary(col, typ, "base64", path=path, column=name,
                                             first_row=done + 1)
                    cols.append(_as_type(col, typ, path=path, column=name,
                                         first_row=done + 1))
                done += batch.num_rows
                yield pa.record_batch(cols, schema=out_schema)
        finally:
            con.close()

    return pa.RecordBatchReader.from_batches(out_schema, batches())


def _q(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _check_exact(values, texts, written, *, path: str, column: str, type_name: str,
                 first_row: int) -> None:
    """Raise ConfigurationError naming the first row whose number DuckDB's cast changed
    (``texts``: the JSON values as text; only those not written as a plain integer can
    change), and its value as the file writes it (``written``: JSON, a string quoted)."""
    import decimal

    import pyarrow.compute as pc

    plain = pc.match_substring_regex(texts, r"^-?[0-9]+$")
    suspect = pc.and_(pc.invert(pc.fill_null(plain, True)), pc.is_valid(values))
    for i in pc.indices_nonzero(suspect).to_pylist():
        text = texts[i].as_py()
        value = values[i].as_py()
        try:
            same = decimal.Decimal(text.strip()) == decimal.Decimal(value)
        except (decimal.InvalidOperation, ValueError, TypeError):
            same = False
        if not same:
            raise ConfigurationError(
                f"cannot read json file: a value does not convert exactly to {type_name} "
                "(it would be rounded or reinterpreted)", file=path, column=column,
                row=first_row + i, value=written[i].as_py())


def _nested_binary(t) -> bool:
    """A list, map or struct type holding binary at any depth."""
    import pyarrow as pa

    if pa.types.is_struct(t):
        return any(_is_binary(f.type) or _nested_binary(f.type) for f in t)
    if pa.types.is_map(t):
        return any(_is_binary(x) or _nested_binary(x) for x in (t.key_type, t.item_type))
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        return _is_binary(t.value_type) or _nested_binary(t.value_type)
    return False


def _duck_types(con, fields) -> dict[str, str]:
    """DuckDB's SQL type for each Arrow field, as DuckDB itself maps an Arrow table."""
    import pyarrow as pa

    con.register("_types", pa.schema(fields).empty_table())
    try:
        return {r[0]: r[1] for r in con.sql("DESCRIBE _types").fetchall()}
    finally:
        con.unregister("_types")


def _duck_text(exc: BaseException) -> str:
    """A DuckDB error's first line without its class prefix (``Invalid Input Error: ``)."""
    return re.sub(r"^[A-Za-z ]*Error: ", "", one_line(exc))


def _json_error(path: str, fields, exc: BaseException) -> ConfigurationError:
    """The error of a failed ``read_json``: DuckDB names the file and an approximate line
    only, so each column is read again as JSON text to find the first value that does not
    convert (by SQL's TRY_CAST of the JSON value, which converts as ``read_json`` does)."""
    import duckdb
    import pyarrow as pa

    text = _duck_text(exc)
    con = duckdb.connect(":memory:")
    try:
        duck = _duck_types(con, fields)
        for f in fields:
            if _is_binary(f.type):
                continue
            got = con.sql("SELECT * FROM read_json($path, format='newline_delimited', "
                          "columns=$columns)",
                          params={"path": path, "columns": {f.name: "JSON"}}).to_arrow_table()
            con.register("src", pa.table({"i": pa.array(range(got.num_rows), pa.int64()),
                                          "s": got.column(0).cast(pa.string())}))
            bad = con.sql(f"SELECT i, s FROM src WHERE s IS NOT NULL AND TRY_CAST(CAST(s AS "
                          f"JSON) AS {duck[f.name]}) IS NULL ORDER BY i LIMIT 1").fetchall()
            con.unregister("src")
            if bad:
                return ConfigurationError(
                    f"cannot read json file: a value does not convert to {duck[f.name]}",
                    file=path, column=f.name, row=bad[0][0] + 1, value=bad[0][1])
    except duckdb.Error:
        pass  # the file itself does not parse: DuckDB's message says where
    finally:
        con.close()
    text = re.sub(r"\s*If this error occurred during read_json.*$", "", text)
    return ConfigurationError(f"cannot read json file: {text}", file=path)


def _csv_header(path: str, parse) -> list[str]:
    """The column names of a CSV file (its first block only)."""
    import pyarrow.csv as pcsv

    reader = pcsv.open_csv(path, parse_options=parse)
    try:
        return reader.schema.names
    finally:
        reader.close()


def _is_binary(t) -> bool:
    import pyarrow as pa

    return pa.types.is_binary(t) or pa.types.is_large_binary(t) \
        or pa.types.is_fixed_size_binary(t) or pa.types.is_binary_view(t)


def _read_types(schema, names: list[str]):
    """Column types to read ``names`` with, and the table fields read as text and converted
    afterwards (see ``_typed``): the table's type of every column the file has, except text
    for a date, timestamp or time (cast by DuckDB, which reads what ``--format csv`` writes:
    ``infinity``, ``0044-03-15 (BC)``, years past 9999) and for binary (decoded)."""
    import pyarrow as pa

    types, later = {}, []
    for f in schema:
        if f.name not in names:
            continue
        if is_temporal(f.type) or _is_binary(f.type) or pa.types.is_duration(f.type):
            types[f.name] = pa.string()
            later.append(f)
        else:
            types[f.name] = f.type
    return types, later


def is_temporal(t) -> bool:
    """A date, timestamp or time type (what DuckDB spells and reads back for the CLI)."""
    import pyarrow as pa

    return pa.types.is_date(t) or pa.types.is_timestamp(t) or pa.types.is_time(t)


def _read_error(kind: str, exc: BaseException, path: str, names,
                parse=None) -> ConfigurationError:
    """A read failure naming the file and, when pyarrow says which, the column and the row
    (1 = the first data row; pyarrow's message has no row, ``_csv_row`` finds it)."""
    text = one_line(exc)
    context = {"file": path}
    m = re.match(r"In CSV column #(\d+): (.*)", text)
    if m and names and int(m.group(1)) < len(names):
        context["column"] = names[int(m.group(1))]
        text = m.group(2)
        bad = re.search(r"CSV conversion error to .*: invalid value '(.*)'$", text)
        if bad and parse is not None:
            row = _csv_row(path, parse, context["column"], bad.group(1))
            if row is not None:
                context["row"] = row
    return ConfigurationError(f"cannot read {kind} file: {text}", **context)


def _csv_row(path: str, parse, column: str, value: str) -> int | None:
    """The data row (1 = the first) whose ``column`` holds ``value``, reading that column
    as text; None if it cannot be read again (a pipe) or the value is not found."""
    import pyarrow as pa
    import pyarrow.csv as pcsv

    if not os.path.isfile(path):
        return None
    try:
        reader = pcsv.open_csv(path, parse_options=parse, convert_options=pcsv.ConvertOptions(
            include_columns=[column], column_types={column: pa.string()}))
        seen = 0
        for batch in reader:
            values = batch.column(0).to_pylist()
            if value in values:
                return seen + values.index(value) + 1
            seen += batch.num_rows
    except (pa.ArrowException, OSError):
        return None
    return None


def _quotes_closed(reader, path: str, parse):
    """``reader`` (a CSV file's), failing at its end when a quoted value never closes:
    pyarrow then reads the rest of the file as that one value and reports nothing, so rows
    would vanish into it. Only when the last row read holds a line break in a text value
    (where that happens, as in a legitimate multi-line value) is the file read again, by
    Python's strict CSV reader, to tell."""
    import pyarrow as pa

    def batches():
        last = None
        for batch in reader:
            if batch.num_rows:
                last = batch
            yield batch
        if last is not None and _breaks_in_last_row(last):
            _check_quotes(path, parse.delimiter)

    return pa.RecordBatchReader.from_batches(reader.schema, batches())


def _breaks_in_last_row(batch) -> bool:
    import pyarrow as pa

    for column in batch.columns:
        value = column[batch.num_rows - 1]
        if pa.types.is_string(column.type) or pa.types.is_large_string(column.type):
            text = value.as_py()
            if text is not None and ("\n" in text or "\r" in text):
                return True
    return False


def _check_quotes(path: str, delimiter: str) -> None:
    """Refuse ``path`` when a quoted value runs to the end of the file: Python's strict CSV
    reader says so ("unexpected end of data"). Where it stops earlier on something pyarrow
    and DuckDB read (a space after a closing quote), the file's end tells: a quoted value
    that closes leaves the closing quote as the file's last character (but for line
    breaks), one that never closes leaves the value's own text there."""
    import csv
    import io

    import pyarrow as pa

    csv.field_size_limit(sys.maxsize)  # a long value is no error (pyarrow reads it)
    with pa.input_stream(path, compression="detect") as raw:
        text = io.TextIOWrapper(raw, encoding="utf-8", errors="replace", newline="")
        rows = csv.reader(text, delimiter=delimiter, strict=True)
        read = 0
        try:
            for _ in rows:
                read += 1
            return
        except csv.Error as exc:
            if "end of data" in str(exc):
                _never_closes(path, read, str(exc))
    with pa.input_stream(path, compression="detect") as raw:
        size = raw.seek(0, 2) if raw.seekable() else None
        if size is not None:
            raw.seek(max(0, size - 4096))
        tail = raw.read().decode("utf-8", errors="replace").rstrip("\r\n")
    if tail and not tail.endswith('"'):
        _never_closes(path, None, "the file ends inside a quoted value")


def _never_closes(path: str, row: int | None, why: str):
    raise ConfigurationError(
        f"a quoted value never closes ({why}): the rest of the file would be read as that "
        "one value; close the quote (a quote inside a quoted value is written twice: \"\")",
        file=path, **({"row": row} if row is not None else {}))


def _named_errors(reader, kind: str, path: str, names, parse=None):
    """``reader`` whose read errors (in any later block) name the file, column and row."""
    import pyarrow as pa

    def batches():
        it = iter(reader)
        while True:
            try:
                batch = next(it)
            except StopIteration:
                return
            except pa.ArrowException as exc:
                raise _read_error(kind, exc, path, names, parse) from None
            yield batch

    return pa.RecordBatchReader.from_batches(reader.schema, batches())


def _typed(reader, later, path: str, binary: str):
    """``reader`` with the text columns of ``later`` converted to their table types:
    dates, timestamps and times cast by DuckDB, binary decoded from ``binary`` text
    (``hex``: CSV, ``base64``: JSON lines; see ``_decode_binary``). A value that does not
    convert raises ConfigurationError naming the file, column, row (1 = the first data row)
    and value."""
    import pyarrow as pa

    if not later:
        return reader
    import duckdb

    wanted = {f.name: f.type for f in later}
    out_schema = pa.schema([(n, wanted.get(n, t))
                            for n, t in zip(reader.schema.names, reader.schema.types,
                                            strict=True)])

    def cast_batches():
        con = duckdb.connect(":memory:")
        done = 0
        try:
            temporal = [f for f in later if not _is_binary(f.type)]
            duck = _duck_types(con, temporal) if temporal else {}
            for batch in reader:
                cols = dict(zip(batch.schema.names, batch.columns, strict=True))
                for name, typ in wanted.items():
                    if _is_binary(typ):
                        cols[name] = _decode_binary(cols[name], typ, binary, path=path,
                                                    column=name, first_row=done + 1)
                    else:
                        cols[name] = _cast_temporal(con, cols[name], typ, duck[name],
                                                    path=path, column=name,
                                                    first_row=done + 1)
                done += batch.num_rows
                yield pa.record_batch(list(cols.values()), schema=out_schema)
        finally:
            con.close()

    return pa.RecordBatchReader.from_batches(out_schema, cast_batches())


def _cast_temporal(con, col, typ, duck: str, *, path: str, column: str, first_row: int):
    """Text ``col`` cast by DuckDB to ``duck`` (the SQL type of ``typ``; an empty string
    is NULL), as ``typ``: DuckDB decides what a date or time means, its own spellings
    (``infinity``, ``BC``) included, and a ``timestamptz`` without an offset is in its
    session time zone."""
    import duckdb
    import pyarrow as pa

    con.register("src", pa.table({"i": pa.array(range(len(col)), pa.int64()), "s": col}))
    try:
        got = con.sql(f"SELECT CAST(NULLIF(s, '') AS {duck}) FROM src "
                      "ORDER BY i").to_arrow_table()
    except duckdb.Error:
        bad = con.sql(f"SELECT i, s FROM src WHERE NULLIF(s, '') IS NOT NULL "
                      f"AND TRY_CAST(s AS {duck}) IS NULL ORDER BY i "
                      "LIMIT 1").fetchall()
        where = {"row": first_row + bad[0][0], "value": bad[0][1]} if bad else {}
        raise ConfigurationError(f"a value does not convert to {duck}",
                                 file=path, column=column, **where) from None
    finally:
        con.unregister("src")
    return _as_type(got.column(0).combine_chunks(), typ, path=path, column=column,
                    first_row=first_row)


def _as_type(col, typ, *, path: str, column: str, first_row: int):
    """``col`` as Arrow type ``typ``; an INTERVAL DuckDB read (month_day_nano) into a
    duration column exactly: one with months (no fixed length) or finer than the column's
    unit is refused naming the row."""
    import pyarrow as pa

    if not (pa.types.is_duration(typ) and col.type == pa.month_day_nano_interval()):
        return col.cast(typ)
    per = {"s": 10**9, "ms": 10**6, "us": 10**3, "ns": 1}[typ.unit]
    out = []
    for i, v in enumerate(col.to_pylist()):
        if v is None:
            out.append(None)
            continue
        total = v.days * 86_400_000_000_000 + v.nanoseconds
        if v.months or total % per:
            raise ConfigurationError(
                f"an interval is not a duration[{typ.unit}] (months have no fixed length; "
                "a duration holds whole units)", file=path, column=column,
                row=first_row + i, value=str(v))
        out.append(total // per)
    return pa.array(out, pa.int64()).cast(typ)


_HEX = re.compile(r"(?:[0-9a-fA-F]{2})*")


def _decode_binary(col, typ, encoding: str, *, path: str, column: str, first_row: int):
    """Text ``col`` as the bytes it stands for, of binary type ``typ``.

    ``hex`` (CSV, as ``--format csv`` writes binary): ``\\x`` then an even number of hex
    digits is those bytes (``\\x`` alone: no bytes); text without the ``\\x`` prefix is
    its UTF-8 bytes as written (like PostgreSQL's input of ``bytea``). ``base64`` (JSON
    lines, as ``--format jsonl`` writes binary): standard base64 with padding.
    ConfigurationError naming the file, column, row and value for text that is neither."""
    import base64
    import binascii

    import pyarrow as pa

    width = typ.byte_width if pa.types.is_fixed_size_binary(typ) else None
    out = []
    for i, text in enumerate(col.to_pylist()):
        if text is None:
            out.append(None)
            continue
        if encoding == "hex":
            if not text.startswith("\\x"):
                value = text.encode("utf-8")
            elif _HEX.fullmatch(text, 2):
                value = bytes.fromhex(text[2:])
            else:
                raise ConfigurationError(
                    "a binary value starting with \\x is not an even number of hex digits",
                    file=path, column=column, row=first_row + i, value=text)
        else:
            try:
                value = base64.b64decode(text, validate=True)
            except (binascii.Error, ValueError):
                raise ConfigurationError("a binary value is not base64", file=path,
                                         column=column, row=first_row + i,
                                         value=text) from None
        if width is not None and len(value) != width:
            raise ConfigurationError(f"a binary value is not {width} bytes long", file=path,
                                     column=column, row=first_row + i, value=text)
        out.append(value)
    return pa.array(out, pa.binary()).cast(typ)


def input_schema(path: str):
    """The Arrow schema of an input file, read without loading it all (CSV: first block)."""
    reader = read_input(path)
    try:
        return reader.schema
    finally:
        close = getattr(reader, "close", None)
        if close:
            close()


# -- values --------------------------------------------------------------------------

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|sec|m|min|h|d|w)?\s*$", re.IGNORECASE)
_SECONDS = {None: 1, "s": 1, "sec": 1, "m": 60, "min": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_duration(text: str) -> float:
    """``3600``, ``90s``, ``15m``, ``1h``, ``7d``, ``2w`` -> seconds (argparse ``type``)."""
    m = _DURATION.match(text)
    if not m:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a duration (seconds, or a number with s, m, h, d or w)")
    return float(m.group(1)) * _SECONDS[(m.group(2) or "").lower() or None]


def format_duration(seconds: float) -> str:
    for unit, n in (("w", 604800), ("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= n and seconds % n == 0:
            return f"{int(seconds // n)}{unit}"
    return f"{seconds:g}s"


def read_secret_file(path: str, option: str) -> str:
    """The first non-empty line of a secret file (``--auth-token-file`` and friends)."""
    try:
        with open(path, encoding="utf-8") as f:
            lines = [ln.strip() for ln in f if ln.strip() and not ln.lstrip().startswith("#")]
    except FileNotFoundError:
        raise UsageError(f"{option}: no such file: {path}") from None
    except OSError as exc:
        raise UsageError(f"{option}: cannot read {path}: {exc.strerror}") from None
    if not lines:
        raise UsageError(f"{option}: {path} holds no secret")
    return lines[0]


def secret_lines(path: str, option: str) -> list[str]:
    """Every non-empty, non-comment line of a secrets file."""
    try:
        with open(path, encoding="utf-8") as f:
            return [ln.strip() for ln in f if ln.strip() and not ln.lstrip().startswith("#")]
    except FileNotFoundError:
        raise UsageError(f"{option}: no such file: {path}") from None
    except OSError as exc:
        raise UsageError(f"{option}: cannot read {path}: {exc.strerror}") from None


def require_file(path: str | None, option: str) -> None:
    """UsageError naming the option when ``path`` is given but is not a readable file."""
    if path is None:
        return
    if not os.path.exists(path):
        raise UsageError(f"{option}: no such file: {path}")
    if not os.path.isfile(path):
        raise UsageError(f"{option}: not a file: {path}")
    if not os.access(path, os.R_OK):
        raise UsageError(f"{option}: cannot read {path} (permission denied)")


def one_line(exc: BaseException | str) -> str:
    """An error's text on one line (the first line of a multi-line message, whitespace
    collapsed)."""
    text = str(exc).strip()
    first = text.splitlines()[0] if text else ""
    return " ".join(first.split()) or type(exc).__name__


def say(text: str) -> None:
    """A human line on stderr (progress, notices): stdout carries only results."""
    sys.stderr.write(f"flightsrv: {text}\n")
    sys.stderr.flush()


def warn(text: str) -> None:
    say(f"warning: {text}")


class PlainError(FlightsrvError):
    """An error whose message is the whole story: shown without its class name."""


def error_text(exc: BaseException) -> str:
    """One line for an error: the message (class name first for errors that are not the
    caller's to fix), an OS error's reason and file, or an unexpected error's class; then,
    for an error of a statement, DuckDB's hints and its ``LINE n:`` with the caret under
    the statement as the user typed it (the error's ``detail``), as DuckDB's CLI shows
    them."""
    import pyarrow as pa

    from flightsrv.errors import _fmt

    if isinstance(exc, FlightsrvError):
        # the message's first line, then its key=value context (which a multi-line message
        # would otherwise push off the line)
        text = one_line(_fmt(one_line(exc.message), exc.context))
        if not isinstance(exc, (ConfigurationError, PlainError)):
            text = f"{type(exc).__name__}: {text}"
        return text + (f"\n{exc.detail}" if exc.detail else "")
    if isinstance(exc, OSError) and exc.strerror:
        where = f": {exc.filename}" if exc.filename else ""
        return f"{exc.strerror}{where}"
    if isinstance(exc, pa.ArrowException):
        return one_line(exc)
    try:
        from botocore.exceptions import BotoCoreError, ClientError

        if isinstance(exc, ClientError):
            err = exc.response.get("Error", {})
            return f"S3: {err.get('Code', '?')}: {err.get('Message', '')}".strip()
        if isinstance(exc, BotoCoreError):
            return f"S3: {one_line(exc)}"
    except ImportError:
        pass
    return (f"unexpected {type(exc).__name__}: {one_line(exc)} (run with --debug for the "
            "traceback)")
