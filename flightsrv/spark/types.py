"""Spark ↔ Arrow type maps, as tables (STYLE: type mappings as dictionaries).

- ``SPARK_TO_ARROW`` / ``SPARK_NESTED_TO_ARROW``: the Arrow type a table created from a Spark
  DataFrame stores for each Spark type. Timestamps with time zone are stored as
  ``timestamp[us, tz=UTC]`` (one instant, whatever the session zone); ``TIMESTAMP_NTZ`` as
  ``timestamp[us]``.
- ``ARROW_TO_SPARK`` / ``ARROW_NESTED_TO_SPARK``: the Spark type a table column reads as. A few
  Arrow types widen (unsigned ints, float16, large strings, nanosecond timestamps are cast on
  read); types Spark cannot represent raise ``ConfigurationError`` naming the column.

Extend a map by adding an entry, not an if-branch.
"""

from __future__ import annotations

from collections.abc import Callable

import pyarrow as pa
from pyspark.sql import types as T

from flightsrv.errors import ConfigurationError
from flightsrv.table.types import nullable_nested

SPARK_TO_ARROW: dict[type, pa.DataType] = {
    T.BooleanType: pa.bool_(),
    T.ByteType: pa.int8(),
    T.ShortType: pa.int16(),
    T.IntegerType: pa.int32(),
    T.LongType: pa.int64(),
    T.FloatType: pa.float32(),
    T.DoubleType: pa.float64(),
    T.StringType: pa.string(),
    T.BinaryType: pa.binary(),
    T.DateType: pa.date32(),
    T.TimestampType: pa.timestamp("us", tz="UTC"),
    T.TimestampNTZType: pa.timestamp("us"),
    T.NullType: pa.null(),
}


def _field_to_arrow(f: T.StructField) -> pa.Field:
    return pa.field(f.name, spark_to_arrow(f.dataType), True)


SPARK_NESTED_TO_ARROW: dict[type, Callable[[T.DataType], pa.DataType]] = {
    T.DecimalType: lambda t: pa.decimal128(t.precision, t.scale),
    T.ArrayType: lambda t: pa.list_(pa.field("element", spark_to_arrow(t.elementType),
                                             t.containsNull)),
    T.MapType: lambda t: pa.map_(spark_to_arrow(t.keyType),
                                 pa.field("value", spark_to_arrow(t.valueType),
                                          t.valueContainsNull)),
    T.StructType: lambda t: pa.struct([_field_to_arrow(f) for f in t.fields]),
}


def spark_to_arrow(t: T.DataType, *, column: str = "?") -> pa.DataType:
    simple = SPARK_TO_ARROW.get(type(t))
    if simple is not None:
        return simple
    nested = SPARK_NESTED_TO_ARROW.get(type(t))
    if nested is not None:
        return nested(t)
    raise ConfigurationError("Spark type has no flightsrv column type", column=column,
                             type=t.simpleString())


def spark_schema_to_arrow(schema: T.StructType) -> pa.Schema:
    """The Arrow schema of a table created from a DataFrame: every column and every nested
    field nullable (Spark's ``containsNull=false`` of ``array(1, 2)`` describes one
    DataFrame, not what later appends may hold; map keys stay NOT NULL, as in Arrow)."""
    return pa.schema([pa.field(f.name, nullable_nested(spark_to_arrow(f.dataType,
                                                                      column=f.name)), True)
                      for f in schema.fields])


ARROW_TO_SPARK: dict[pa.DataType, T.DataType] = {
    pa.bool_(): T.BooleanType(),
    pa.int8(): T.ByteType(), pa.int16(): T.ShortType(), pa.int32(): T.IntegerType(),
    pa.int64(): T.LongType(),
    pa.uint8(): T.ShortType(), pa.uint16(): T.IntegerType(), pa.uint32(): T.LongType(),
    pa.uint64(): T.DecimalType(20, 0),
    pa.float16(): T.FloatType(), pa.float32(): T.FloatType(), pa.float64(): T.DoubleType(),
    pa.string(): T.StringType(), pa.large_string(): T.StringType(),
    pa.string_view(): T.StringType(),
    pa.binary(): T.BinaryType(), pa.large_binary(): T.BinaryType(),
    pa.date32(): T.DateType(), pa.date64(): T.DateType(),
    pa.null(): T.NullType(),
}

# keyed by the ``pa.types.is_*`` predicate that recognises the type
ARROW_NESTED_TO_SPARK: dict[Callable[[pa.DataType], bool], Callable[[pa.DataType], T.DataType]] = {
    pa.types.is_timestamp: lambda t: T.TimestampType() if t.tz else T.TimestampNTZType(),
    pa.types.is_decimal: lambda t: T.DecimalType(t.precision, t.scale),
    pa.types.is_fixed_size_binary: lambda t: T.BinaryType(),
    pa.types.is_map: lambda t: T.MapType(arrow_to_spark(t.key_type),
                                         arrow_to_spark(t.item_type), True),
    pa.types.is_list: lambda t: T.ArrayType(arrow_to_spark(t.value_type), True),
    pa.types.is_large_list: lambda t: T.ArrayType(arrow_to_spark(t.value_type), True),
    pa.types.is_fixed_size_list: lambda t: T.ArrayType(arrow_to_spark(t.value_type), True),
    pa.types.is_struct: lambda t: T.StructType([
        T.StructField(t.field(i).name, arrow_to_spark(t.field(i).type), True)
        for i in range(t.num_fields)]),
    pa.types.is_dictionary: lambda t: arrow_to_spark(t.value_type),
}


def arrow_to_spark(t: pa.DataType, *, column: str = "?") -> T.DataType:
    simple = ARROW_TO_SPARK.get(t)
    if simple is not None:
        return simple
    for recognise, build in ARROW_NESTED_TO_SPARK.items():
        if recognise(t):
            return build(t)
    raise ConfigurationError("column type cannot be read by Spark", column=column, type=str(t))


def arrow_schema_to_spark(schema: pa.Schema) -> T.StructType:
    """The read schema of a table: every field nullable (Spark's Python sources require it)."""
    return T.StructType([T.StructField(f.name, arrow_to_spark(f.type, column=f.name), True)
                         for f in schema])


def spark_arrow_schema(schema: T.StructType) -> pa.Schema:
    """The exact Arrow schema Spark expects from a Python data source reading ``schema``."""
    from pyspark.sql.pandas.types import to_arrow_schema

    return to_arrow_schema(schema, timezone="UTC")
