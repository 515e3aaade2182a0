"""Arrow schemas as JSON, field ids, and column statistics values as JSON.

The manifest stores the table schema as Arrow types in JSON (docs/PROTOCOL.md §4.1).
Type codec: a table of simple types by name, plus parameterised types as objects.
Statistics values are stored in the column's physical-ish JSON form (ints for integers,
timestamps in their unit, dates in days, decimals as strings) and decoded back to Arrow
scalars of the column type for pruning.

Format 2 (docs/PROTOCOL.md §4.1, §14): every field, nested ones included, carries a stable
``id``; a top-level field may carry ``physical`` (the column name inside data files, when it
differs from ``name`` after a rename) and ``initial_default`` / ``write_default`` (JSON in the
statistics encoding). A schema carries ``schema_id``. :func:`schema_from_json` ignores all of
that and returns the logical Arrow schema (current names, current types); the helpers below
give the physical view that writers and readers of data files use.
"""

from __future__ import annotations

import decimal
import math
import re

import pyarrow as pa

from flightsrv.errors import ConfigurationError, CorruptObject
from flightsrv.table.names import RESERVED_PREFIX
from flightsrv.table.types import map_leaves

SIMPLE_TYPES: dict[str, pa.DataType] = {
    "null": pa.null(), "bool": pa.bool_(),
    "int8": pa.int8(), "int16": pa.int16(), "int32": pa.int32(), "int64": pa.int64(),
    "uint8": pa.uint8(), "uint16": pa.uint16(), "uint32": pa.uint32(), "uint64": pa.uint64(),
    "float16": pa.float16(), "float32": pa.float32(), "float64": pa.float64(),
    "string": pa.string(), "large_string": pa.large_string(), "string_view": pa.string_view(),
    "binary": pa.binary(), "large_binary": pa.large_binary(),
    "date32": pa.date32(), "date64": pa.date64(),
}
_SIMPLE_NAMES = {v: k for k, v in SIMPLE_TYPES.items()}


def type_to_json(t: pa.DataType):
    if t in _SIMPLE_NAMES:
        return _SIMPLE_NAMES[t]
    if pa.types.is_timestamp(t):
        return {"type": "timestamp", "unit": t.unit, "tz": t.tz}
    if pa.types.is_time32(t) or pa.types.is_time64(t):
        return {"type": "time", "bits": t.bit_width, "unit": t.unit}
    if pa.types.is_duration(t):
        return {"type": "duration", "unit": t.unit}
    if pa.types.is_decimal(t):
        return {"type": "decimal", "bits": t.bit_width, "precision": t.precision, "scale": t.scale}
    if pa.types.is_fixed_size_binary(t):
        return {"type": "fixed_size_binary", "width": t.byte_width}
    if pa.types.is_large_list(t):
        return {"type": "large_list", "item": field_to_json(t.value_field)}
    if pa.types.is_fixed_size_list(t):
        return {"type": "fixed_size_list", "size": t.list_size,
                "item": field_to_json(t.value_field)}
    if pa.types.is_map(t):
        return {"type": "map", "key": field_to_json(t.key_field),
                "item": field_to_json(t.item_field), "keys_sorted": t.keys_sorted}
    if pa.types.is_list(t):
        return {"type": "list", "item": field_to_json(t.value_field)}
    if pa.types.is_struct(t):
        return {"type": "struct",
                "fields": [field_to_json(t.field(i)) for i in range(t.num_fields)]}
    if pa.types.is_dictionary(t):
        return type_to_json(t.value_type)
    raise TypeError(f"unsupported Arrow type for a flightsrv table: {t}")


def type_from_json(j) -> pa.DataType:
    if isinstance(j, str):
        try:
            return SIMPLE_TYPES[j]
        except KeyError:
            raise CorruptObject("unknown type name in schema", type=j) from None
    kind = j["type"]
    if kind == "timestamp":
        return pa.timestamp(j["unit"], tz=j.get("tz"))
    if kind == "time":
        return pa.time32(j["unit"]) if j["bits"] == 32 else pa.time64(j["unit"])
    if kind == "duration":
        return pa.duration(j["unit"])
    if kind == "decimal":
        f = pa.decimal128 if j["bits"] == 128 else pa.decimal256
        return f(j["precision"], j["scale"])
    if kind == "fixed_size_binary":
        return pa.binary(j["width"])
    if kind == "list":
        return pa.list_(field_from_json(j["item"]))
    if kind == "large_list":
        return pa.large_list(field_from_json(j["item"]))
    if kind == "fixed_size_list":
        return pa.list_(field_from_json(j["item"]), j["size"])
    if kind == "map":
        return pa.map_(field_from_json(j["key"]), field_from_json(j["item"]),
                       j.get("keys_sorted", False))
    if kind == "struct":
        return pa.struct([field_from_json(f) for f in j["fields"]])
    raise CorruptObject("unknown type in schema", type=kind)


#: Arrow field metadata that pyarrow's Parquet writer turns into the Parquet field id
PARQUET_FIELD_ID = b"PARQUET:field_id"


def field_to_json(f: pa.Field) -> dict:
    out = {"name": f.name, "type": type_to_json(f.type), "nullable": f.nullable}
    if f.metadata:
        meta = {k.decode(): v.decode() for k, v in f.metadata.items()
                if k != PARQUET_FIELD_ID}
        if meta:
            out["metadata"] = meta
    return out


def field_from_json(j: dict) -> pa.Field:
    return pa.field(j["name"], type_from_json(j["type"]), j.get("nullable", True),
                    metadata=j.get("metadata"))


def schema_fingerprint(j: dict) -> tuple:
    """What a schema means to a reader of the logical table (names, types, nullability),
    without ids or schema_id: equal fingerprints read the same Arrow schema."""
    return tuple((f["name"], repr(f["type"]), f.get("nullable", True)) for f in j["fields"])


def schema_to_json(s: pa.Schema) -> dict:
    return {"fields": [field_to_json(f) for f in s]}


def schema_from_json(j: dict) -> pa.Schema:
    return pa.schema([field_from_json(f) for f in j["fields"]])


MAX_COLUMN_NAME = 255
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def check_column_names(schema: pa.Schema, table: str | None = None) -> None:
    """Refuse names a table cannot hold: empty, longer than 255 characters, with control
    characters or leading/trailing spaces, starting with ``__fsrv`` (top-level: the
    engine's hidden columns), or equal to another column's name ignoring case
    (SQL, DuckDB included, resolves identifiers case-insensitively). Nested struct fields
    follow the same rules among their siblings."""

    def check(fields: list[pa.Field], where: str | None) -> None:
        seen: dict[str, str] = {}
        for f in fields:
            name = f.name
            problem = None
            if not name:
                problem = "a column name is empty"
            elif len(name) > MAX_COLUMN_NAME:
                problem = f"a column name is longer than {MAX_COLUMN_NAME} characters"
            elif _CONTROL.search(name):
                problem = "a column name contains a control character"
            elif name != name.strip():
                problem = "a column name starts or ends with a space"
            elif where is None and name.lower().startswith(RESERVED_PREFIX):
                # the engine's hidden columns (a row's file and position) take such names
                problem = f"column names starting with {RESERVED_PREFIX!r} are reserved"
            elif name.lower() in seen:
                problem = "duplicate column name" + (
                    "" if seen[name.lower()] == name else " (names are case-insensitive)")
            if problem:
                raise ConfigurationError(problem, table=table, column=repr(name),
                                         parent=where)
            seen[name.lower()] = name
            if pa.types.is_struct(f.type):
                check([f.type.field(i) for i in range(f.type.num_fields)],
                      f"{where}.{name}" if where else name)

    check(list(schema), None)


def check_column_types(schema: pa.Schema, table: str | None = None) -> None:
    """Refuse a column whose Arrow type a table cannot store (no entry in the type codec,
    e.g. month_day_nano intervals, which Parquet cannot hold, or unions), naming the table
    and the column, before anything is written."""
    for f in schema:
        try:
            type_to_json(f.type)
        except TypeError:
            raise ConfigurationError("unsupported column type", table=table, column=f.name,
                                     type=str(f.type)) from None
        wide = _wide_decimal(f.type)
        if wide is not None:  # DuckDB would read it as DOUBLE: digits would be lost
            raise ConfigurationError("DECIMAL precision must be between 1 and 38",
                                     table=table, column=f.name, type=str(wide))
        if _type_depth(f.type) > MAX_TYPE_DEPTH:
            # Arrow's C data interface (DuckDB's scans, Flight's schemas) stops at 64
            # levels: a deeper column could be created but never read or listed
            raise ConfigurationError(f"a column type nested more than {MAX_TYPE_DEPTH} "
                                     "levels deep", table=table, column=f.name)


#: the deepest a column type may nest (lists, structs, maps; a map counts two levels)
MAX_TYPE_DEPTH = 32


def _type_depth(t: pa.DataType) -> int:
    """Levels of nesting in ``t``: 0 for a plain type, 1 for a list of one, ..."""
    if not t.num_fields:
        return 0
    return 1 + max(_type_depth(t.field(i).type) for i in range(t.num_fields))


def _wide_decimal(t: pa.DataType) -> pa.DataType | None:
    """The first decimal type in ``t`` (nested ones too) with more than 38 digits."""
    if pa.types.is_decimal(t):
        return t if t.precision > 38 else None
    for i in range(t.num_fields):
        found = _wide_decimal(t.field(i).type)
        if found is not None:
            return found
    return None


def normalize_schema(s: pa.Schema) -> pa.Schema:
    """The schema a table stores: dictionary types decoded, schema metadata dropped, and
    each type DuckDB has no exact counterpart for widened to one it reads and writes back
    (:func:`duckdb_storable`)."""
    return storable_schema(schema_from_json(schema_to_json(s.remove_metadata())))


def storable_schema(s: pa.Schema) -> pa.Schema:
    """``s`` with each field's type :func:`duckdb_storable`: how DuckDB reads the table's
    files (a table written before such types were widened at creation included)."""
    return pa.schema([f.with_type(duckdb_storable(f.type)) for f in s])


def duckdb_storable(t: pa.DataType) -> pa.DataType:
    """``t`` with each Arrow type DuckDB has no type for replaced by the one DuckDB reads
    its values as, which holds every value exactly: ``float16`` -> ``float32``,
    ``decimal256(p, s)`` -> ``decimal128(p, s)`` (p <= 38), ``time32`` -> ``time64[us]``, a
    seconds or milliseconds timestamp with a time zone -> microseconds (DuckDB's
    TIMESTAMPTZ), a fixed-size list -> a list (Parquet stores a list; DuckDB reads it back
    as LIST, and no SQL value of its ARRAY type could be written to it), nested ones too. A
    table of the narrower type could be read but not
    written by SQL (DuckDB's values are of the wider type) and, for the first two, not
    scanned by DuckDB from Arrow at all (deleted rows, an empty table,
    ``information_schema``). ``fixed_size_binary[n]`` stays (Iceberg's ``fixed[n]``): SQL
    writes check each BLOB's length instead (``types.fit_sql_rows``)."""
    def leaf(x: pa.DataType) -> pa.DataType:
        if pa.types.is_float16(x):
            return pa.float32()
        if pa.types.is_decimal(x) and x.bit_width == 256 and x.precision <= 38:
            return pa.decimal128(x.precision, x.scale)
        if pa.types.is_time32(x):
            return pa.time64("us")
        if pa.types.is_timestamp(x) and x.tz is not None and x.unit in ("s", "ms"):
            return pa.timestamp("us", tz=x.tz)
        if pa.types.is_fixed_size_list(x):
            return pa.list_(x.value_field.with_type(duckdb_storable(x.value_type)))
        return x

    return map_leaves(t, leaf)


# -- statistics values -------------------------------------------------------------

_MAX_STAT_STRING = 256


def stat_to_json(value, t: pa.DataType, *, is_max: bool):
    """Encode a Parquet statistics value for column type ``t``; None if not storable.

    Strings longer than 256 characters keep a truncated *min* (still a lower bound) and drop
    the max (a truncated max would not be an upper bound)."""
    if value is None:
        return None
    if pa.types.is_boolean(t) or pa.types.is_integer(t):
        return int(value) if not pa.types.is_boolean(t) else bool(value)
    if pa.types.is_floating(t):
        if isinstance(value, bytes):  # float16 statistics come back as their 2 raw bytes
            import struct

            value = struct.unpack("<e", value)[0] if len(value) == 2 else float("nan")
        v = float(value)
        return None if math.isnan(v) or math.isinf(v) else v
    if pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t):
        if isinstance(value, bytes):
            value = value.decode("utf-8", "replace")
        if len(value) > _MAX_STAT_STRING:
            return None if is_max else value[:_MAX_STAT_STRING]
        return value
    if pa.types.is_timestamp(t) or pa.types.is_date(t) or pa.types.is_time(t) \
            or pa.types.is_duration(t):
        if pa.types.is_date(t):
            return pa.scalar(value, type=pa.date32()).cast(pa.int32()).as_py()
        # time32 casts only to and from int32
        return pa.scalar(value, type=t).cast(_ticks_type(t)).as_py()
    if pa.types.is_decimal(t):
        return str(value)
    return None


def stat_from_json(value, t: pa.DataType) -> pa.Scalar | None:
    if value is None:
        return None
    if pa.types.is_timestamp(t) or pa.types.is_time(t) or pa.types.is_duration(t):
        return pa.scalar(value, _ticks_type(t)).cast(t)
    if pa.types.is_date(t):
        return pa.scalar(value, pa.int32()).cast(pa.date32()).cast(t)
    if pa.types.is_decimal(t):
        return pa.scalar(decimal.Decimal(value), t)
    return pa.scalar(value, t)


def _ticks_type(t: pa.DataType) -> pa.DataType:
    """The integer type a temporal type's statistics are stored as (its ticks)."""
    return pa.int32() if pa.types.is_time32(t) else pa.int64()


def has_stats(t: pa.DataType) -> bool:
    return (pa.types.is_boolean(t) or pa.types.is_integer(t) or pa.types.is_floating(t)
            or pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_timestamp(t)
            or pa.types.is_date(t) or pa.types.is_time(t) or pa.types.is_decimal(t)
            or pa.types.is_duration(t))


# -- field ids, physical names, defaults (format 2) ---------------------------------


def _child_fields(t) -> list[dict]:
    """The nested field dicts of a type JSON, in id order (list item; map key, value;
    struct fields)."""
    if not isinstance(t, dict):
        return []
    kind = t["type"]
    if kind in ("list", "large_list", "fixed_size_list"):
        return [t["item"]]
    if kind == "map":
        return [t["key"], t["item"]]
    if kind == "struct":
        return list(t["fields"])
    return []


def _assign_nested(t, next_id: int) -> int:
    """Ids for the nested fields of type ``t``: a node's children get consecutive ids, then
    each child's own children, depth-first (the order docs/INTEROP.md §3 fixed for the
    mirrors, so format-1 tables keep the ids their mirrors already published)."""
    kids = _child_fields(t)
    for k in kids:
        if "id" not in k:
            next_id += 1
            k["id"] = next_id
    for k in kids:
        next_id = _assign_nested(k["type"], next_id)
    return next_id


def with_field_ids(fields: list[dict], last_id: int = 0) -> tuple[list[dict], int]:
    """Copies of ``fields`` (top-level field JSON) where every field without an id gets one
    above ``last_id``: the top-level fields first, in order, then their nested fields.
    Returns (fields, the largest id used)."""
    import copy

    out = copy.deepcopy(fields)
    for f in out:
        if "id" not in f:
            last_id += 1
            f["id"] = last_id
    for f in out:
        last_id = _assign_nested(f["type"], last_id)
    return out, last_id


def max_field_id(fields: list[dict]) -> int:
    best = 0
    for f in fields:
        best = max(best, int(f.get("id", 0)), max_field_id(_child_fields(f["type"])))
    return best


def physical_name(f: dict) -> str:
    """The column name inside data files written under the schema holding ``f``."""
    return f.get("physical", f["name"])


_NESTED_KINDS = ("list", "large_list", "fixed_size_list", "map", "struct")


def _arrow_field_physical(f: dict, name: str | None = None) -> pa.Field:
    t = f["type"]
    at = _typed_children(t) if isinstance(t, dict) and t["type"] in _NESTED_KINDS \
        else type_from_json(t)
    meta = dict(f.get("metadata") or {})
    if "id" in f:
        meta[PARQUET_FIELD_ID.decode()] = str(f["id"])
    return pa.field(name if name is not None else f["name"], at, f.get("nullable", True),
                    metadata=meta or None)


def _typed_children(t: dict) -> pa.DataType:
    kind = t["type"]
    if kind == "list":
        return pa.list_(_arrow_field_physical(t["item"]))
    if kind == "large_list":
        return pa.large_list(_arrow_field_physical(t["item"]))
    if kind == "fixed_size_list":
        return pa.list_(_arrow_field_physical(t["item"]), t["size"])
    if kind == "map":
        return pa.map_(_arrow_field_physical(t["key"]), _arrow_field_physical(t["item"]),
                       t.get("keys_sorted", False))
    return pa.struct([_arrow_field_physical(x) for x in t["fields"]])


def physical_arrow_schema(j: dict) -> pa.Schema:
    """The Arrow schema data files are written with: physical column names and every field
    id as ``PARQUET:field_id`` metadata (pyarrow writes them as Parquet field ids)."""
    return pa.schema([_arrow_field_physical(f, physical_name(f)) for f in j["fields"]])


def field_by_name(j: dict, name: str) -> dict | None:
    for f in j["fields"]:
        if f["name"] == name:
            return f
    low = name.lower()
    for f in j["fields"]:
        if f["name"].lower() == low:
            return f
    return None


def fields_by_id(j: dict) -> dict[int, dict]:
    return {int(f["id"]): f for f in j["fields"] if "id" in f}


def value_to_json(value, t: pa.DataType):
    """A Python value of column type ``t`` in the statistics encoding (used for partition
    values and column defaults): ints, floats, bools as JSON; strings as strings; dates as
    days; timestamps/times/durations as integers in the unit; decimals as strings; binary
    as hex. ``value`` may be an Arrow scalar: a date or timestamp one is encoded from its
    integer without passing through Python's ``datetime`` (which holds no BC date, no year
    past 9999 and no infinity, all of which DuckDB stores)."""
    if isinstance(value, pa.Scalar):
        if not value.is_valid:
            return None
        if pa.types.is_date(t) or pa.types.is_timestamp(t) or pa.types.is_time(t) or \
                pa.types.is_duration(t):
            width = pa.int32() if pa.types.is_date32(t) or pa.types.is_time32(t) \
                else pa.int64()
            n = value.cast(t).cast(width).as_py()
            if pa.types.is_date64(t):
                n //= 86_400_000
            return n
        value = value.as_py()
    if value is None:
        return None
    if pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_fixed_size_binary(t):
        return bytes(value).hex()
    if pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t):
        return str(value)
    if pa.types.is_floating(t):
        return float(value)
    if pa.types.is_boolean(t):
        return bool(value)
    if pa.types.is_integer(t):
        return int(value)
    if pa.types.is_date(t):
        return pa.scalar(value, type=pa.date32()).cast(pa.int32()).as_py()
    if pa.types.is_timestamp(t) or pa.types.is_time(t) or pa.types.is_duration(t):
        return pa.scalar(value, type=t).cast(pa.int64()).as_py()
    if pa.types.is_decimal(t):
        return str(value)
    raise ConfigurationError("no JSON encoding for a value of this type", type=str(t))


def value_from_json(value, t: pa.DataType) -> pa.Scalar:
    """The Arrow scalar of type ``t`` for a JSON value written by :func:`value_to_json`."""
    if value is None:
        return pa.scalar(None, t)
    if pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_fixed_size_binary(t):
        return pa.scalar(bytes.fromhex(value), t)
    if pa.types.is_timestamp(t) or pa.types.is_time(t) or pa.types.is_duration(t):
        return pa.scalar(int(value), pa.int64()).cast(t)
    if pa.types.is_date(t):
        return pa.scalar(int(value), pa.int32()).cast(pa.date32()).cast(t)
    if pa.types.is_decimal(t):
        return pa.scalar(decimal.Decimal(value), t)
    return pa.scalar(value, t)


# -- type widening (metadata-only type changes) ----------------------------------------

_INT_ORDER = ["int8", "int16", "int32", "int64"]
_UINT_ORDER = ["uint8", "uint16", "uint32", "uint64"]


def widening_allowed(old, new) -> bool:
    """Whether a column of type JSON ``old`` may become ``new`` without rewriting data:
    int8 -> int16 -> int32 -> int64 (and the unsigned chain), float32 -> float64, decimal
    precision up at the same scale (within its bit width class or to decimal256), and
    date32 -> timestamp without a time zone (any unit; midnight, as DuckDB and Arrow cast
    it), and a column of type null (every value NULL: an all-NULL first batch) to any type.
    Equal types are not a widening."""
    if old == new:
        return False
    if old == "null":
        return True
    for order in (_INT_ORDER, _UINT_ORDER):
        if old in order and new in order:
            return order.index(new) > order.index(old)
    if old == "float32" and new == "float64":
        return True
    if isinstance(old, dict) and isinstance(new, dict) and old.get("type") == "decimal" \
            and new.get("type") == "decimal":
        return new["scale"] == old["scale"] and new["precision"] > old["precision"] \
            and new["bits"] >= old["bits"]
    if old == "date32" and isinstance(new, dict) and new.get("type") == "timestamp" \
            and not new.get("tz"):
        return True
    return False


def write_defaults(schema_json: dict, target: pa.Schema) -> dict:
    """Column name -> the Python value rows written without that column take (the column's
    ``write_default``, set by ``ALTER TABLE ... ADD COLUMN ... DEFAULT v``)."""
    out = {}
    for f in (schema_json or {}).get("fields", []):
        d = f.get("write_default")
        if d is not None and f["name"] in target.names:
            out[f["name"]] = value_from_json(d, target.field(f["name"]).type).as_py()
    return out
