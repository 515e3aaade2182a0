"""Type rules for data written into a table: which incoming Arrow type may fill which column.

One table of rules, shared by every writer of Arrow data: the Python API
(``Table.append``), Arrow Flight SQL ingest (ADBC ``adbc_ingest``), and the Spark data source
(checked on the planning worker, applied in each task). SQL ``INSERT`` is different: DuckDB
casts the values of a statement to the table's types with its own rules, as for any DuckDB
table, before they reach this module.

The rule: an incoming column may fill a table column when the conversion is **exact for
every value the incoming type can hold** (a widening: ``int32`` into ``int64``, ``float32``
into ``float64``, ``decimal(10,2)`` into ``decimal(12,3)``, ``date32`` into a timestamp
without time zone, ...). Everything else (narrowing, parsing strings, dropping a time zone,
truncating a timestamp to a date, ``int64`` into ``float64``) is refused *before any data is
written*, with :class:`~flightsrv.errors.SchemaMismatch` naming the column, the table type
and the incoming type. So no write fails half-way because of one value, and no value is
silently changed. The only checks that depend on values are NOT NULL constraints (the
table's, at any nesting level), as in SQL.

The rules are data (:data:`WIDENINGS` for the plain types, :data:`FAMILY_RULES` for the
parameterised ones); docs/TYPES.md prints them (``python -m flightsrv.table.types``) and a
test keeps the two equal.

Names: :func:`resolve_columns` matches incoming column names to the table's, exactly or, with
``case_sensitive=False`` (Spark's default), ignoring case.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from flightsrv.errors import SchemaMismatch

# -- type keys ----------------------------------------------------------------------------

#: Arrow types that mean the same values in another layout: they fill each other freely.
SAME_VALUES: dict[pa.DataType, str] = {
    pa.string(): "string", pa.large_string(): "string", pa.string_view(): "string",
    pa.binary(): "binary", pa.large_binary(): "binary", pa.binary_view(): "binary",
}

_SIMPLE_KEYS: dict[pa.DataType, str] = {
    pa.bool_(): "bool",
    pa.int8(): "int8", pa.int16(): "int16", pa.int32(): "int32", pa.int64(): "int64",
    pa.uint8(): "uint8", pa.uint16(): "uint16", pa.uint32(): "uint32", pa.uint64(): "uint64",
    pa.float16(): "float16", pa.float32(): "float32", pa.float64(): "float64",
    pa.date32(): "date32", pa.date64(): "date64",
    **SAME_VALUES,
}

#: Plain widenings: incoming type -> the table types it may fill besides its own.
#: Integers widen to integers that hold every value, and to floats whose 24/53-bit mantissa
#: holds every value (never int64 -> float64); floats widen to wider floats; date32 and date64
#: hold the same days.
WIDENINGS: dict[str, frozenset[str]] = {
    "bool": frozenset(),
    "int8": frozenset({"int16", "int32", "int64", "float32", "float64"}),
    "int16": frozenset({"int32", "int64", "float32", "float64"}),
    "int32": frozenset({"int64", "float64"}),
    "int64": frozenset(),
    "uint8": frozenset({"uint16", "uint32", "uint64", "int16", "int32", "int64", "float32",
                        "float64"}),
    "uint16": frozenset({"uint32", "uint64", "int32", "int64", "float32", "float64"}),
    "uint32": frozenset({"uint64", "int64", "float64"}),
    "uint64": frozenset(),
    "float16": frozenset({"float32", "float64"}),
    "float32": frozenset({"float64"}),
    "float64": frozenset(),
    "date32": frozenset({"date64"}),
    "date64": frozenset({"date32"}),
    "string": frozenset(),
    "binary": frozenset(),
}

#: Decimal digits an integer type needs before the decimal point.
INTEGER_DIGITS: dict[str, int] = {"int8": 3, "int16": 5, "int32": 10, "int64": 19,
                                  "uint8": 3, "uint16": 5, "uint32": 10, "uint64": 20}

_UNIT_RANK = {"s": 0, "ms": 1, "us": 2, "ns": 3}


def _family(t: pa.DataType) -> str:
    for name, test in _FAMILIES.items():
        if test(t):
            return name
    return str(t)


_FAMILIES: dict[str, Callable[[pa.DataType], bool]] = {
    "null": pa.types.is_null,
    "dictionary": pa.types.is_dictionary,
    "decimal": pa.types.is_decimal,
    "timestamp": pa.types.is_timestamp,
    "time": pa.types.is_time,
    "duration": pa.types.is_duration,
    "fixed_size_binary": pa.types.is_fixed_size_binary,
    "map": pa.types.is_map,  # before list: a map is also a list in some pyarrow versions
    "list": lambda t: (pa.types.is_list(t) or pa.types.is_large_list(t)
                       or pa.types.is_list_view(t) or pa.types.is_large_list_view(t)),
    "fixed_size_list": pa.types.is_fixed_size_list,
    "struct": pa.types.is_struct,
}


def _decimal_fits(table: pa.DataType, incoming: pa.DataType) -> str | None:
    if table.scale < incoming.scale:
        return "fewer decimal places"
    if table.precision - table.scale < incoming.precision - incoming.scale:
        return "fewer integer digits"
    return None


def _int_decimal(table: pa.DataType, incoming: pa.DataType) -> str | None:
    need = INTEGER_DIGITS[_SIMPLE_KEYS[incoming]]
    if table.precision - table.scale < need:
        return f"a decimal with at least {need} integer digits is needed"
    return None


def _timestamps(table: pa.DataType, incoming: pa.DataType) -> str | None:
    if (table.tz is None) != (incoming.tz is None):
        return ("a timestamp with a time zone (an instant) and one without (a wall-clock "
                "time) are different types")
    if _UNIT_RANK[table.unit] < _UNIT_RANK[incoming.unit]:
        return "a coarser unit truncates"
    if table.unit == "ns" and incoming.unit != "ns":
        return "nanoseconds only reach the years 1677-2262"
    return None


def _date_timestamp(table: pa.DataType, incoming: pa.DataType) -> str | None:
    if table.tz is not None:
        return ("which instant a date is depends on a time zone: convert it explicitly "
                "(e.g. to_timestamp in the session time zone)")
    if table.unit == "ns":
        return "nanoseconds only reach the years 1677-2262"
    return None


def _finer_unit(table: pa.DataType, incoming: pa.DataType) -> str | None:
    if _UNIT_RANK[table.unit] < _UNIT_RANK[incoming.unit]:
        return "a coarser unit truncates"
    if pa.types.is_duration(table) and table.unit == "ns" and incoming.unit != "ns":
        return "nanoseconds only reach 292 years"
    return None


def _int_family(t: pa.DataType) -> bool:
    return pa.types.is_integer(t)


#: Parameterised widenings: (table family, incoming family) -> check returning None when
#: allowed, else the reason it is refused.
FAMILY_RULES: dict[tuple[str, str], Callable[[pa.DataType, pa.DataType], str | None]] = {
    ("decimal", "decimal"): _decimal_fits,
    ("decimal", "integer"): _int_decimal,
    ("timestamp", "timestamp"): _timestamps,
    ("timestamp", "date"): _date_timestamp,
    ("time", "time"): _finer_unit,
    ("duration", "duration"): _finer_unit,
    ("duration", "month_day_nano_interval"): lambda table, incoming: None,  # value by value
}


def _rule_family(t: pa.DataType) -> str:
    if pa.types.is_integer(t):
        return "integer"
    if pa.types.is_date(t):
        return "date"
    return _family(t)


# -- the check ----------------------------------------------------------------------------


def refusal(table_type: pa.DataType, incoming: pa.DataType, *,
            case_sensitive: bool = True) -> str | None:
    """None when every value of ``incoming`` fits ``table_type`` exactly, else why not."""
    if pa.types.is_dictionary(incoming):
        return refusal(table_type, incoming.value_type, case_sensitive=case_sensitive)
    if pa.types.is_null(incoming):
        return None
    if pa.types.is_null(table_type):
        return ("the table's column has type null (every value so far NULL): give it a type "
                "first with ALTER TABLE ... ALTER COLUMN ... TYPE")
    tk, ik = _SIMPLE_KEYS.get(table_type), _SIMPLE_KEYS.get(incoming)
    if tk is not None and ik is not None:
        if tk == ik or tk in WIDENINGS[ik]:
            return None
        return _plain_reason(tk, ik)
    tf, inf = _family(table_type), _family(incoming)
    if tf == "list" and inf in ("list", "fixed_size_list"):
        why = refusal(table_type.value_type, incoming.value_type, case_sensitive=case_sensitive)
        return None if why is None else f"list element: {why}"
    if tf == "fixed_size_list" and inf == "fixed_size_list":
        if table_type.list_size != incoming.list_size:
            return "fixed-size lists of another size"
        why = refusal(table_type.value_type, incoming.value_type, case_sensitive=case_sensitive)
        return None if why is None else f"list element: {why}"
    if tf == "map" and inf == "map":
        for part, t, i in (("key", table_type.key_type, incoming.key_type),
                           ("value", table_type.item_type, incoming.item_type)):
            why = refusal(t, i, case_sensitive=case_sensitive)
            if why is not None:
                return f"map {part}: {why}"
        return None
    if tf == "struct" and inf == "struct":
        return _struct_refusal(table_type, incoming, case_sensitive)
    if tf == "fixed_size_binary" and inf == "fixed_size_binary":
        return None if table_type.byte_width == incoming.byte_width else "another width"
    if tk == "binary" and inf == "fixed_size_binary":
        return None
    rule = FAMILY_RULES.get((_rule_family(table_type), _rule_family(incoming)))
    if rule is not None:
        return rule(table_type, incoming)
    return "no exact conversion"


def _plain_reason(tk: str, ik: str) -> str:
    if ik == "string" or ik == "binary":
        return "values would have to be parsed"
    if tk == "string" or tk == "binary":
        return "values would have to be formatted as text"
    if ik.startswith(("int", "uint")) and tk.startswith(("int", "uint")):
        return "not every value fits"
    if ik.startswith(("int", "uint")) and tk.startswith("float"):
        return "the float cannot hold every integer of that size exactly"
    if ik.startswith("float") and tk.startswith("float"):
        return "a narrower float rounds"
    return "no exact conversion"


def _struct_refusal(table_type: pa.StructType, incoming: pa.StructType,
                    case_sensitive: bool) -> str | None:
    t_names = [table_type.field(i).name for i in range(table_type.num_fields)]
    i_names = [incoming.field(i).name for i in range(incoming.num_fields)]
    match, missing, extra, ambiguous = resolve_columns(t_names, i_names,
                                                       case_sensitive=case_sensitive)
    if ambiguous:
        return "struct fields differ only in case: " + ",".join(ambiguous)
    if missing or extra:
        parts = []
        if missing:
            parts.append("missing fields " + ",".join(missing))
        if extra:
            parts.append("unexpected fields " + ",".join(extra))
        return "struct " + "; ".join(parts)
    for name, src in match.items():
        why = refusal(table_type.field(name).type, incoming.field(src).type,
                      case_sensitive=case_sensitive)
        if why is not None:
            return f"struct field {name}: {why}"
    return None


def check(table_type: pa.DataType, incoming: pa.DataType, *, column: str,
          table: str | None = None, case_sensitive: bool = True,
          incoming_name: str | None = None) -> None:
    """Raise :class:`SchemaMismatch` (column, table type, incoming type, reason) unless
    ``incoming`` widens exactly to ``table_type``."""
    why = refusal(table_type, incoming, case_sensitive=case_sensitive)
    if why is not None:
        raise SchemaMismatch(
            "column type does not fit the table's column type (only exact widenings are "
            "applied; cast the column explicitly)", table=table, column=column,
            table_type=type_name(table_type), incoming_type=incoming_name or type_name(incoming),
            reason=why)


def type_name(t: pa.DataType) -> str:
    """A short, readable name (``list<int32>``, ``timestamp[us, tz=UTC]``)."""
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        return f"list<{type_name(t.value_type)}>"
    if pa.types.is_map(t):
        return f"map<{type_name(t.key_type)}, {type_name(t.item_type)}>"
    if pa.types.is_struct(t):
        inner = ", ".join(f"{t.field(i).name}: {type_name(t.field(i).type)}"
                          for i in range(t.num_fields))
        return f"struct<{inner}>"
    return str(t)


# -- names --------------------------------------------------------------------------------


def resolve_columns(table_names: list[str], incoming_names: list[str], *,
                    case_sensitive: bool = True
                    ) -> tuple[dict[str, str], list[str], list[str], list[str]]:
    """Match incoming names to table names: ``(table name -> incoming name, missing table
    names, unexpected incoming names, ambiguous names)``. Without ``case_sensitive``, names
    equal ignoring case match, and two incoming names that differ only in case are
    ambiguous."""
    if case_sensitive:
        have = set(incoming_names)
        match = {n: n for n in table_names if n in have}
        extra = [n for n in incoming_names if n not in set(table_names)]
        return match, [n for n in table_names if n not in have], extra, []
    by_lower: dict[str, list[str]] = {}
    for n in incoming_names:
        by_lower.setdefault(n.lower(), []).append(n)
    ambiguous = sorted(n for names in by_lower.values() if len(names) > 1 for n in names)
    match, missing = {}, []
    for n in table_names:
        got = by_lower.get(n.lower())
        if got:
            match[n] = got[0]
        else:
            missing.append(n)
    wanted = {n.lower() for n in table_names}
    extra = [n for n in incoming_names if n.lower() not in wanted]
    return match, missing, extra, ambiguous


def plan_columns(table_schema: pa.Schema, incoming: pa.Schema, *, table: str | None = None,
                 case_sensitive: bool = True,
                 incoming_names: Callable[[str], str] | None = None) -> dict[str, str]:
    """The analysis step of every write: match columns by name and check every type pair.
    Returns table column -> incoming column; raises :class:`SchemaMismatch` naming what does
    not fit. ``incoming_names(col)`` may name the incoming type in the writer's own terms
    (e.g. Spark's)."""
    match, missing, extra, ambiguous = resolve_columns(
        table_schema.names, incoming.names, case_sensitive=case_sensitive)
    if ambiguous:
        raise SchemaMismatch("incoming columns differ only in case (names resolve "
                             "case-insensitively)", table=table, columns=",".join(ambiguous))
    if missing or extra:
        raise SchemaMismatch("incoming columns do not match the table's columns", table=table,
                             missing=",".join(missing) or None,
                             unexpected=",".join(extra) or None)
    for f in table_schema:
        src = match[f.name]
        src_type = incoming.field(src).type
        check(f.type, src_type, column=f.name, table=table, case_sensitive=case_sensitive,
              incoming_name=incoming_names(src) if incoming_names else None)
        if not f.nullable and pa.types.is_null(src_type):
            raise SchemaMismatch("an all-NULL column cannot fill a NOT NULL column",
                                 table=table, column=f.name)
    return match


# -- applying the plan --------------------------------------------------------------------


def conform_column(col: pa.Array | pa.ChunkedArray, field: pa.Field, *,
                   table: str | None = None, case_sensitive: bool = True):
    """``col`` as the table field's exact type (nested field names and nullability
    included). Only for pairs :func:`refusal` allows; NOT NULL violations raise
    :class:`SchemaMismatch` naming the (nested) column."""
    if pa.types.is_dictionary(col.type):
        col = col.cast(col.type.value_type)
    if pa.types.is_null(col.type):
        if len(col) and not field.nullable:
            raise SchemaMismatch("NULL in a NOT NULL column", table=table, column=field.name)
        return pa.nulls(len(col), field.type)
    _check_not_null(col, field, field.name, table)
    if col.type == field.type:
        return col
    if _has_not_null_child(field.type):
        col = _settle_null_children(col, field.type)
    return _cast(col, field.type, case_sensitive)


def _settle_null_children(col, target: pa.DataType):
    """``col`` with the values beneath a NULL struct made valid in the fields ``target``
    declares NOT NULL. Such a value means nothing (the struct is NULL), but Arrow's cast and
    the Parquet writer refuse a NULL there (Spark sends one for every NULL struct). Runs
    after :func:`_check_not_null`, so every NULL left in such a field is beneath a NULL
    parent."""
    if isinstance(col, pa.ChunkedArray):
        return pa.chunked_array([_settle_null_children(c, target) for c in col.chunks])
    t = col.type
    if pa.types.is_struct(t) and pa.types.is_struct(target):
        wanted = {target.field(i).name.lower(): target.field(i) for i in range(target.num_fields)}
        children = []
        for i in range(t.num_fields):
            child = col.field(i)
            like = wanted.get(t.field(i).name.lower())
            if like is not None:
                child = _settle_null_children(child, like.type)
                if not like.nullable and child.null_count:
                    child = pc.coalesce(child, _placeholder(child.type))
            children.append(child)
        return pa.StructArray.from_arrays(children, fields=list(t), mask=col.is_null())
    if (pa.types.is_list(t) or pa.types.is_large_list(t)) and \
            _family(target) in ("list", "fixed_size_list"):
        cls = pa.LargeListArray if pa.types.is_large_list(t) else pa.ListArray
        return cls.from_arrays(col.offsets, _settle_null_children(col.values, target.value_type),
                               type=t, mask=col.is_null() if col.null_count else None)
    return col


def _placeholder(t: pa.DataType) -> pa.Scalar:
    """Some valid value of type ``t`` (it stands beneath a NULL struct: never read)."""
    if pa.types.is_struct(t):
        return pa.scalar({t.field(i).name: _placeholder(t.field(i).type).as_py()
                          for i in range(t.num_fields)}, t)
    if pa.types.is_fixed_size_list(t):
        return pa.scalar([_placeholder(t.value_type).as_py()] * t.list_size, t)
    if _family(t) == "list" or pa.types.is_map(t):
        return pa.scalar([], t)
    for kind, zero in ((pa.int64(), 0), (pa.int32(), 0), (pa.string(), ""),
                       (pa.binary(), b""), (pa.bool_(), False)):
        try:
            return pa.array([zero], kind).cast(t)[0]
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            continue
    return pa.scalar(None, t)  # no zero for this type: the cast then names the column


_NANOS = {"s": 1_000_000_000, "ms": 1_000_000, "us": 1_000, "ns": 1}
_DAY_NANOS = 86_400 * 1_000_000_000


def _interval_duration(col, target: pa.DataType):
    """An INTERVAL column (Arrow month_day_nano_interval, as DuckDB returns it) as the
    duration ``target``: days of 86,400 s plus nanoseconds, in ``target``'s unit. A value
    with months, or one that is not a whole number of the unit, raises SchemaMismatch."""
    if isinstance(col, pa.ChunkedArray):
        return pa.chunked_array([_interval_duration(c, target) for c in col.chunks], target)
    parts = np.frombuffer(col.buffers()[1], np.dtype([("m", "<i4"), ("d", "<i4"), ("n", "<i8")]),
                          count=col.offset + len(col))[col.offset:]
    valid = ~np.asarray(col.is_null())
    months, days, nanos = parts["m"][valid], parts["d"][valid], parts["n"][valid]
    if months.any():
        raise SchemaMismatch("an INTERVAL with months has no fixed length for a duration "
                             "column", column_type=str(target))
    per = _NANOS[target.unit]
    if (nanos % per).any():
        raise SchemaMismatch("an INTERVAL is not a whole number of the duration column's unit",
                             column_type=str(target))
    day_units = _DAY_NANOS // per
    # in int64 while no value can overflow it, else exactly in Python integers
    if len(days) and int(np.abs(days.astype(np.int64)).max()) * day_units \
            + int(np.abs(nanos // per).max()) >= 2**63:
        raise SchemaMismatch("value out of the column type's range", column_type=str(target))
    values = np.zeros(len(col), np.int64)
    values[valid] = days.astype(np.int64) * day_units + nanos // per
    return pa.array(values, pa.int64(), mask=~valid).cast(target)


def cast_table(t: pa.Table, schema: pa.Schema) -> pa.Table:
    """``t.cast(schema)``, with a column DuckDB returned as INTERVAL made the table's
    duration (:func:`_interval_duration`): what rows read by DuckDB become to be written."""
    if t.schema == schema:
        return t
    interval = pa.month_day_nano_interval()
    columns = [_interval_duration(c, f.type)
               if c.type == interval and pa.types.is_duration(f.type) else c
               for c, f in zip(t.columns, schema)]
    return pa.Table.from_arrays(columns, names=t.column_names).cast(schema)


def map_leaves(t: pa.DataType, leaf) -> pa.DataType:
    """``t`` with ``leaf(x)`` for each type ``x`` in it (the type itself, or each one a
    struct, map or list holds, at any depth) that ``leaf`` replaces (returns another type
    for); a fixed-size list becomes a list of the same size, field names and nullability
    stay."""
    out = leaf(t)
    if out is not t and out != t:
        return out
    if pa.types.is_struct(t):
        return pa.struct([t.field(i).with_type(map_leaves(t.field(i).type, leaf))
                          for i in range(t.num_fields)])
    if pa.types.is_map(t):
        return pa.map_(t.key_field.with_type(map_leaves(t.key_type, leaf)),
                       t.item_field.with_type(map_leaves(t.item_type, leaf)), t.keys_sorted)
    if pa.types.is_large_list(t):
        return pa.large_list(t.value_field.with_type(map_leaves(t.value_type, leaf)))
    if pa.types.is_fixed_size_list(t):
        return pa.list_(t.value_field.with_type(map_leaves(t.value_type, leaf)), t.list_size)
    if pa.types.is_list(t):
        return pa.list_(t.value_field.with_type(map_leaves(t.value_type, leaf)))
    return t


@functools.lru_cache(maxsize=256)
def _fixed_as_binary(t: pa.DataType) -> pa.DataType:
    """``t`` with each ``fixed_size_binary[n]`` (nested ones too) as ``binary``: the type
    DuckDB's values of such a column come back as (its BLOB has no width). Kept per type:
    every SQL write asks it of each column."""
    return map_leaves(t, lambda x: pa.binary() if pa.types.is_fixed_size_binary(x)
                      and not pa.types.is_decimal(x) else x)


def has_fixed_binary(schema: pa.Schema) -> bool:
    """Whether a column of ``schema`` holds a ``fixed_size_binary`` at any depth (its SQL
    writes go through :func:`fit_sql_rows`)."""
    return any(_fixed_as_binary(f.type) != f.type for f in schema)


def fit_sql_rows(data, schema: pa.Schema, *, table: str | None = None):
    """Rows DuckDB computed for a SQL write (INSERT, UPDATE, MERGE; a pa.Table or
    RecordBatch with the table's column names) with each value of a
    ``fixed_size_binary[n]`` column made that type: DuckDB hands BLOBs, and one of another
    length is SchemaMismatch naming the column (a value check, as DuckDB's own casts are;
    Arrow writers keep the type rules above). Other columns are left to the rules."""
    cols = list(data.columns)
    changed = False
    for i, name in enumerate(data.schema.names):
        if name not in schema.names:
            continue
        target = schema.field(name).type
        loose = _fixed_as_binary(target)
        if loose == target or refusal(target, cols[i].type) is None:
            continue  # no fixed size, or the rules take the column as it is
        if refusal(loose, cols[i].type) is not None:
            continue  # the rules refuse it anyway, naming the column
        try:
            cols[i] = cols[i].cast(loose).cast(target)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            raise SchemaMismatch("a BLOB value's length differs from the column's fixed "
                                 "size", table=table, column=name,
                                 column_type=type_name(target)) from None
        changed = True
    if not changed:
        return data
    fields = [data.schema.field(i).with_type(c.type) for i, c in enumerate(cols)]
    build = pa.Table.from_arrays if isinstance(data, pa.Table) else pa.RecordBatch.from_arrays
    return build(cols, schema=pa.schema(fields))


def _cast(col, target: pa.DataType, case_sensitive: bool):
    """Exact cast of an allowed pair (structs match their fields by name: pyarrow's cast)."""
    if pa.types.is_duration(target) and col.type == pa.month_day_nano_interval():
        return _interval_duration(col, target)
    if not case_sensitive:
        renamed = _renamed_like(col.type, target)
        if renamed != col.type:
            col = col.view(renamed)  # same layout, the table's spelling of field names
    try:
        return col.cast(target, safe=True)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
        raise SchemaMismatch("value out of the column type's range", column_type=str(target),
                             error=str(exc).splitlines()[0]) from None


def _renamed_like(t: pa.DataType, target: pa.DataType) -> pa.DataType:
    """``t`` with its struct field names spelled as in ``target`` where they differ only in
    case (at any depth)."""
    if pa.types.is_struct(t) and pa.types.is_struct(target):
        spelled = {target.field(i).name.lower(): target.field(i) for i in range(target.num_fields)}
        fields = []
        for i in range(t.num_fields):
            f = t.field(i)
            like = spelled.get(f.name.lower())
            if like is None:
                fields.append(f)
            else:
                fields.append(pa.field(like.name, _renamed_like(f.type, like.type), f.nullable,
                                       metadata=f.metadata))
        return pa.struct(fields)
    if pa.types.is_map(t) and pa.types.is_map(target):
        return pa.map_(pa.field(t.key_field.name, _renamed_like(t.key_type, target.key_type),
                                False),
                       pa.field(t.item_field.name, _renamed_like(t.item_type, target.item_type),
                                t.item_field.nullable), t.keys_sorted)
    if _family(t) == "list" and _family(target) in ("list", "fixed_size_list"):
        inner = pa.field(t.value_field.name, _renamed_like(t.value_type, target.value_type),
                         t.value_field.nullable)
        return pa.large_list(inner) if pa.types.is_large_list(t) else pa.list_(inner)
    if pa.types.is_fixed_size_list(t) and _family(target) in ("list", "fixed_size_list"):
        inner = pa.field(t.value_field.name, _renamed_like(t.value_type, target.value_type),
                         t.value_field.nullable)
        return pa.list_(inner, t.list_size)
    return t


def _check_not_null(col, field: pa.Field, path: str, table: str | None) -> None:
    """Raise unless every NOT NULL field of ``field`` (at any depth) holds no NULL among the
    values that exist (children of NULL parents do not count)."""
    if isinstance(col, pa.ChunkedArray):
        for c in col.chunks:
            _check_not_null(c, field, path, table)
        return
    if not field.nullable and col.null_count:
        raise SchemaMismatch("NULL in a NOT NULL column", table=table, column=path)
    t = field.type
    if not _has_not_null_child(t):
        return
    if pa.types.is_struct(t) and pa.types.is_struct(col.type):
        valid = col.is_valid() if col.null_count else None
        names = {col.type.field(i).name.lower(): i for i in range(col.type.num_fields)}
        for i in range(t.num_fields):
            child_field = t.field(i)
            j = names.get(child_field.name.lower())
            if j is None:
                continue
            child = col.field(j)
            if valid is not None:
                if not child_field.nullable and \
                        pc.any(pc.and_(valid, child.is_null())).as_py():
                    raise SchemaMismatch("NULL in a NOT NULL field", table=table,
                                         column=f"{path}.{child_field.name}")
                # beneath a NULL struct nothing counts, at any depth
                child = child.filter(valid)
            _check_not_null(child, child_field, f"{path}.{child_field.name}", table)
    elif pa.types.is_map(t) and pa.types.is_map(col.type):
        ct = col.type  # a map is laid out as a list of (key, value) structs
        as_list = col.view(pa.list_(pa.field("entries", pa.struct([ct.key_field, ct.item_field]),
                                             False)))
        entries = as_list.flatten()  # slicing and NULL maps respected
        _check_not_null(entries.field(1), t.item_field, f"{path}.value", table)
    elif _family(t) in ("list", "fixed_size_list") and \
            _family(col.type) in ("list", "fixed_size_list"):
        _check_not_null(col.flatten(), t.value_field, f"{path}.element", table)


def _has_not_null_child(t: pa.DataType) -> bool:
    if pa.types.is_struct(t):
        return any(not t.field(i).nullable or _has_not_null_child(t.field(i).type)
                   for i in range(t.num_fields))
    if pa.types.is_map(t):
        return not t.item_field.nullable or _has_not_null_child(t.item_type)
    if _family(t) in ("list", "fixed_size_list"):
        return not t.value_field.nullable or _has_not_null_child(t.value_type)
    return False


def conform_batch(batch: pa.RecordBatch, schema: pa.Schema, match: dict[str, str], *,
                  table: str | None = None, case_sensitive: bool = True) -> pa.RecordBatch:
    """One batch as the table schema (``match`` from :func:`plan_columns`)."""
    cols = []
    for f in schema:
        try:
            cols.append(conform_column(batch.column(match[f.name]), f, table=table,
                                       case_sensitive=case_sensitive))
        except SchemaMismatch as e:
            if "column" in e.context:
                raise
            raise SchemaMismatch(e.message, table=table, column=f.name, **e.context) from None
    return pa.RecordBatch.from_arrays(cols, schema=schema)


# -- relaxing nested nullability ----------------------------------------------------------


def nullable_nested(t: pa.DataType) -> pa.DataType:
    """``t`` with every nested field nullable (list elements, struct fields, map values; map
    keys stay NOT NULL, as Arrow requires): what a table created by a first write stores, so
    the first batch never freezes a stricter nullability than the writer's schema allows."""
    if pa.types.is_struct(t):
        return pa.struct([pa.field(t.field(i).name, nullable_nested(t.field(i).type), True,
                                   metadata=t.field(i).metadata) for i in range(t.num_fields)])
    if pa.types.is_map(t):
        return pa.map_(pa.field("key", nullable_nested(t.key_type), False),
                       pa.field(t.item_field.name, nullable_nested(t.item_type), True),
                       t.keys_sorted)
    if pa.types.is_large_list(t):
        return pa.large_list(pa.field(t.value_field.name, nullable_nested(t.value_type), True))
    if pa.types.is_fixed_size_list(t):
        return pa.list_(pa.field(t.value_field.name, nullable_nested(t.value_type), True),
                        t.list_size)
    if pa.types.is_list(t):
        return pa.list_(pa.field(t.value_field.name, nullable_nested(t.value_type), True))
    return t


# -- documentation ------------------------------------------------------------------------

#: The parameterised rules in words, for docs/TYPES.md (kept next to FAMILY_RULES).
FAMILY_RULES_TEXT: tuple[tuple[str, str, str], ...] = (
    ("decimal(p1,s1)", "decimal(p2,s2)", "s2 >= s1 and p2 - s2 >= p1 - s1"),
    ("integer", "decimal(p,s)", ("p - s >= 3 (8-bit), 5 (16-bit), 10 (32-bit), 19 (int64), "
                                 "20 (uint64)")),
    ("timestamp[u1, tz]", "timestamp[u2, tz']",
     ("both with a time zone or both without; u2 as fine as u1 or finer; ns only from ns "
      "(the zone may differ: the instant is kept)")),
    ("date32, date64", "timestamp[u] without time zone", "u is s, ms or us (midnight)"),
    ("time[u1]", "time[u2]", "u2 as fine as u1 or finer"),
    ("duration[u1]", "duration[u2]", "u2 as fine as u1 or finer; ns only from ns"),
    ("month_day_nano_interval (DuckDB's INTERVAL)", "duration[u]",
     ("each value without months (a month has no fixed length) and a whole number of u "
      "(a day is 86,400 s)")),
    ("list<a>, large_list<a>, fixed_size_list<a>", "list<b>, large_list<b>", "a fills b"),
    ("struct<...>", "struct<...>", ("the same field names (matched by name), each filling "
                                    "its counterpart")),
    ("map<k1, v1>", "map<k2, v2>", "k1 fills k2 and v1 fills v2"),
    ("dictionary<a>", "b", "a fills b"),
    ("null (all NULL)", "any nullable column", ""),
    ("fixed_size_binary[n]", "binary, fixed_size_binary[n]", ""),
)


def markdown_table() -> str:
    """The rules as the Markdown tables docs/TYPES.md shows."""
    lines = ["| incoming | may fill (besides the same type) |", "|---|---|"]
    same = {}
    for t, k in SAME_VALUES.items():
        same.setdefault(k, []).append(str(t))
    for k, targets in WIDENINGS.items():
        extra = sorted(targets, key=list(WIDENINGS).index)
        name = " / ".join(same[k]) if k in same else k
        lines.append(f"| {name} | {', '.join(extra) if extra else '-'} |")
    lines += ["", "| incoming | table type | when |", "|---|---|---|"]
    for a, b, when in FAMILY_RULES_TEXT:
        lines.append(f"| {a} | {b} | {when or 'always'} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":  # pragma: no cover - prints the docs table
    print(markdown_table(), end="")
