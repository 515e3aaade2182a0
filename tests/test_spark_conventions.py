"""Spark's conventions on flightsrv tables (issue 18): exact types, nested nullability, save
modes, time-travel options, case-insensitive names, DataFrames pinned at load, failed creates.

Runs on the one shared local[2] session (the ``spark`` fixture of conftest.py).
"""

from __future__ import annotations

import datetime as dt
import math

import pyarrow as pa
import pytest

pytest.importorskip("pyspark")

import flightsrv.spark as fs
from flightsrv.errors import ConfigurationError, SchemaMismatch, TableExists
from flightsrv.spark.datasource import FlightsrvDataSource
from flightsrv.spark.types import spark_schema_to_arrow
from flightsrv.table import types as rules
from flightsrv.warehouse import Warehouse

pytestmark = pytest.mark.spark

# -- the type matrix ----------------------------------------------------------------------

#: Spark type -> SQL literals of extreme and ordinary values (NULL is added to every column)
SPARK_VALUES: dict[str, list[str]] = {
    "BOOLEAN": ["TRUE", "FALSE"],
    "TINYINT": ["-128Y", "127Y", "0Y"],
    "SMALLINT": ["-32768S", "32767S", "1S"],
    "INT": ["-2147483648", "2147483647", "12"],
    "BIGINT": ["-9223372036854775808L", "9223372036854775807L", "12L"],
    "FLOAT": ["CAST('NaN' AS FLOAT)", "CAST('Infinity' AS FLOAT)", "CAST(-0.0 AS FLOAT)",
              "CAST(3.4028235E38 AS FLOAT)", "CAST(1.4E-45 AS FLOAT)"],
    "DOUBLE": ["CAST('NaN' AS DOUBLE)", "CAST('-Infinity' AS DOUBLE)", "CAST(-0.0 AS DOUBLE)",
               "1.7976931348623157E308D", "4.9E-324D"],
    "DECIMAL(10,2)": ["CAST('99999999.99' AS DECIMAL(10,2))",
                      "CAST('-0.01' AS DECIMAL(10,2))", "CAST('12' AS DECIMAL(10,2))"],
    "DECIMAL(38,10)": ["CAST('9999999999999999999999999999.9999999999' AS DECIMAL(38,10))",
                       "CAST('-0.0000000001' AS DECIMAL(38,10))",
                       "CAST('12' AS DECIMAL(38,10))"],
    "STRING": ["''", "'12'", "'héllo'"],
    "BINARY": ["X''", "X'00FF'", "X'3132'"],
    "DATE": ["DATE'0001-01-01'", "DATE'9999-12-31'", "DATE'2024-02-29'"],
    "TIMESTAMP": ["TIMESTAMP'0001-01-01 00:00:00'", "TIMESTAMP'9999-12-31 23:59:59.999999'",
                  "TIMESTAMP'2024-02-29 12:00:00.000001'"],
    "TIMESTAMP_NTZ": ["TIMESTAMP_NTZ'0001-01-01 00:00:00'",
                      "TIMESTAMP_NTZ'9999-12-31 23:59:59.999999'",
                      "TIMESTAMP_NTZ'2024-02-29 00:00:00'"],
    "ARRAY<INT>": ["array(2147483647, NULL)", "CAST(array() AS ARRAY<INT>)", "array(12)"],
    "ARRAY<BIGINT>": ["array(9223372036854775807L, NULL)", "CAST(array() AS ARRAY<BIGINT>)",
                      "array(12L)"],
    "STRUCT<a: INT, b: STRING>": ["named_struct('a', 2147483647, 'b', 'x')",
                                  ("named_struct('a', CAST(NULL AS INT), 'b', CAST(NULL AS "
                                  "STRING))"), "named_struct('a', 12, 'b', '')"],
    "STRUCT<a: BIGINT, b: STRING>": ["named_struct('a', 9223372036854775807L, 'b', 'x')",
                                     "named_struct('a', CAST(NULL AS BIGINT), 'b', 'y')",
                                     "named_struct('a', 12L, 'b', '')"],
    "MAP<STRING, INT>": ["map('k', 2147483647)", "map('n', CAST(NULL AS INT))",
                         "CAST(map() AS MAP<STRING, INT>)"],
    "MAP<STRING, BIGINT>": ["map('k', 9223372036854775807L)", "map('n', CAST(NULL AS BIGINT))",
                            "CAST(map() AS MAP<STRING, BIGINT>)"],
}
TYPES = list(SPARK_VALUES)

#: (table type, incoming type) pairs that are exact widenings, written out independently of
#: flightsrv.table.types (the identity pairs are allowed too)
EXPECTED_WIDENINGS = {
    ("SMALLINT", "TINYINT"),
    ("INT", "TINYINT"), ("INT", "SMALLINT"),
    ("BIGINT", "TINYINT"), ("BIGINT", "SMALLINT"), ("BIGINT", "INT"),
    ("FLOAT", "TINYINT"), ("FLOAT", "SMALLINT"),
    ("DOUBLE", "TINYINT"), ("DOUBLE", "SMALLINT"), ("DOUBLE", "INT"), ("DOUBLE", "FLOAT"),
    ("DECIMAL(10,2)", "TINYINT"), ("DECIMAL(10,2)", "SMALLINT"),
    ("DECIMAL(38,10)", "TINYINT"), ("DECIMAL(38,10)", "SMALLINT"), ("DECIMAL(38,10)", "INT"),
    ("DECIMAL(38,10)", "BIGINT"), ("DECIMAL(38,10)", "DECIMAL(10,2)"),
    ("TIMESTAMP_NTZ", "DATE"),
    ("ARRAY<BIGINT>", "ARRAY<INT>"),
    ("STRUCT<a: BIGINT, b: STRING>", "STRUCT<a: INT, b: STRING>"),
    ("MAP<STRING, BIGINT>", "MAP<STRING, INT>"),
}


def _source(spark, columns: dict[str, str]):
    """A DataFrame with an ``id`` and, per column, the values of its Spark type (+ NULL)."""
    n = 1 + max(len(SPARK_VALUES[t]) for t in columns.values())
    rows = []
    for i in range(n):
        cells = [str(i)]
        for t in columns.values():
            vals = SPARK_VALUES[t]
            cells.append(vals[i] if i < len(vals) else f"CAST(NULL AS {t})")
        rows.append("(" + ", ".join(cells) + ")")
    names = ", ".join(["id"] + list(columns))
    casts = ", ".join(["CAST(id AS BIGINT) AS id"]
                      + [f"CAST(`{c}` AS {t}) AS `{c}`" for c, t in columns.items()])
    return spark.sql(f"SELECT {casts} FROM VALUES {', '.join(rows)} AS v({names})")


def _same(a, b) -> bool:
    """Value equality that tells NaN, -0.0 and a date from a timestamp at midnight."""
    if a is None or b is None:
        return a is None and b is None
    if isinstance(a, float) and isinstance(b, float):
        return (math.isnan(a) and math.isnan(b)) or (a == b and math.copysign(1, a) ==
                                                      math.copysign(1, b))
    if isinstance(a, dt.date) and not isinstance(a, dt.datetime) and isinstance(b, dt.datetime):
        return b == dt.datetime.combine(a, dt.time())
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b and type(a) is type(b) or (isinstance(a, (int, float)) and a == b)


def test_type_matrix(spark, local_uri):
    """Every (table type, incoming type) pair among Spark's types is either an exact
    widening (the job succeeds and every value, extremes included, reads back unchanged) or
    refused at analysis with column, table type and incoming type, before any task runs."""
    from pyspark.sql.types import _parse_datatype_string

    wh = Warehouse.open(local_uri)
    spark_schema = {t: _parse_datatype_string(f"c {t}") for t in TYPES}
    arrow = {t: spark_schema_to_arrow(spark_schema[t]).field("c").type for t in TYPES}
    allowed, refused = [], []
    for tt in TYPES:
        for it in TYPES:
            ok = rules.refusal(arrow[tt], arrow[it]) is None
            (allowed if ok else refused).append((tt, it))
    assert set(allowed) == EXPECTED_WIDENINGS | {(t, t) for t in TYPES}

    # refused: the planning step (the code Spark runs on its planning worker) says why
    for i, tt in enumerate(TYPES):
        wh.create_table(f"m{i}", pa.schema([("c", arrow[tt])]))
    for tt, it in refused:
        ds = FlightsrvDataSource({"path": f"{local_uri}/m{TYPES.index(tt)}"})
        with pytest.raises(SchemaMismatch) as e:
            ds.writer(spark_schema[it], False)
        msg = str(e.value)
        assert "column=c" in msg and f"table_type={rules.type_name(arrow[tt])}" in msg, msg
        assert f"incoming_type={spark_schema[it]['c'].dataType.simpleString()}" in msg, msg

    # allowed: one Spark job fills one column per pair; nothing fails, nothing changes
    cols = {f"t{TYPES.index(tt)}_i{TYPES.index(it)}": (tt, it) for tt, it in allowed}
    wh.create_table("wide", pa.schema([("id", pa.int64())]
                                      + [(c, arrow[tt]) for c, (tt, _) in cols.items()]))
    src = _source(spark, {c: it for c, (_, it) in cols.items()})
    src.write.format("flightsrv").mode("append").save(f"{local_uri}/wide")
    back = spark.read.format("flightsrv").load(f"{local_uri}/wide").toArrow().sort_by("id")
    want = src.toArrow().sort_by("id")
    assert back.num_rows == want.num_rows
    for c, (tt, it) in cols.items():
        got, exp = back.column(c).to_pylist(), want.column(c).to_pylist()
        assert all(_same(e, g) for e, g in zip(exp, got)), (tt, it, exp, got)


def test_lossy_appends_are_refused_at_analysis(spark, local_uri):
    uri = f"{local_uri}/lossy"
    spark.sql("SELECT 1L AS id, 5 AS n, DATE'2024-01-01' AS d").write.format("flightsrv") \
        .mode("append").save(uri)
    table = Warehouse.open(local_uri).table("lossy")
    files = sorted(m.key for m in table.store.list("data/"))
    cases = [("SELECT 2L AS id, '12' AS n, DATE'2024-01-02' AS d", "n", "int32", "string"),
             ("SELECT 2L AS id, 6 AS n, TIMESTAMP'2024-01-02 10:00:00' AS d", "d", "date32",
              "timestamp"),
             ("SELECT 2L AS id, 6L AS n, DATE'2024-01-02' AS d", "n", "int32", "bigint"),
             ("SELECT 2.5D AS id, 6 AS n, DATE'2024-01-02' AS d", "id", "int64", "double")]
    for sql, col, table_type, incoming in cases:
        with pytest.raises(Exception) as e:
            spark.sql(sql).write.format("flightsrv").mode("append").save(uri)
        msg = str(e.value)
        assert "SchemaMismatch" in msg and f"column={col}" in msg, msg
        assert f"table_type={table_type}" in msg and f"incoming_type={incoming}" in msg, msg
    assert table.head().version == 0 and table.count_rows() == 1
    assert sorted(m.key for m in table.store.list("data/")) == files


def test_nested_nullability_follows_the_table_schema(spark, local_uri):
    uri = f"{local_uri}/nested"
    spark.sql("SELECT 1L AS id, array(1, 2) AS a, map('k', 1) AS m, "
              "named_struct('x', 1) AS s").write.format("flightsrv").mode("append").save(uri)
    schema = Warehouse.open(local_uri).table("nested").schema
    assert schema.field("a").type.value_field.nullable  # Spark said containsNull=false
    assert schema.field("m").type.item_field.nullable
    assert schema.field("s").type.field("x").nullable
    spark.sql("SELECT 2L AS id, array(1, NULL) AS a, map('k', CAST(NULL AS INT)) AS m, "
              "named_struct('x', CAST(NULL AS INT)) AS s") \
        .write.format("flightsrv").mode("append").save(uri)
    got = {r.id: r for r in spark.read.format("flightsrv").load(uri).collect()}
    assert got[2].a == [1, None] and got[2].m == {"k": None} and got[2].s.x is None
    # a table whose schema says NOT NULL keeps saying it, with an error naming the field
    strict = Warehouse.open(local_uri).create_table("strict", pa.schema([
        ("id", pa.int64()), ("a", pa.list_(pa.field("element", pa.int32(), False)))]))
    with pytest.raises(Exception) as e:
        spark.sql("SELECT 3L AS id, array(1, NULL) AS a").write.format("flightsrv") \
            .mode("append").save(f"{local_uri}/strict")
    assert "NULL in a NOT NULL column" in str(e.value) and "column=a.element" in str(e.value)
    assert "ArrowInvalid" not in str(e.value)
    assert strict.head().version == 0 and list(strict.store.list("data/")) == []
    spark.sql("SELECT 3L AS id, array(1, 2) AS a").write.format("flightsrv") \
        .mode("append").save(f"{local_uri}/strict")
    assert strict.to_table().column("a").to_pylist() == [[1, 2]]


def test_time_travel_options(spark, local_uri):
    uri = f"{local_uri}/tt"
    spark.range(3).write.format("flightsrv").mode("append").save(uri)
    table = Warehouse.open(local_uri).table("tt")
    v0 = table.head()
    spark.range(3, 5).write.format("flightsrv").mode("append").save(uri)

    def count(**opts):
        r = spark.read.format("flightsrv")
        for k, v in opts.items():
            r = r.option(k, v)
        return r.load(uri).count()

    at = dt.datetime.fromtimestamp(v0.created_at_ms / 1000, tz=dt.UTC)
    assert count() == 5
    assert count(timestampAsOf=str(v0.created_at_ms)) == 3  # epoch ms as Spark passes it
    assert count(timestampAsOf=v0.created_at_ms) == 3
    assert count(timestampAsOf=at.isoformat()) == 3
    assert count(timestampAsOf=at.strftime("%Y-%m-%dT%H:%M:%S.%fZ")) == 3
    assert count(timestampAsOf=at.astimezone(dt.timezone(dt.timedelta(hours=-5)))
                 .isoformat()) == 3
    assert count(versionAsOf=0) == 3 and count(versionAsOf="1") == 5
    assert count(version=0, versionAsOf=0) == 3
    for opts, needle in [({"versionAsOf": "abc"}, "versionAsOf must be a version number"),
                         ({"versionAsOf": "-1"}, "versionAsOf must be a version number"),
                         ({"versionAsOf": 0, "version": 1}, "disagree"),
                         ({"versionAsOf": 0, "timestampAsOf": str(v0.created_at_ms)},
                          "not both"),
                         ({"versionAsOf": 7}, "VersionNotFound"),
                         ({"timestampAsOf": "2000-01-01"}, "no retained version"),
                         ({"timestampAsOf": "yesterday"}, "does not parse"),
                         ({"rowGroupsPerPartition": "0"}, "rowGroupsPerPartition must be"),
                         ({"rowGroupsPerPartition": "two"}, "rowGroupsPerPartition must be")]:
        with pytest.raises(Exception, match=needle):
            count(**opts)
    assert count(rowGroupsPerPartition="1") == 5


def test_save_modes(spark, local_uri):
    uri = f"{local_uri}/modes"
    wh = Warehouse.open(local_uri)
    spark.range(3).write.format("flightsrv").save(uri)  # no mode: errorifexists creates
    assert wh.table("modes").count_rows() == 3
    for mode in (None, "error", "errorifexists", "default"):
        w = spark.range(3).write.format("flightsrv")
        with pytest.raises(TableExists, match="table=modes"):
            (w.mode(mode) if mode else w).save(uri)
    spark.range(10).write.format("flightsrv").mode("ignore").save(uri)  # exists: no-op
    assert wh.table("modes").head().version == 0
    spark.range(2).write.format("flightsrv").mode("ignore").save(f"{local_uri}/fresh")
    assert wh.table("fresh").count_rows() == 2
    with pytest.raises(Exception, match="TableExists"):  # path as an option: the source decides
        spark.range(3).write.format("flightsrv").option("path", uri).save()
    spark.range(10).write.format("flightsrv").option("path", uri).mode("ignore").save()
    assert wh.table("modes").head().version == 0
    # rows of another shape are ignored alike (they were checked against the table's
    # columns first: SchemaMismatch, found in session 28)
    spark.range(1).selectExpr("'x' AS other").write.format("flightsrv") \
        .option("path", uri).mode("ignore").save()
    assert wh.table("modes").head().version == 0
    # partitionBy: the table's own partitioning decides; refused clearly, nothing written
    # (Spark's check said "do not match the existing table's ... table: ": session 29)
    for write in (lambda: spark.range(3).write.format("flightsrv").partitionBy("id")
                  .mode("append").save(uri),
                  lambda: spark.range(3).write.format("flightsrv").save(
                      f"{local_uri}/parted", partitionBy="id")):
        with pytest.raises(ConfigurationError, match="partitionBy is not supported"):
            write()
    assert wh.table("modes").head().version == 0 and not wh.exists("parted")
    spark.range(3).selectExpr("id", "id % 2 AS p").write.format("parquet") \
        .partitionBy("p").mode("overwrite") \
        .save(f"{local_uri}-plain-parquet")  # other formats: as ever
    spark.range(3, 5).write.format("flightsrv").mode("append").save(uri)
    spark.range(7).write.save(uri, format="flightsrv", mode="overwrite")
    assert wh.table("modes").count_rows() == 7
    assert [h["operation"] for h in wh.table("modes").history()] == [
        "spark_overwrite", "spark_append", "create"]

    # the table appears while the job runs: errorifexists fails, ignore succeeds; neither
    # commits its rows nor leaves its files
    def creator(name):
        def run(batches):
            for b in batches:
                other = Warehouse.open(local_uri)
                if not other.exists(name):
                    other.create_table(name, pa.schema([("id", pa.int64())]))
                yield b
        return run

    df = spark.range(5, numPartitions=1)
    with pytest.raises(Exception, match="created by another writer"):
        df.mapInArrow(creator("race1"), df.schema).write.format("flightsrv").save(
            f"{local_uri}/race1")
    df.mapInArrow(creator("race2"), df.schema).write.format("flightsrv").mode("ignore") \
        .save(f"{local_uri}/race2")
    for name in ("race1", "race2"):
        t = wh.table(name)
        assert t.count_rows() == 0 and list(t.store.list("data/")) == []


def test_names_resolve_case_insensitively(spark, local_uri):
    uri = f"{local_uri}/names"
    spark.sql("SELECT 1L AS id, 'a' AS Kind, 7L AS user_id").write.format("flightsrv") \
        .mode("append").save(uri)
    spark.sql("SELECT 'b' AS KIND, 2L AS ID, 8L AS User_Id").write.format("flightsrv") \
        .mode("append").save(uri)
    table = Warehouse.open(local_uri).table("names")
    assert table.schema.names == ["id", "Kind", "user_id"]
    got = sorted(r["id"] for r in table.to_table(["id"]).to_pylist())
    assert got == [1, 2]
    cols = spark.read.format("flightsrv").option("columns", "KIND,ID").load(uri)
    assert cols.columns == ["Kind", "id"]
    typed = spark.read.format("flightsrv").schema("ID long, kind string").load(uri)
    assert sorted(tuple(r) for r in typed.collect()) == [(1, "a"), (2, "b")]
    keys = spark.createDataFrame([(8,)], "USER_ID BIGINT")
    assert fs.delete_matching(spark, uri, keys, on=["User_ID"]) == 1
    assert fs.delete_matching(spark, uri, keys, on="user_id", broadcast_limit=0) == 0
    spark.conf.set("spark.sql.caseSensitive", "true")
    try:
        with pytest.raises(Exception) as e:
            spark.sql("SELECT 3L AS ID, 'c' AS Kind, 9L AS user_id").write \
                .format("flightsrv").mode("append").save(uri)
        assert "missing=id" in str(e.value) and "unexpected=ID" in str(e.value)
        with pytest.raises(Exception, match="lacks key columns"):
            fs.delete_matching(spark, uri, keys, on=["user_id"])
        with pytest.raises(Exception, match="unknown column"):
            spark.read.format("flightsrv").option("columns", "KIND").load(uri).collect()
    finally:
        spark.conf.set("spark.sql.caseSensitive", "false")
    # a user schema may widen a column, never narrow it
    with pytest.raises(Exception, match="column=id"):
        spark.read.format("flightsrv").schema("id int").load(uri).collect()


def test_loaded_dataframe_is_pinned_at_load(spark, local_uri):
    uri = f"{local_uri}/pinned"
    spark.range(5).write.format("flightsrv").mode("append").save(uri)
    df = spark.read.format("flightsrv").load(uri)
    spark.range(5, 8).write.format("flightsrv").mode("append").save(uri)  # before any action
    assert df.count() == 5
    Warehouse.open(local_uri).table("pinned").delete("id < 2")
    assert sorted(r.id for r in df.collect()) == list(range(5))
    assert df.where("id > 1").count() == 3
    typed = spark.read.format("flightsrv").schema("id long").load(uri)  # a user schema too
    spark.range(8, 9).write.format("flightsrv").mode("append").save(uri)
    assert typed.count() == 6
    assert spark.read.format("flightsrv").load(uri).count() == 7


def test_a_pinned_dataframe_never_serves_inlined_rows_of_an_expired_version(spark, local_uri):
    """Inlined rows travel in the planned partitions: a DataFrame loaded before an erasure
    expired its version kept returning the erased row (a stored file's read fails with
    ObjectNotFound instead; found in session 28). Its next read now fails with
    VersionNotFound, as time travel to the version does."""
    wh = Warehouse.open(local_uri)
    t = wh.create_table("inl", pa.schema([("id", pa.int64()), ("name", pa.string())]),
                        {"inline.max_rows": "100"})
    t.append(pa.table({"id": [1, 2], "name": ["alice", "eve"]}))
    assert t.head().data_files[0].is_inline
    df = spark.read.format("flightsrv").load(f"{local_uri}/inl")
    assert sorted(r.name for r in df.collect()) == ["alice", "eve"]
    t.delete("name = 'eve'", mode="splice", expire=True)
    with pytest.raises(Exception, match="VersionNotFound"):
        df.collect()
    fresh = spark.read.format("flightsrv").load(f"{local_uri}/inl")
    assert [r.name for r in fresh.collect()] == ["alice"]


def test_orphans_of_failed_creates_are_collected(spark, local_uri):
    """A failed create's files are deleted by the job's abort; what a killed job leaves
    under a prefix with no table goes with the warehouse-level vacuum."""
    wh = Warehouse.open(local_uri)
    spark.range(3).write.format("flightsrv").mode("append").save(f"{local_uri}/keep")
    with pytest.raises(Exception, match="boom"):
        spark.range(0, 300, numPartitions=3).selectExpr(
            "id", "CASE WHEN id = 299 THEN raise_error('boom') ELSE id END AS x") \
            .write.format("flightsrv").save(f"{local_uri}/newt")
    assert not wh.exists("newt")
    # the abort deleted what the finished tasks reported; a task Spark cancelled while it was
    # still writing can leave its file (nothing reports it), as a killed executor would
    left = [m.key for m in wh.store.list("newt/")]
    wh.store.put("newt/data/2026/11/22/00/dead.parquet", b"PAR1")
    keep = sorted(m.key for m in wh.store.list("keep/"))
    assert wh.vacuum_orphans().deleted_objects == 0  # younger than the default grace
    result = wh.vacuum_orphans(grace=0)
    assert result.prefixes == ["newt"] and result.deleted_objects == 1 + len(left)
    assert list(wh.store.list("newt/")) == []
    assert sorted(m.key for m in wh.store.list("keep/")) == keep


def test_merge_schema_adds_new_columns_and_writes_by_field_id(spark, local_uri):
    """Format 2 (issue 15): a DataFrame with a column the table lacks is refused with a hint,
    unless ``mergeSchema``; after a rename and a partition spec, Spark's files carry the
    table's field ids and partitions, and old rows read the new column as NULL."""
    uri = f"{local_uri}/merge"
    spark.sql("SELECT 1L AS id, 'a' AS name").write.format("flightsrv").mode("append").save(uri)
    wh = Warehouse.open(local_uri)
    wh.sql("ALTER TABLE merge RENAME COLUMN name TO label")
    wh.sql("ALTER TABLE merge SET PARTITIONED BY (bucket(4, id))")
    df = spark.sql("SELECT 2L AS id, 'b' AS label, 7 AS extra")
    with pytest.raises(Exception) as e:
        df.write.format("flightsrv").mode("append").save(uri)
    assert "SchemaMismatch" in str(e.value) and "unexpected=extra" in str(e.value)
    assert "mergeSchema" in str(e.value)
    df.write.format("flightsrv").mode("append").option("mergeSchema", "true").save(uri)
    t = wh.table("merge")
    assert t.schema.names == ["id", "label", "extra"]
    got = sorted(t.to_table().to_pylist(), key=lambda r: r["id"])
    assert got == [{"id": 1, "label": "a", "extra": None}, {"id": 2, "label": "b", "extra": 7}]
    new = [f for f in t.head().data_files if f.added_version == t.head().version]
    assert new and all(f.schema_id == t.head().schema["schema_id"] and f.partition
                       for f in new)
    back = spark.read.format("flightsrv").load(uri).orderBy("id").collect()
    assert [tuple(r) for r in back] == [(1, "a", None), (2, "b", 7)]
