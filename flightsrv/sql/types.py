"""Type maps between SQL (DuckDB dialect, as sqlglot parses it) and Arrow, kept as tables.

- ``SQL_TO_ARROW``: sqlglot ``DataType.Type`` -> Arrow type, for ``CREATE TABLE`` column defs.
  Parameterised and nested types (DECIMAL(p, s), lists, structs, maps) are built by
  :func:`arrow_type` from these tables; extend the dictionaries, not the function.
- ``ARROW_TO_SQL``: Arrow type id -> DuckDB type name, used to render bound parameter values
  as typed literals (``CAST('...' AS DATE)``).

DuckDB's own type list: https://duckdb.org/docs/sql/data_types/overview
"""

from __future__ import annotations

import decimal as _decimal
import math

import pyarrow as pa
from sqlglot import exp

from flightsrv.errors import SqlError

T = exp.DataType.Type

#: Scalar SQL types (as sqlglot names them after parsing the DuckDB dialect) -> Arrow.
SQL_TO_ARROW: dict[exp.DataType.Type, pa.DataType] = {
    T.BOOLEAN: pa.bool_(),
    T.TINYINT: pa.int8(),
    T.SMALLINT: pa.int16(),
    T.INT: pa.int32(),
    T.BIGINT: pa.int64(),
    T.UTINYINT: pa.uint8(),
    T.USMALLINT: pa.uint16(),
    T.UINT: pa.uint32(),
    T.UBIGINT: pa.uint64(),
    T.FLOAT: pa.float32(),
    T.DOUBLE: pa.float64(),
    T.TEXT: pa.string(),
    T.VARCHAR: pa.string(),
    T.CHAR: pa.string(),
    T.NVARCHAR: pa.string(),
    T.NCHAR: pa.string(),
    T.VARBINARY: pa.binary(),
    T.BINARY: pa.binary(),
    T.BLOB: pa.binary(),
    T.DATE: pa.date32(),
    T.TIME: pa.time64("us"),
    T.TIMESTAMP: pa.timestamp("us"),
    T.TIMESTAMPNTZ: pa.timestamp("us"),
    T.DATETIME: pa.timestamp("us"),
    T.TIMESTAMP_S: pa.timestamp("s"),
    T.TIMESTAMP_MS: pa.timestamp("ms"),
    T.TIMESTAMP_NS: pa.timestamp("ns"),
    T.TIMESTAMPTZ: pa.timestamp("us", tz="UTC"),
}
# INTERVAL is not here: Parquet cannot store Arrow's month_day_nano, so it is refused as
# an unsupported column type.

#: Default precision/scale of a bare DECIMAL in DuckDB.
DEFAULT_DECIMAL = (18, 3)
#: The widest DECIMAL DuckDB has.
MAX_DECIMAL_PRECISION = 38

#: Arrow type -> DuckDB type name for typed literals; :func:`sql_type_name` consults this
#: first, then builds the parameterised cases (timestamps, decimals, nested types).
ARROW_TO_SQL: dict[pa.DataType, str] = {
    pa.bool_(): "BOOLEAN",
    pa.int8(): "TINYINT",
    pa.int16(): "SMALLINT",
    pa.int32(): "INTEGER",
    pa.int64(): "BIGINT",
    pa.uint8(): "UTINYINT",
    pa.uint16(): "USMALLINT",
    pa.uint32(): "UINTEGER",
    pa.uint64(): "UBIGINT",
    pa.float16(): "FLOAT",
    pa.float32(): "FLOAT",
    pa.float64(): "DOUBLE",
    pa.string(): "VARCHAR",
    pa.large_string(): "VARCHAR",
    pa.string_view(): "VARCHAR",
    pa.binary(): "BLOB",
    pa.large_binary(): "BLOB",
    pa.binary_view(): "BLOB",
    pa.date32(): "DATE",
    pa.date64(): "DATE",
    pa.time32("s"): "TIME",
    pa.time32("ms"): "TIME",
    pa.time64("us"): "TIME",
    pa.time64("ns"): "TIME",
}

_TIMESTAMP_UNITS = {"s": "TIMESTAMP_S", "ms": "TIMESTAMP_MS", "us": "TIMESTAMP",
                    "ns": "TIMESTAMP_NS"}


def arrow_type(dt: exp.DataType) -> pa.DataType:
    """The Arrow type for a parsed SQL column type; SqlError names unsupported types."""
    kind = dt.this
    if kind in SQL_TO_ARROW:
        return SQL_TO_ARROW[kind]
    params = dt.expressions
    if kind in (T.DECIMAL, T.BIGDECIMAL):
        if params:
            precision = int(params[0].name)
            scale = int(params[1].name) if len(params) > 1 else 0
        else:
            precision, scale = DEFAULT_DECIMAL
        # DuckDB's limits: a DECIMAL is 1 to 38 digits wide, its scale at most its width
        if not 1 <= precision <= MAX_DECIMAL_PRECISION:
            raise SqlError(f"DECIMAL precision must be between 1 and {MAX_DECIMAL_PRECISION}",
                           type=dt.sql("duckdb"))
        if scale > precision:
            raise SqlError("DECIMAL scale must not be greater than its precision",
                           type=dt.sql("duckdb"))
        return pa.decimal128(precision, scale)
    if kind in (T.ARRAY, T.LIST):
        if not params:
            raise SqlError("array type without an element type", type=dt.sql("duckdb"))
        if dt.args.get("values"):  # INTEGER[3]: a table would not hold the length to 3
            raise SqlError("unsupported column type: a fixed-size ARRAY; declare a list "
                           f"({params[0].sql('duckdb')}[])", type=dt.sql("duckdb"))
        return pa.list_(arrow_type(params[0]))
    if kind in (T.UUID, T.JSON):  # a table would store unchecked text
        raise SqlError(f"unsupported column type: {kind.value}; declare VARCHAR (DuckDB "
                       f"casts VARCHAR to {kind.value} where a query needs it)",
                       type=dt.sql("duckdb"))
    if kind == T.STRUCT:
        fields = []
        for p in params:
            # STRUCT(x INT) parses as ColumnDef(x, INT)
            if not isinstance(p, exp.ColumnDef) or p.args.get("kind") is None:
                raise SqlError("struct field without a name or type", type=dt.sql("duckdb"))
            fields.append(pa.field(p.name, arrow_type(p.args["kind"])))
        return pa.struct(fields)
    if kind == T.MAP:
        if len(params) != 2:
            raise SqlError("MAP needs a key and a value type", type=dt.sql("duckdb"))
        return pa.map_(arrow_type(params[0]), arrow_type(params[1]))
    raise SqlError("unsupported column type", type=dt.sql("duckdb"))


def sql_type_name(t: pa.DataType) -> str:
    """The DuckDB type name for an Arrow type (for CASTs of bound parameters)."""
    if t in ARROW_TO_SQL:
        return ARROW_TO_SQL[t]
    if pa.types.is_timestamp(t):
        if t.tz is not None:
            return "TIMESTAMPTZ"
        return _TIMESTAMP_UNITS[t.unit]
    if pa.types.is_decimal(t):
        return f"DECIMAL({t.precision}, {t.scale})"
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        return f"{_inner_type_name(t.value_type)}[]"
    if pa.types.is_struct(t):
        inner = ", ".join(f"{_ident(f.name)} {_inner_type_name(f.type)}" for f in t)
        return f"STRUCT({inner})"
    if pa.types.is_map(t):
        return f"MAP({_inner_type_name(t.key_type)}, {_inner_type_name(t.item_type)})"
    if pa.types.is_dictionary(t):
        return sql_type_name(t.value_type)
    if pa.types.is_null(t):
        return "NULL"
    if pa.types.is_duration(t) or t == pa.month_day_nano_interval():
        return "INTERVAL"  # DuckDB reads both Arrow types as INTERVAL
    raise SqlError("no SQL type for Arrow type", arrow_type=str(t))


def _holds_null_type(t: pa.DataType) -> bool:
    """Whether Arrow type ``t`` is, or nests, the NULL type (``list<null>``: an empty or
    all-NULL list from a client that could not tell its element type). A literal of such a
    type is written without a CAST: the type has no name the statement's text can carry
    through the front end (DuckDB spells it ``"NULL"``; sqlglot drops the quotes)."""
    if pa.types.is_null(t):
        return True
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        return _holds_null_type(t.value_type)
    if pa.types.is_struct(t):
        return any(_holds_null_type(f.type) for f in t)
    if pa.types.is_map(t):
        return _holds_null_type(t.key_type) or _holds_null_type(t.item_type)
    return False


def _inner_type_name(t: pa.DataType) -> str:
    """:func:`sql_type_name` of a nested type's child: DuckDB spells its NULL type
    ``"NULL"`` there (``CAST([] AS "NULL"[])``: Arrow's ``list<null>``, an empty list)."""
    return '"NULL"' if pa.types.is_null(t) else sql_type_name(t)


def _quote(s: str) -> str:
    return "'" + s.replace("'", "''") + "'"


def quote_ident(name: str) -> str:
    """``name`` as a double-quoted DuckDB identifier."""
    return '"' + name.replace('"', '""') + '"'


_ident = quote_ident


#: DuckDB's DATE range in days from 1970-01-01 ('5877642-06-25 (BC)' to '5881580-07-10')
#: and TIMESTAMP range in microseconds (the int64 ends are its infinities).
DATE_DAYS = (-2147483646, 2147483646)
TIMESTAMP_MICROS = (-9223372022400000000, 9223372036854775806)
_UNIT_PER_SECOND = {"s": 1, "ms": 1_000, "us": 1_000_000, "ns": 1_000_000_000}
_DIGITS = {"s": 0, "ms": 3, "us": 6, "ns": 9}


def _civil(days: int) -> tuple[int, int, int]:
    """Proleptic Gregorian (year, month, day) of a day count from 1970-01-01; year 0 is
    1 BC (H. Hinnant, "chrono-compatible low-level date algorithms", civil_from_days)."""
    z = days + 719468
    era = z // 146097
    doe = z - era * 146097
    yoe = (doe - doe // 1460 + doe // 36524 - doe // 146096) // 365
    doy = doe - (365 * yoe + yoe // 4 - yoe // 100)
    mp = (5 * doy + 2) // 153
    d = doy - (153 * mp + 2) // 5 + 1
    m = mp + 3 if mp < 10 else mp - 9
    return yoe + era * 400 + (m <= 2), m, d


def date_text(days: int) -> str:
    """A day count from 1970-01-01 as DuckDB spells a DATE: ``2024-01-31``, ``12345-01-01``,
    ``0044-03-15 (BC)``; SqlError outside DuckDB's DATE range."""
    if not DATE_DAYS[0] <= days <= DATE_DAYS[1]:
        raise SqlError("date is outside DuckDB's DATE range", days=days)
    y, m, d = _civil(days)
    return f"{y:04d}-{m:02d}-{d:02d}" if y > 0 else f"{1 - y:04d}-{m:02d}-{d:02d} (BC)"


def timestamp_text(count: int, unit: str) -> str:
    """A count of ``unit`` since 1970-01-01 00:00:00 as DuckDB spells a TIMESTAMP, e.g.
    ``0044-03-15 (BC) 01:02:03.5``; SqlError outside DuckDB's TIMESTAMP range."""
    per_second = _UNIT_PER_SECOND[unit]
    micros = count * 1_000_000 // per_second
    if not TIMESTAMP_MICROS[0] <= micros <= TIMESTAMP_MICROS[1]:
        raise SqlError("timestamp is outside DuckDB's TIMESTAMP range", value=count, unit=unit)
    days, rest = divmod(count, 86_400 * per_second)
    seconds, fraction = divmod(rest, per_second)
    day = date_text(days)
    date, bc = (day[:-5], " (BC)") if day.endswith(" (BC)") else (day, "")
    clock = f"{seconds // 3600:02d}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"
    if fraction:
        clock += ("." + f"{fraction:0{_DIGITS[unit]}d}").rstrip("0")
    return f"{date}{bc} {clock}"


#: a duration's integer in its unit -> microseconds, in DuckDB's integer arithmetic
#: (nanoseconds truncated toward zero, as DuckDB converts an Arrow duration)
_DURATION_TO_MICROS = {"s": " * 1000000", "ms": " * 1000", "us": "", "ns": " // 1000"}


def duration_sql(expr: str, unit: str) -> str:
    """The INTERVAL DuckDB makes of an Arrow ``duration[unit]``, from ``expr``, a BIGINT
    holding the duration's integer in its unit (as Parquet stores it)."""
    return f"to_microseconds({expr}{_DURATION_TO_MICROS[unit]})"


def literal_sql(value: pa.Scalar) -> str:
    """Render one Arrow scalar as a typed DuckDB literal, e.g. ``CAST('2024-01-01' AS DATE)``.

    The rendering is exact: floats use ``repr`` (round-trips), decimals their string form,
    binary a hex blob literal.
    """
    t = value.type
    if not value.is_valid:
        return "NULL" if _holds_null_type(t) else f"CAST(NULL AS {sql_type_name(t)})"
    if pa.types.is_dictionary(t):
        return literal_sql(value.value)
    name = sql_type_name(t)
    if pa.types.is_timestamp(t) or pa.types.is_date(t):
        py = None  # read as integers: Python's datetime stops at years 1 and 9999
    else:
        py = value.as_py()
    if pa.types.is_boolean(t):
        return "TRUE" if py else "FALSE"
    if pa.types.is_integer(t):
        return f"CAST({int(py)} AS {name})"
    if pa.types.is_floating(t):
        f = float(py)
        if math.isnan(f) or math.isinf(f):
            return f"CAST({_quote(repr(f))} AS {name})"
        return f"CAST({f!r} AS {name})"
    if pa.types.is_decimal(t):
        assert isinstance(py, _decimal.Decimal)
        return f"CAST({_quote(str(py))} AS {name})"
    if pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t):
        return _quote(py)
    if pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_binary_view(t):
        return "'" + "".join(f"\\x{b:02x}" for b in py) + "'::BLOB"
    if pa.types.is_timestamp(t):
        text = timestamp_text(value.cast(pa.int64()).as_py(), t.unit)
        return f"CAST({_quote(text + ('+00' if t.tz is not None else ''))} AS {name})"
    if pa.types.is_date32(t):
        return f"CAST({_quote(date_text(value.cast(pa.int32()).as_py()))} AS {name})"
    if pa.types.is_date64(t):
        days = value.cast(pa.int64()).as_py() // 86_400_000
        return f"CAST({_quote(date_text(days))} AS {name})"
    if pa.types.is_time(t):
        return f"CAST({_quote(py.isoformat())} AS {name})"
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        items = ", ".join(literal_sql(v) for v in value.values)
        if _holds_null_type(t):  # ``[]``, ``[NULL]``: DuckDB types them "NULL"[] itself
            return f"[{items}]"
        return f"CAST([{items}] AS {name})"
    if pa.types.is_struct(t):
        items = ", ".join(f"{_quote(f.name)}: {literal_sql(value[f.name])}" for f in t)
        return f"{{{items}}}"
    if pa.types.is_map(t):  # its entries: a struct array of (key, value)
        items = ", ".join(f"{literal_sql(e[0])}: {literal_sql(e[1])}" for e in value.values)
        # (an empty one as MAP(): sqlglot reads "MAP {}" as MAP MAP())
        return f"CAST({f'MAP {{{items}}}' if items else 'MAP()'} AS {name})"
    if pa.types.is_duration(t):
        return duration_sql(f"CAST({value.cast(pa.int64()).as_py()} AS BIGINT)", t.unit)
    if t == pa.month_day_nano_interval():
        months, days, nanos = py
        return (f"(to_months(CAST({months} AS INTEGER)) + to_days(CAST({days} AS INTEGER)) + "
                f"to_microseconds(CAST({nanos} AS BIGINT) // 1000))")
    raise SqlError("cannot bind a parameter of this type", arrow_type=str(t))


def parameter_literal(value: pa.Scalar, number: int) -> str:
    """:func:`literal_sql` of the value of parameter ``$number``; SqlError naming the
    parameter when the value has no DuckDB literal (a type DuckDB lacks, a value outside
    its range)."""
    try:
        return literal_sql(value)
    except SqlError as e:
        raise SqlError(f"parameter ${number}: {e.message}", parameter=f"${number}",
                       arrow_type=str(value.type)) from None
    except (ValueError, OverflowError, ArithmeticError, pa.ArrowException) as e:
        raise SqlError(f"parameter ${number}: value cannot be rendered as a DuckDB literal "
                       f"({e})", parameter=f"${number}", arrow_type=str(value.type)) from None


def duckdb_type(t: pa.DataType) -> str | None:
    """The DuckDB type a column of Arrow type ``t`` is cast to (maps, structs and lists
    included), or None if DuckDB has none."""
    ident = _ident

    if pa.types.is_map(t):
        k, v = duckdb_type(t.key_type), duckdb_type(t.item_type)
        return None if k is None or v is None else f"MAP({k}, {v})"
    if pa.types.is_struct(t):
        inner = [(t.field(i).name, duckdb_type(t.field(i).type)) for i in range(t.num_fields)]
        if any(x is None for _, x in inner):
            return None
        return "STRUCT(" + ", ".join(f"{ident(n)} {x}" for n, x in inner) + ")"
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        inner = duckdb_type(t.value_type)
        return None if inner is None else f"{inner}[]"
    if pa.types.is_null(t):
        return '"NULL"'  # DuckDB's type of a CTAS column of NULL; unquoted it is a literal
    if pa.types.is_fixed_size_binary(t) and not pa.types.is_decimal(t):
        return "BLOB"  # what DuckDB reads it as; the length is checked when it is written
    if pa.types.is_timestamp(t) and t.tz is not None and t.unit == "ns":
        return "TIMESTAMPTZ_NS"  # DuckDB's type of the values (Arrow ingest makes one)
    try:
        return sql_type_name(t)
    except SqlError:
        return None
