"""Flight SQL metadata: the fixed result schemas, SqlInfo values and XDBC type info.

Spec: https://github.com/apache/arrow/blob/main/format/FlightSql.proto (each Command*'s
comment gives its result schema; the ``SqlInfo`` enum gives the keys).

Everything here is data. JDBC and BI tools fail on *missing* SqlInfo keys (Metabase hits a
null-pointer error), so ``SQL_INFO`` answers every key the spec defines.
"""

from __future__ import annotations

import functools

from collections.abc import Callable
from typing import NamedTuple

import pyarrow as pa

from flightsrv.sql import validate
from flightsrv.sql.allowed_functions import SCALAR_FUNCTIONS

CATALOG, DB_SCHEMA = validate.CATALOG, validate.SCHEMA  # the one catalog and schema
TABLE_TYPES = ("TABLE",)
SERVER_NAME = "flightsrv"

# -- result schemas ---------------------------------------------------------------------

CATALOGS_SCHEMA = pa.schema([pa.field("catalog_name", pa.utf8(), nullable=False)])
DB_SCHEMAS_SCHEMA = pa.schema(
    [pa.field("catalog_name", pa.utf8()), pa.field("db_schema_name", pa.utf8(), nullable=False)]
)
TABLES_SCHEMA = pa.schema(
    [
        pa.field("catalog_name", pa.utf8()),
        pa.field("db_schema_name", pa.utf8()),
        pa.field("table_name", pa.utf8(), nullable=False),
        pa.field("table_type", pa.utf8(), nullable=False),
    ]
)
TABLES_SCHEMA_WITH_SCHEMA = TABLES_SCHEMA.append(
    pa.field("table_schema", pa.binary(), nullable=False)
)
TABLE_TYPES_SCHEMA = pa.schema([pa.field("table_type", pa.utf8(), nullable=False)])
PRIMARY_KEYS_SCHEMA = pa.schema(
    [
        pa.field("catalog_name", pa.utf8()),
        pa.field("db_schema_name", pa.utf8()),
        pa.field("table_name", pa.utf8(), nullable=False),
        pa.field("column_name", pa.utf8(), nullable=False),
        pa.field("key_name", pa.utf8()),
        pa.field("key_sequence", pa.int32(), nullable=False),
    ]
)
# GetExportedKeys, GetImportedKeys and GetCrossReference share one schema.
FOREIGN_KEYS_SCHEMA = pa.schema(
    [
        pa.field("pk_catalog_name", pa.utf8()),
        pa.field("pk_db_schema_name", pa.utf8()),
        pa.field("pk_table_name", pa.utf8(), nullable=False),
        pa.field("pk_column_name", pa.utf8(), nullable=False),
        pa.field("fk_catalog_name", pa.utf8()),
        pa.field("fk_db_schema_name", pa.utf8()),
        pa.field("fk_table_name", pa.utf8(), nullable=False),
        pa.field("fk_column_name", pa.utf8(), nullable=False),
        pa.field("key_sequence", pa.int32(), nullable=False),
        pa.field("fk_key_name", pa.utf8()),
        pa.field("pk_key_name", pa.utf8()),
        pa.field("update_rule", pa.uint8(), nullable=False),
        pa.field("delete_rule", pa.uint8(), nullable=False),
    ]
)
XDBC_TYPE_INFO_SCHEMA = pa.schema(
    [
        pa.field("type_name", pa.utf8(), nullable=False),
        pa.field("data_type", pa.int32(), nullable=False),
        pa.field("column_size", pa.int32()),
        pa.field("literal_prefix", pa.utf8()),
        pa.field("literal_suffix", pa.utf8()),
        pa.field("create_params", pa.list_(pa.field("item", pa.utf8(), nullable=False))),
        pa.field("nullable", pa.int32(), nullable=False),
        pa.field("case_sensitive", pa.bool_(), nullable=False),
        pa.field("searchable", pa.int32(), nullable=False),
        pa.field("unsigned_attribute", pa.bool_()),
        pa.field("fixed_prec_scale", pa.bool_(), nullable=False),
        pa.field("auto_increment", pa.bool_()),
        pa.field("local_type_name", pa.utf8()),
        pa.field("minimum_scale", pa.int32()),
        pa.field("maximum_scale", pa.int32()),
        pa.field("sql_data_type", pa.int32(), nullable=False),
        pa.field("datetime_subcode", pa.int32()),
        pa.field("num_prec_radix", pa.int32()),
        pa.field("interval_precision", pa.int32()),
    ]
)

# dense_union<string_value, bool_value, bigint_value, int32_bitmask, string_list,
# int32_to_int32_list_map>; the type codes are the member positions.
SQL_INFO_VALUE_TYPE = pa.dense_union(
    [
        pa.field("string_value", pa.utf8()),
        pa.field("bool_value", pa.bool_()),
        pa.field("bigint_value", pa.int64()),
        pa.field("int32_bitmask", pa.int32()),
        pa.field("string_list", pa.list_(pa.field("item", pa.utf8()))),
        pa.field(
            "int32_to_int32_list_map",
            pa.map_(pa.int32(), pa.list_(pa.field("item", pa.int32()))),
        ),
    ]
)
SQL_INFO_SCHEMA = pa.schema(
    [
        pa.field("info_name", pa.uint32(), nullable=False),
        pa.field("value", SQL_INFO_VALUE_TYPE, nullable=False),
    ]
)


# -- SqlInfo ----------------------------------------------------------------------------


class I32(int):
    """An int32 SqlInfo value (an ordinal or a bitmask) rather than an int64."""


def _bits(*positions: int) -> I32:
    return I32(sum(1 << p for p in positions))


# SqlSupportsConvert ordinals
_BIGINT, _BINARY, _BIT, _CHAR, _DATE, _DECIMAL, _FLOAT, _INTEGER = 0, 1, 2, 3, 4, 5, 6, 7
_LONGVARBINARY, _LONGVARCHAR, _NUMERIC, _REAL, _SMALLINT = 10, 11, 12, 13, 14
_TIME, _TIMESTAMP, _TINYINT, _VARBINARY, _VARCHAR = 15, 16, 17, 18, 19
_NUMBERS = [_BIGINT, _BIT, _DECIMAL, _FLOAT, _INTEGER, _NUMERIC, _REAL, _SMALLINT, _TINYINT]
_TEXT = [_CHAR, _VARCHAR, _LONGVARCHAR]
_CONVERSIONS: dict[int, list[int]] = {
    **{n: _NUMBERS + _TEXT for n in _NUMBERS},
    **{t: _NUMBERS + _TEXT + [_DATE, _TIME, _TIMESTAMP, _BINARY, _VARBINARY] for t in _TEXT},
    _DATE: [_DATE, _TIMESTAMP] + _TEXT,
    _TIME: [_TIME] + _TEXT,
    _TIMESTAMP: [_DATE, _TIME, _TIMESTAMP] + _TEXT,
    _BINARY: [_BINARY, _VARBINARY, _LONGVARBINARY] + _TEXT,
    _VARBINARY: [_BINARY, _VARBINARY, _LONGVARBINARY] + _TEXT,
    _LONGVARBINARY: [_BINARY, _VARBINARY, _LONGVARBINARY] + _TEXT,
}

# Keywords beyond SQL:2003 that DuckDB reserves or treats specially (JDBC getSQLKeywords).
SQL_KEYWORDS = [
    "ANALYZE", "ANTI", "ASOF", "ATTACH", "CHECKPOINT", "COLUMNS", "COPY", "DESCRIBE", "DETACH",
    "EXCLUDE", "EXPLAIN", "EXPORT", "FORCE", "GLOB", "ILIKE", "IMPORT", "INSTALL", "LIMIT",
    "LOAD", "MACRO", "MAP", "OFFSET", "PIVOT", "POSITIONAL", "PRAGMA", "QUALIFY", "RENAME",
    "REPLACE", "RETURNING", "SAMPLE", "SEMI", "SEQUENCE", "SHOW", "STRUCT", "SUMMARIZE",
    "TRUNCATE", "TRY_CAST", "UNPIVOT", "USE", "VACUUM",
]  # fmt: skip
#: SQL forms DuckDB parses into something else, each checked by the guard as what it becomes
#: (CURRENT_TIME -> get_current_time(), EXTRACT -> date_part(), COALESCE/IFNULL -> the
#: COALESCE operator): advertised though they are not on the function allow-list by name.
SYNTAX_FUNCTIONS = frozenset({"COALESCE", "CURRENT_TIME", "CURRENT_TIMESTAMP", "EXTRACT",
                              "IFNULL"})


def _callable(names: list[str]) -> list[str]:
    """The names a statement may call: on the function allow-list (which lists only what
    DuckDB has) or one of :data:`SYNTAX_FUNCTIONS`. What GetSqlInfo advertises is derived
    through this, so it cannot name a function the server refuses or DuckDB lacks."""
    return [n for n in names if n.lower() in SCALAR_FUNCTIONS or n in SYNTAX_FUNCTIONS]


NUMERIC_FUNCTIONS = _callable([
    "ABS", "ACOS", "ASIN", "ATAN", "ATAN2", "CBRT", "CEIL", "CEILING", "COS", "COT", "DEGREES",
    "EXP", "FLOOR", "GREATEST", "LEAST", "LN", "LOG", "LOG10", "LOG2", "MOD", "PI", "POWER",
    "RADIANS", "RANDOM", "ROUND", "SIGN", "SIN", "SQRT", "TAN", "TRUNC",
])  # fmt: skip
STRING_FUNCTIONS = _callable([
    "ASCII", "CHR", "CONCAT", "CONCAT_WS", "CONTAINS", "ENDS_WITH", "LCASE", "LEFT", "LENGTH",
    "LOWER", "LPAD", "LTRIM", "POSITION", "REGEXP_MATCHES", "REGEXP_REPLACE", "REPEAT",
    "REPLACE", "REVERSE", "RIGHT", "RPAD", "RTRIM", "SPLIT_PART", "STARTS_WITH", "STRPOS",
    "SUBSTR", "SUBSTRING", "TRIM", "UCASE", "UPPER",
])  # fmt: skip
# the session's values answer for the server (the principal, flightsrv, main:
# flightsrv.engine.connection); VERSION is refused
SYSTEM_FUNCTIONS = _callable([
    "COALESCE", "CURRENT_CATALOG", "CURRENT_DATABASE", "CURRENT_ROLE", "CURRENT_SCHEMA",
    "CURRENT_USER", "IFNULL", "NULLIF", "SESSION_USER", "USER",
])  # fmt: skip
DATETIME_FUNCTIONS = _callable([
    "AGE", "CURRENT_DATE", "CURRENT_TIME", "CURRENT_TIMESTAMP", "DATE_ADD", "DATE_DIFF",
    "DATE_PART", "DATE_TRUNC", "DAYNAME", "DAYOFMONTH", "DAYOFWEEK", "DAYOFYEAR", "EPOCH",
    "EXTRACT", "HOUR", "LAST_DAY", "MINUTE", "MONTH", "MONTHNAME", "NOW", "QUARTER", "SECOND",
    "STRFTIME", "STRPTIME", "WEEK", "YEAR",
])  # fmt: skip


def sql_info_values(server_version: str, read_only: bool = False,
                    config=None) -> dict[int, object]:
    """Every SqlInfo key of the spec, with this server's answer. ``read_only`` is per
    principal (a reader gets True); ``config`` (a ``ServerConfig``) supplies the limits.

    Value types choose the union member: str -> string_value, bool -> bool_value,
    I32 -> int32_bitmask, int -> bigint_value, list[str] -> string_list,
    dict[int, list[int]] -> int32_to_int32_list_map.
    """
    prepared_ttl_s = getattr(config, "prepared_ttl_s", 0)
    max_statement_bytes = getattr(config, "max_statement_bytes", 0)
    max_statements = getattr(config, "max_prepared_statements", 0)
    values: dict[int, object] = {
        0: SERVER_NAME,  # FLIGHT_SQL_SERVER_NAME
        1: server_version,  # FLIGHT_SQL_SERVER_VERSION
        2: pa.__version__,  # FLIGHT_SQL_SERVER_ARROW_VERSION
        3: read_only,  # FLIGHT_SQL_SERVER_READ_ONLY
        4: True,  # FLIGHT_SQL_SERVER_SQL
        5: False,  # FLIGHT_SQL_SERVER_SUBSTRAIT
        6: "",  # FLIGHT_SQL_SERVER_SUBSTRAIT_MIN_VERSION (unsupported)
        7: "",  # FLIGHT_SQL_SERVER_SUBSTRAIT_MAX_VERSION (unsupported)
        8: I32(0),  # FLIGHT_SQL_SERVER_TRANSACTION: SQL_SUPPORTED_TRANSACTION_NONE
        9: True,  # FLIGHT_SQL_SERVER_CANCEL: CancelQuery / CancelFlightInfo interrupt
        10: True,  # FLIGHT_SQL_SERVER_BULK_INGESTION: CommandStatementIngest
        11: False,  # FLIGHT_SQL_SERVER_INGEST_TRANSACTIONS_SUPPORTED
        # FLIGHT_SQL_SERVER_STATEMENT_TIMEOUT: the spec's meaning is the idle timeout of a
        # prepared statement handle, in ms (the query timeout is --query-timeout)
        100: I32(min(int(prepared_ttl_s * 1000), 2**31 - 1)),
        101: I32(0),  # FLIGHT_SQL_SERVER_TRANSACTION_TIMEOUT: no transactions
        500: False,  # SQL_DDL_CATALOG
        501: False,  # SQL_DDL_SCHEMA
        502: True,  # SQL_DDL_TABLE
        # CASE_INSENSITIVE: DuckDB matches names in either case (tables are stored in lower
        # case, columns as written); GetTables' table name filter does too
        503: I32(1),  # SQL_IDENTIFIER_CASE: CASE_INSENSITIVE
        504: '"',  # SQL_IDENTIFIER_QUOTE_CHAR
        505: I32(1),  # SQL_QUOTED_IDENTIFIER_CASE: CASE_INSENSITIVE (DuckDB)
        506: True,  # SQL_ALL_TABLES_ARE_SELECTABLE
        507: I32(3),  # SQL_NULL_ORDERING: NULLS_SORTED_AT_END (DuckDB's NULLS LAST)
        508: SQL_KEYWORDS,
        509: NUMERIC_FUNCTIONS,
        510: STRING_FUNCTIONS,
        511: SYSTEM_FUNCTIONS,
        512: DATETIME_FUNCTIONS,
        513: "\\",  # SQL_SEARCH_STRING_ESCAPE
        514: "",  # SQL_EXTRA_NAME_CHARACTERS
        515: True,  # SQL_SUPPORTS_COLUMN_ALIASING
        516: True,  # SQL_NULL_PLUS_NULL_IS_NULL
        517: _CONVERSIONS,  # SQL_SUPPORTS_CONVERT
        518: True,  # SQL_SUPPORTS_TABLE_CORRELATION_NAMES
        519: False,  # SQL_SUPPORTS_DIFFERENT_TABLE_CORRELATION_NAMES
        520: True,  # SQL_SUPPORTS_EXPRESSIONS_IN_ORDER_BY
        521: True,  # SQL_SUPPORTS_ORDER_BY_UNRELATED
        522: _bits(0, 1),  # SQL_SUPPORTED_GROUP_BY: UNRELATED, BEYOND_SELECT
        523: True,  # SQL_SUPPORTS_LIKE_ESCAPE_CLAUSE
        524: True,  # SQL_SUPPORTS_NON_NULLABLE_COLUMNS
        525: _bits(0, 1),  # SQL_SUPPORTED_GRAMMAR: MINIMUM, CORE
        526: _bits(0, 1),  # SQL_ANSI92_SUPPORTED_LEVEL: ENTRY, INTERMEDIATE
        527: False,  # SQL_SUPPORTS_INTEGRITY_ENHANCEMENT_FACILITY
        # SQL_OUTER_JOINS_SUPPORT_LEVEL: the spec's enum says FULL_OUTER_JOINS = 2, but the
        # Flight SQL JDBC driver (arrow-java 18.x) reads this item as a bitmask of levels
        # (supportsFullOuterJoins: bit 2, supportsLimitedOuterJoins: bit 1), so 2 read as
        # "limited only"; JDBC's contract is that full support implies limited: bits 1 and 2
        528: _bits(1, 2),
        529: "schema",  # SQL_SCHEMA_TERM
        530: "procedure",  # SQL_PROCEDURE_TERM
        531: "catalog",  # SQL_CATALOG_TERM
        532: True,  # SQL_CATALOG_AT_START
        533: I32(0),  # SQL_SCHEMAS_SUPPORTED_ACTIONS
        534: I32(0),  # SQL_CATALOGS_SUPPORTED_ACTIONS
        535: I32(0),  # SQL_SUPPORTED_POSITIONED_COMMANDS
        536: False,  # SQL_SELECT_FOR_UPDATE_SUPPORTED
        537: False,  # SQL_STORED_PROCEDURES_SUPPORTED
        538: _bits(0, 1, 2, 3),  # SQL_SUPPORTED_SUBQUERIES: all four
        539: True,  # SQL_CORRELATED_SUBQUERIES_SUPPORTED
        540: _bits(0, 1),  # SQL_SUPPORTED_UNIONS: UNION, UNION ALL
        **{k: 0 for k in range(541, 562)},  # SQL_MAX_*: 0 = no limit / unknown
        556: False,  # SQL_MAX_ROW_SIZE_INCLUDES_BLOBS (a bool, unlike its neighbours)
        557: max_statement_bytes,  # SQL_MAX_STATEMENT_LENGTH (--max-statement-bytes)
        558: max_statements,  # SQL_MAX_STATEMENTS: open prepared statements per principal
        # SQL_DEFAULT_TRANSACTION_ISOLATION: TRANSACTION_NONE, as an int64: the JDBC driver
        # casts it to Long (an int32 threw ClassCastException from
        # getDefaultTransactionIsolation), as arrow-java's own SqlInfoBuilder writes it
        562: 0,
        563: False,  # SQL_TRANSACTIONS_SUPPORTED
        564: _bits(0),  # SQL_SUPPORTED_TRANSACTIONS_ISOLATION_LEVELS: NONE
        565: False,  # SQL_DATA_DEFINITION_CAUSES_TRANSACTION_COMMIT
        566: False,  # SQL_DATA_DEFINITIONS_IN_TRANSACTIONS_IGNORED
        567: _bits(1),  # SQL_SUPPORTED_RESULT_SET_TYPES: FORWARD_ONLY
        568: _bits(1),  # ..._CONCURRENCIES_FOR_RESULT_SET_UNSPECIFIED: READ_ONLY
        569: _bits(1),  # ..._FORWARD_ONLY: READ_ONLY
        570: I32(0),  # ..._SCROLL_SENSITIVE: unsupported
        571: I32(0),  # ..._SCROLL_INSENSITIVE: unsupported
        572: True,  # SQL_BATCH_UPDATES_SUPPORTED
        573: False,  # SQL_SAVEPOINTS_SUPPORTED
        574: False,  # SQL_NAMED_PARAMETERS_SUPPORTED
        575: False,  # SQL_LOCATORS_UPDATE_COPY
        576: False,  # SQL_STORED_FUNCTIONS_USING_CALL_SYNTAX_SUPPORTED
    }
    return values


def sql_info_table(values: dict[int, object], keys: list[int] | None) -> pa.Table:
    """The GetSqlInfo result for ``keys`` (all known keys when empty); unknown keys skipped."""
    wanted = sorted(values) if not keys else [k for k in keys if k in values]
    names, type_ids, offsets = [], [], []
    children: list[list] = [[] for _ in range(6)]
    for key in wanted:
        value = values[key]
        if isinstance(value, bool):
            code = 1
        elif isinstance(value, str):
            code = 0
        elif isinstance(value, I32):
            code, value = 3, int(value)
        elif isinstance(value, int):
            code = 2
        elif isinstance(value, list):
            code = 4
        elif isinstance(value, dict):
            code, value = 5, list(value.items())
        else:  # pragma: no cover - a bug in the table above
            raise TypeError(f"SqlInfo {key}: unsupported value {value!r}")
        names.append(key)
        type_ids.append(code)
        offsets.append(len(children[code]))
        children[code].append(value)
    member_types = [f.type for f in SQL_INFO_VALUE_TYPE]
    union = pa.UnionArray.from_dense(
        pa.array(type_ids, pa.int8()),
        pa.array(offsets, pa.int32()),
        [pa.array(c, t) for c, t in zip(children, member_types)],
        [f.name for f in SQL_INFO_VALUE_TYPE],
        list(range(6)),
    )
    return pa.Table.from_arrays([pa.array(names, pa.uint32()), union], schema=SQL_INFO_SCHEMA)


# -- XDBC types -------------------------------------------------------------------------
# GetXdbcTypeInfo answers one row per DuckDB type a table column or a result can have, with
# the type codes of java.sql.Types (https://docs.oracle.com/en/java/javase/17/docs/api/
# java.sql/java/sql/Types.html), which equal ODBC's where both define one. Where JDBC has a
# code the Flight SQL JDBC driver does not use, the row gives the driver's (its
# SqlTypes.getSqlTypeIdFromArrowType, arrow-java 18.3): Arrow binary is VARBINARY, a struct,
# map or interval is JAVA_OBJECT, so getTypeInfo and getColumns agree.

BIT, TINYINT, BIGINT, VARBINARY = -7, -6, -5, -3
DECIMAL, INTEGER, SMALLINT, REAL, DOUBLE, VARCHAR = 3, 4, 5, 7, 8, 12
BOOLEAN, DATE, TIME, TIMESTAMP = 16, 91, 92, 93
JAVA_OBJECT, ARRAY, TIMESTAMP_WITH_TIMEZONE = 2000, 2003, 2014
# XdbcDataType / XdbcDatetimeSubcode (FlightSql.proto) for sql_data_type and datetime_subcode
_XDBC_DATETIME, _XDBC_INTERVAL = 9, 10
_SUB_DATE, _SUB_TIME, _SUB_TIMESTAMP, _SUB_TIMESTAMP_TZ = 1, 2, 3, 5


class XdbcType(NamedTuple):
    """One GetXdbcTypeInfo row (the fields the spec's result schema names)."""

    type_name: str
    data_type: int
    column_size: int | None = None
    literal_prefix: str | None = None
    literal_suffix: str | None = None
    create_params: list[str] | None = None
    case_sensitive: bool = False
    unsigned_attribute: bool | None = None  # None: not numeric
    fixed_prec_scale: bool = False
    minimum_scale: int | None = None
    maximum_scale: int | None = None
    sql_data_type: int | None = None  # None: data_type
    datetime_subcode: int | None = None
    num_prec_radix: int | None = None


def _int(name: str, code: int, digits: int, unsigned: bool = False) -> XdbcType:
    return XdbcType(name, code, digits, unsigned_attribute=unsigned, minimum_scale=0,
                    maximum_scale=0, num_prec_radix=10)


def _datetime(name: str, code: int, size: int, prefix: str, sub: int) -> XdbcType:
    return XdbcType(name, code, size, f"{prefix} '", "'", sql_data_type=_XDBC_DATETIME,
                    datetime_subcode=sub)


#: DuckDB type name -> its row. Column sizes follow JDBC's getTypeInfo PRECISION: digits for
#: numbers (binary digits for floating point), characters of the literal for datetimes.
XDBC_TYPES: dict[str, XdbcType] = {t.type_name: t for t in [
    XdbcType("BOOLEAN", BOOLEAN, 1, sql_data_type=BIT),
    _int("TINYINT", TINYINT, 3), _int("SMALLINT", SMALLINT, 5),
    _int("INTEGER", INTEGER, 10), _int("BIGINT", BIGINT, 19),
    _int("UTINYINT", TINYINT, 3, True), _int("USMALLINT", SMALLINT, 5, True),
    _int("UINTEGER", INTEGER, 10, True), _int("UBIGINT", BIGINT, 20, True),
    XdbcType("FLOAT", REAL, 24, unsigned_attribute=False, num_prec_radix=2),  # 4-byte: REAL
    XdbcType("DOUBLE", DOUBLE, 53, unsigned_attribute=False, num_prec_radix=2),
    XdbcType("DECIMAL", DECIMAL, 38, create_params=["precision", "scale"],
             unsigned_attribute=False, fixed_prec_scale=True, minimum_scale=0,
             maximum_scale=38, num_prec_radix=10),
    XdbcType("VARCHAR", VARCHAR, None, "'", "'", case_sensitive=True),
    XdbcType("BLOB", VARBINARY, None, "'", "'::BLOB"),
    _datetime("DATE", DATE, 10, "DATE", _SUB_DATE),
    _datetime("TIME", TIME, 15, "TIME", _SUB_TIME),
    _datetime("TIMESTAMP", TIMESTAMP, 26, "TIMESTAMP", _SUB_TIMESTAMP),
    _datetime("TIMESTAMP WITH TIME ZONE", TIMESTAMP_WITH_TIMEZONE, 32, "TIMESTAMPTZ",
              _SUB_TIMESTAMP_TZ),
    XdbcType("INTERVAL", JAVA_OBJECT, None, "INTERVAL '", "'", sql_data_type=_XDBC_INTERVAL),
    XdbcType("LIST", ARRAY),
    XdbcType("STRUCT", JAVA_OBJECT),
    XdbcType("MAP", JAVA_OBJECT),
]}  # fmt: skip


def xdbc_type_info(data_type: int | None) -> pa.Table:
    """The GetXdbcTypeInfo rows, ordered by data_type then name (JDBC's getTypeInfo order);
    ``data_type`` keeps only the rows of that code."""
    rows = sorted((t for t in XDBC_TYPES.values()
                   if data_type is None or t.data_type == data_type),
                  key=lambda t: (t.data_type, t.type_name))
    dicts = []
    for t in rows:
        row = t._asdict()
        row["sql_data_type"] = t.data_type if t.sql_data_type is None else t.sql_data_type
        row["nullable"] = 1  # NULLABILITY_NULLABLE
        row["searchable"] = 3  # SEARCHABLE_FULL
        row["auto_increment"] = False if t.unsigned_attribute is not None else None
        row["local_type_name"] = t.type_name
        row["interval_precision"] = None
        dicts.append(row)
    return pa.Table.from_pylist(dicts, schema=XDBC_TYPE_INFO_SCHEMA)


#: Arrow type predicate -> the XDBC_TYPES name reported as ARROW:FLIGHT:SQL:TYPE_NAME, tried
#: in order (DECIMAL gets its precision and scale in the name and in PRECISION/SCALE).
_TYPE_NAMES: list[tuple[Callable[[pa.DataType], bool], str]] = [
    (pa.types.is_boolean, "BOOLEAN"),
    (pa.types.is_int8, "TINYINT"), (pa.types.is_int16, "SMALLINT"),
    (pa.types.is_int32, "INTEGER"), (pa.types.is_int64, "BIGINT"),
    (pa.types.is_uint8, "UTINYINT"), (pa.types.is_uint16, "USMALLINT"),
    (pa.types.is_uint32, "UINTEGER"), (pa.types.is_uint64, "UBIGINT"),
    (pa.types.is_float32, "FLOAT"), (pa.types.is_float64, "DOUBLE"),
    (pa.types.is_decimal, "DECIMAL"),
    (pa.types.is_string, "VARCHAR"), (pa.types.is_large_string, "VARCHAR"),
    (pa.types.is_string_view, "VARCHAR"),
    (pa.types.is_binary, "BLOB"), (pa.types.is_large_binary, "BLOB"),
    (pa.types.is_fixed_size_binary, "BLOB"), (pa.types.is_binary_view, "BLOB"),
    (pa.types.is_date, "DATE"), (pa.types.is_time, "TIME"),
    (lambda t: pa.types.is_timestamp(t) and bool(t.tz), "TIMESTAMP WITH TIME ZONE"),
    (pa.types.is_timestamp, "TIMESTAMP"),
    (pa.types.is_interval, "INTERVAL"), (pa.types.is_duration, "INTERVAL"),
    (pa.types.is_list, "LIST"), (pa.types.is_large_list, "LIST"),
    (pa.types.is_fixed_size_list, "LIST"),
    (pa.types.is_struct, "STRUCT"), (pa.types.is_map, "MAP"),
]  # fmt: skip


def sql_type_name(t: pa.DataType) -> str:
    """Arrow type -> SQL type name, for the ARROW:FLIGHT:SQL:TYPE_NAME column metadata."""
    for pred, name in _TYPE_NAMES:
        if pred(t):
            return f"DECIMAL({t.precision},{t.scale})" if name == "DECIMAL" else name
    return str(t).upper()


def _type_metadata(t: pa.DataType) -> dict[bytes, bytes]:
    """The ARROW:FLIGHT:SQL:* keys of a column's type: its name, and a DECIMAL's precision
    and scale."""
    md = {b"ARROW:FLIGHT:SQL:TYPE_NAME": sql_type_name(t).encode()}
    if pa.types.is_decimal(t):
        md[b"ARROW:FLIGHT:SQL:PRECISION"] = str(t.precision).encode()
        md[b"ARROW:FLIGHT:SQL:SCALE"] = str(t.scale).encode()
    return md


def _annotated(schema: pa.Schema, extra: dict[bytes, bytes], *, keep: bool) -> pa.Schema:
    """``schema`` with each field's type keys and ``extra`` added to its metadata; ``keep``:
    a key the field already has stays as it is."""
    fields = []
    for f in schema:
        add = {**_type_metadata(f.type), **extra}
        old = dict(f.metadata or {})
        fields.append(f.with_metadata({**add, **old} if keep else {**old, **add}))
    return pa.schema(fields, metadata=schema.metadata)


def annotate_table_schema(schema: pa.Schema, table: str) -> pa.Schema:
    """Add the ARROW:FLIGHT:SQL:* field metadata that JDBC's getColumns reads."""
    return _annotated(schema, {
        b"ARROW:FLIGHT:SQL:CATALOG_NAME": CATALOG.encode(),
        b"ARROW:FLIGHT:SQL:DB_SCHEMA_NAME": DB_SCHEMA.encode(),
        b"ARROW:FLIGHT:SQL:TABLE_NAME": table.encode(),
        b"ARROW:FLIGHT:SQL:IS_SEARCHABLE": b"1",
        b"ARROW:FLIGHT:SQL:IS_READ_ONLY": b"0",
    }, keep=False)


@functools.lru_cache(maxsize=256)
def annotate_result_schema(schema: pa.Schema) -> pa.Schema:
    """A query result's schema with the ARROW:FLIGHT:SQL:* field metadata a JDBC driver's
    ResultSetMetaData reads (getColumnTypeName, getPrecision/getScale of a DECIMAL,
    isReadOnly); the result's columns name no table (a query's column need not come from
    one). Kept: metadata a field already has. Schemas repeat (the engine caches them), so
    the annotated ones are kept too."""
    return _annotated(schema, {b"ARROW:FLIGHT:SQL:IS_READ_ONLY": b"1"}, keep=True)


class LikePattern:
    """A Flight SQL filter pattern (``%`` any run, ``_`` one character, ``\\`` escapes the
    next character), matched without backtracking: the pattern is split at ``%`` into
    segments; the first must match the name's start, the last its end, and each middle
    one is found leftmost in what is left (leftmost is always safe for a ``%`` before it).
    A name of n characters costs O(n^2) at most, whatever the pattern: a pattern whose
    fixed characters outnumber the name's is rejected before any search. (A regex built
    from ``'%' * 24 + 'Z'`` backtracked for 14 s under the GIL.) ``ignore_case``: ASCII
    letters match in either case, character for character (table names, which DuckDB
    matches case-insensitively and the format stores in lower case)."""

    __slots__ = ("segments", "fixed", "ignore_case")

    def __init__(self, pattern: str, ignore_case: bool = False):
        fold = _ascii_lower if ignore_case else str
        segments: list[list[str | None]] = [[]]  # None = any one character
        i = 0
        while i < len(pattern):
            ch = pattern[i]
            if ch == "\\" and i + 1 < len(pattern):
                segments[-1].append(fold(pattern[i + 1]))
                i += 2
                continue
            if ch == "%":
                segments.append([])
            else:
                segments[-1].append(None if ch == "_" else fold(ch))
            i += 1
        self.segments = segments
        self.fixed = sum(len(s) for s in segments)
        self.ignore_case = ignore_case

    @staticmethod
    def _at(seg: list[str | None], name: str, pos: int) -> bool:
        for k, want in enumerate(seg):
            if want is not None and name[pos + k] != want:
                return False
        return True

    def match(self, name: str) -> bool:
        if self.ignore_case:
            name = _ascii_lower(name)
        segs, n = self.segments, len(name)
        if self.fixed > n:
            return False
        if len(segs) == 1:
            return len(segs[0]) == n and self._at(segs[0], name, 0)
        first, last = segs[0], segs[-1]
        if not self._at(first, name, 0):
            return False
        lo, hi = len(first), n - len(last)  # the middle segments must fit in [lo, hi)
        if hi < lo or not self._at(last, name, hi):
            return False
        for seg in segs[1:-1]:
            for pos in range(lo, hi - len(seg) + 1):
                if self._at(seg, name, pos):
                    lo = pos + len(seg)
                    break
            else:
                return False
        return True


_ASCII_LOWER = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")


def _ascii_lower(text: str) -> str:
    """``text`` with its ASCII letters in lower case (same length: ``_`` stays one
    character, unlike ``str.lower``, which turns some letters into two)."""
    return text.translate(_ASCII_LOWER)


def like_pattern(pattern: str | None, ignore_case: bool = False) -> LikePattern | None:
    """``pattern`` compiled for :func:`matches`; None (no filter) matches everything."""
    return None if pattern is None else LikePattern(pattern, ignore_case)


def matches(pattern: LikePattern | None, name: str) -> bool:
    return pattern is None or pattern.match(name)
