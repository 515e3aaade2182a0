"""flightsrv on Spark: the data source, erasure by join, compaction, the pipeline.

One real local[2] SparkSession for the whole run (the ``spark`` fixture of conftest.py,
shared with test_spark_conventions.py and test_spark_differential.py).
"""

from __future__ import annotations

import datetime as dt
import decimal
import os

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

pytest.importorskip("pyspark")

from pyspark.sql import datasource as D

import flightsrv.spark as fs
from flightsrv.spark import compaction
from flightsrv.spark.datasource import FlightsrvDataSource
from flightsrv.warehouse import Warehouse

pytestmark = pytest.mark.spark

UTC = dt.UTC


def _ids(df) -> list[int]:
    return sorted(r[0] for r in df.select("id").collect())


def _events(spark, lo: int, hi: int, parts: int = 2):
    return spark.range(lo, hi, numPartitions=parts).selectExpr(
        "id", "id % 97 AS user_id", "concat('k', cast(id % 5 AS string)) AS kind")


TYPES_SCHEMA = ("i INT, l BIGINT, f DOUBLE, r FLOAT, dec DECIMAL(12,3), s STRING, "
                "ts TIMESTAMP, d DATE, b BOOLEAN, arr ARRAY<INT>, "
                "st STRUCT<x: INT, y: STRING>, m MAP<STRING, BIGINT>")


def _typed_rows():
    plus2 = dt.timezone(dt.timedelta(hours=2))
    return [
        (1, 2**40, 1.5, 0.25, decimal.Decimal("12.345"), "héllo",
         dt.datetime(2024, 3, 1, 12, 30, 0, 123456, tzinfo=UTC), dt.date(2024, 3, 1), True,
         [1, None, 3], (7, "seven"), {"a": 1}),
        (2, -5, -0.0, 3.5, decimal.Decimal("-0.001"), "",
         dt.datetime(1999, 12, 31, 23, 0, tzinfo=plus2), dt.date(1970, 1, 1), False,
         [], (None, None), {}),
        (3, None, None, None, None, None, None, None, None, None, None, None),
    ]


def test_round_trip_types(spark, local_uri):
    uri = f"{local_uri}/typed"
    df = spark.createDataFrame(_typed_rows(), TYPES_SCHEMA)
    df.write.format("flightsrv").mode("append").save(uri)
    back = spark.read.format("flightsrv").load(uri)
    assert back.schema == df.schema
    assert sorted(back.collect(), key=lambda r: r.i) == sorted(df.collect(), key=lambda r: r.i)
    # the stored Arrow schema follows the type map: instants as UTC microseconds
    schema = Warehouse.open(local_uri).table("typed").schema
    assert schema.field("ts").type == pa.timestamp("us", tz="UTC")
    assert schema.field("dec").type == pa.decimal128(12, 3)
    assert schema.field("st").type == pa.struct([("x", pa.int32()), ("y", pa.string())])
    # pushed filters give exactly what Spark's own evaluation gives
    pushing = spark.read.format("flightsrv").option("pushFilters", "true")
    got = pushing.load(uri).where("l > 0 AND s = 'héllo' AND d >= DATE '2000-01-01'").collect()
    assert [r.i for r in got] == [1]
    got = pushing.load(uri).where("l IS NULL OR i IN (2)").collect()
    assert sorted(r.i for r in got) == [2, 3]
    # default (no pushdown): a DataFrame reused across filtered and unfiltered queries stays
    # right (with pushdown on, Spark 4.3 would reuse the first query's filters)
    assert [r.i for r in back.where("i = 3").collect()] == [3]
    assert back.count() == 3


def test_tables_made_outside_spark_read_and_take_rows(spark, local_uri):
    """Tables another writer made (the Python API, DuckDB through the server) with types
    Spark has no exact twin for: a nanosecond timestamp reads truncated to microseconds, a
    column Spark cannot represent is no obstacle when the read leaves it out, and a NULL
    struct whose field is NOT NULL is appended (Spark fills that field beneath the NULL)."""
    wh = Warehouse.open(local_uri)
    ns = wh.create_table("ns", pa.schema([("id", pa.int64()), ("ts", pa.timestamp("ns")),
                                          ("tz", pa.timestamp("ns", tz="UTC"))]))
    ns.append(pa.table({"id": [1], "ts": pa.array([1_700_000_000_123_456_789], pa.timestamp("ns")),
                        "tz": pa.array([1_700_000_000_123_456_789],
                                       pa.timestamp("ns", tz="UTC"))}))
    row = spark.read.format("flightsrv").load(f"{local_uri}/ns").collect()[0]
    assert row.ts == dt.datetime(2023, 11, 14, 22, 13, 20, 123456)
    assert row.tz.astimezone(UTC) == dt.datetime(2023, 11, 14, 22, 13, 20, 123456, tzinfo=UTC)
    # a user schema may still not narrow a column: the error names both types the right way
    with pytest.raises(Exception) as e:
        spark.read.format("flightsrv").schema("id INT").load(f"{local_uri}/ns").collect()
    assert "column=id" in str(e.value) and "table_type=int64" in str(e.value) \
        and "read_type=int32" in str(e.value)

    tm = wh.create_table("tm", pa.schema([("id", pa.int64()), ("t", pa.time64("us"))]))
    tm.append(pa.table({"id": [1, 2], "t": pa.array([dt.time(1), dt.time(2)],
                                                    pa.time64("us"))}))
    got = spark.read.format("flightsrv").option("columns", "id").load(f"{local_uri}/tm")
    assert _ids(got) == [1, 2]
    with pytest.raises(Exception) as e:  # reading the TIME column itself still says why
        spark.read.format("flightsrv").load(f"{local_uri}/tm").collect()
    assert "column=t" in str(e.value) and "cannot be read by Spark" in str(e.value)

    st = pa.schema([("id", pa.int64()),
                    ("s", pa.struct([pa.field("a", pa.int64(), False),
                                     ("b", pa.struct([pa.field("c", pa.string(), False)]))]))])
    wh.create_table("st", st)
    spark.createDataFrame([(1, None), (2, (5, None)), (3, (6, ("x",)))],
                          "id long, s struct<a: long, b: struct<c: string>>") \
        .write.format("flightsrv").mode("append").save(f"{local_uri}/st")
    assert sorted(Warehouse.open(local_uri).table("st").to_table().to_pylist(),
                  key=lambda r: r["id"]) == [
        {"id": 1, "s": None}, {"id": 2, "s": {"a": 5, "b": None}},
        {"id": 3, "s": {"a": 6, "b": {"c": "x"}}}]
    # a NULL where the field counts is still refused, naming the nested column
    with pytest.raises(Exception) as e:
        spark.createDataFrame([(4, (None, None))], "id long, s struct<a: long, b: struct<c: "
                              "string>>").write.format("flightsrv").mode("append") \
            .save(f"{local_uri}/st")
    assert "s.a" in str(e.value)

    # a table property of a new table is checked before any task writes a file
    for prop, value in (("target_file_size", "huge"), ("nonsense", "1")):
        with pytest.raises(Exception) as e:
            _events(spark, 0, 5).write.format("flightsrv").option(f"property.{prop}", value) \
                .save(f"{local_uri}/props")
        assert "invalid table property" in str(e.value) and "table=props" in str(e.value) \
            and f"property={prop}" in str(e.value)
    assert not os.path.exists(os.path.join(local_uri, "props"))


def test_pushdown_split_and_pruning(spark, local_uri):
    uri = f"{local_uri}/pushed"
    _events(spark, 0, 4000, parts=4).write.format("flightsrv").mode("append").save(uri)
    opts = {"path": uri, "pushFilters": "true"}
    reader = FlightsrvDataSource(opts).reader(spark.read.format("flightsrv").load(uri).schema)
    from pyspark.sql.datasource import DataSourceReader

    # only the opt-in reader overrides pushFilters (Spark refuses such readers unless
    # spark.sql.python.filterPushdown.enabled is set)
    assert type(reader).pushFilters is not DataSourceReader.pushFilters
    plain = FlightsrvDataSource({"path": uri}).reader(
        spark.read.format("flightsrv").load(uri).schema)
    assert type(plain).pushFilters is DataSourceReader.pushFilters
    all_parts = len(reader.partitions())
    when = dt.datetime(2024, 1, 1)
    filters = [D.GreaterThanOrEqual(("id",), 3500), D.Not(D.EqualTo(("kind",), "k1")),
               D.GreaterThan(("ts",), when), D.EqualTo(("missing", "nested"), 1)]
    rest = list(reader.pushFilters(filters))
    assert rest == filters  # Spark evaluates every filter; flightsrv only prunes
    assert len(reader.partitions()) < all_parts  # file statistics pruned by id >= 3500
    rows = [r for p in reader.partitions() for b in reader.read(p) for r in b.to_pylist()]
    ids = sorted(r["id"] for r in rows)
    assert set(range(3500, 4000)) <= set(ids)  # nothing that can match was pruned
    assert ids[0] >= 3000  # ... and whole files that cannot match were skipped


def test_time_travel_and_metadata_columns(spark, local_uri):
    uri = f"{local_uri}/tt"
    _events(spark, 0, 100).write.format("flightsrv").mode("append").save(uri)
    table = Warehouse.open(local_uri).table("tt")
    v1 = table.head()
    _events(spark, 100, 150).write.format("flightsrv").mode("append").save(uri)
    table.delete("id < 10")
    def read():  # a DataFrameReader keeps its options: one per load
        return spark.read.format("flightsrv")

    assert read().load(uri).count() == 140
    assert _ids(read().option("version", v1.version).load(uri)) == list(range(100))
    as_of = dt.datetime.fromtimestamp(v1.created_at_ms / 1000, tz=UTC).isoformat()
    assert read().option("timestampAsOf", as_of).load(uri).count() == 100
    meta = spark.read.format("flightsrv").option("metadataColumns", "true") \
        .option("columns", "id").load(uri).where("id IN (10, 120)").collect()
    assert [c for c in meta[0].asDict()] == ["id", "_file", "_row_position"]
    for r in meta:  # (_file, _row_position) names the physical row a DV would name
        pf = pq.read_table(os.path.join(local_uri, "tt", r["_file"]))
        assert pf.column("id")[r["_row_position"]].as_py() == r["id"]


def test_overwrite_and_schema_mismatch(spark, local_uri):
    uri = f"{local_uri}/ow"
    _events(spark, 0, 50).write.format("flightsrv").mode("append").save(uri)
    _events(spark, 1000, 1010).write.format("flightsrv").mode("overwrite").save(uri)
    assert _ids(spark.read.format("flightsrv").load(uri)) == list(range(1000, 1010))
    assert Warehouse.open(local_uri).table("ow").history()[0]["operation"] == "spark_overwrite"
    bad = _events(spark, 0, 5).withColumnRenamed("kind", "flavour")
    with pytest.raises(Exception) as e:
        bad.write.format("flightsrv").mode("append").save(uri)
    assert "missing=kind" in str(e.value) and "unexpected=flavour" in str(e.value)
    with pytest.raises(Exception) as e:
        _events(spark, 0, 5).selectExpr("id", "array(user_id) AS user_id", "kind") \
            .write.format("flightsrv").mode("append").save(uri)
    assert "column=user_id" in str(e.value)


def test_spark_append_while_another_writer_commits(spark, local_uri):
    """A plain flightsrv append commits while the Spark job runs: both land (rebase)."""
    uri = f"{local_uri}/conc"
    table = Warehouse.open(local_uri).create_table(
        "conc", pa.schema([("id", pa.int64()), ("user_id", pa.int64()), ("kind", pa.string())]))
    wh = local_uri

    def sneak_in(batches):
        for b in batches:
            if 0 in b.column("id").to_pylist():  # exactly one task commits on the side
                Warehouse.open(wh).table("conc").append(pa.table({
                    "id": pa.array([-1, -2], pa.int64()), "user_id": pa.array([0, 0], pa.int64()),
                    "kind": ["side", "side"]}))
            yield b

    df = _events(spark, 0, 200)
    df.mapInArrow(sneak_in, df.schema).write.format("flightsrv").mode("append").save(uri)
    assert _ids(spark.read.format("flightsrv").load(uri)) == [-2, -1] + list(range(200))
    ops = [h["operation"] for h in table.history()]
    assert ops[:2] == ["spark_append", "append"]


def test_failed_write_leaves_table_unchanged(spark, local_uri):
    """A value that does not fit is refused at analysis (nothing written). A task that fails
    after tasks wrote files commits nothing; Spark kills the other tasks mid-write, so their
    files (and the failed task's) can stay behind unreferenced: table vacuum and, for a
    failed create, warehouse vacuum collect them."""
    uri = f"{local_uri}/crash"
    wh = Warehouse.open(local_uri)
    table = wh.create_table("crash", pa.schema([("id", pa.int64()), ("small", pa.int8())]),
                            {"target_file_size": 1, "row_group_bytes": 1})
    table.append(pa.table({"id": pa.array([1], pa.int64()), "small": pa.array([1], pa.int8())}))
    before = table.head()
    files_before = sorted(m.key for m in table.store.list("data/"))
    too_wide = spark.range(0, 50).selectExpr("id", "id % 100 AS small")  # bigint into int8
    for mode in ("append", "overwrite"):
        with pytest.raises(Exception) as e:
            too_wide.write.format("flightsrv").mode(mode).save(uri)
        assert "column=small" in str(e.value) and "table_type=int8" in str(e.value)
        assert "incoming_type=bigint" in str(e.value)
    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "1024")
    try:
        # partition 0 finishes (several files); partition 1 fails after writing some
        df = spark.range(0, 5000, numPartitions=2).selectExpr(
            "id", "CAST(CASE WHEN id = 4999 THEN raise_error('boom') ELSE id % 100 END "
            "AS TINYINT) AS small")
        for mode in ("append", "overwrite"):
            with pytest.raises(Exception, match="boom"):
                df.write.format("flightsrv").mode(mode).save(uri)
        with pytest.raises(Exception, match="boom"):  # a failing create creates nothing
            spark.range(0, 3000, numPartitions=2).selectExpr(
                "id", "CASE WHEN id = 2999 THEN raise_error('boom') ELSE id END AS x") \
                .write.format("flightsrv").mode("append").save(f"{local_uri}/never")
    finally:
        spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "100000")
    assert table.head().version == before.version
    assert _ids(spark.read.format("flightsrv").load(uri)) == [1]
    assert not wh.exists("never")
    table.vacuum(grace=0)
    assert sorted(m.key for m in table.store.list("data/")) == files_before
    wh.vacuum_orphans(grace=0)
    assert list(wh.store.list("never/")) == []


def test_erasure_by_join_agrees_with_duckdb(spark, local_uri):
    from flightsrv.engine.api import Session
    from flightsrv.engine.duck import DuckEngine

    uri = f"{local_uri}/ev"
    _events(spark, 0, 3000, parts=3).write.format("flightsrv").mode("append").save(uri)
    _events(spark, 3000, 5000, parts=2).write.format("flightsrv").mode("append").save(uri)
    Warehouse.open(local_uri).table("ev").delete("user_id = 4")  # already deleted stays so
    erase = [4, 7, 13, 96, 500, 1000]  # 4 is already gone; 500 and 1000 match nothing
    keys = spark.createDataFrame([(u,) for u in erase + [7]], "user_id INT")
    expected = sum(1 for i in range(5000) if i % 97 in (7, 13, 96))
    assert fs.delete_matching(spark, uri, keys, on="user_id") == expected
    # idempotent, through Spark's shuffle join this time
    assert fs.delete_matching(spark, uri, keys, on=["user_id"], broadcast_limit=0) == 0
    survivors = [i for i in range(5000) if i % 97 not in erase]
    # composite keys, both paths; a NULL key part matches nothing
    pairs = spark.createDataFrame([(20, "k0"), (20, "k3"), (21, None)], "user_id LONG, kind STRING")
    hit = [i for i in survivors if i % 97 == 20 and i % 5 in (0, 3)]
    assert fs.delete_matching(spark, uri, pairs, on=["user_id", "kind"]) == len(hit)
    pairs = spark.createDataFrame([(22, "k1")], "user_id LONG, kind STRING")
    hit2 = [i for i in survivors if i % 97 == 22 and i % 5 == 1]
    assert fs.delete_matching(spark, uri, pairs, on=["user_id", "kind"],
                              broadcast_limit=0) == len(hit2)
    survivors = [i for i in survivors if i not in set(hit) | set(hit2)]
    assert _ids(spark.read.format("flightsrv").load(uri)) == survivors

    assert fs.delete_where(spark, uri, "id >= 4900 AND kind = 'k0'") == sum(
        1 for i in survivors if i >= 4900 and i % 5 == 0)
    survivors = [i for i in survivors if not (i >= 4900 and i % 5 == 0)]
    spark_rows = spark.read.format("flightsrv").load(uri).selectExpr(
        "count(*) AS n", "sum(id) AS s").collect()[0]
    engine = DuckEngine(Warehouse.open(local_uri))
    try:
        duck = engine.execute_query("SELECT count(*) AS n, sum(id) AS s FROM ev",
                                    Session("t")).reader.read_all()
    finally:
        engine.close()
    assert (spark_rows.n, spark_rows.s) == (len(survivors), sum(survivors))
    assert duck.to_pylist() == [{"n": len(survivors), "s": sum(survivors)}]


def test_erasure_by_join_in_splice_mode_is_certified(spark, local_uri):
    """mode="splice": the stored rows whose keys match (a DV-hidden one too) leave the bytes in
    one erasure commit, with a certificate naming the key set only by its fingerprint."""
    from flightsrv.table import fingerprint as fpr

    uri = f"{local_uri}/sp"
    _events(spark, 0, 2000).write.format("flightsrv").mode("append").save(uri)
    table = Warehouse.open(local_uri).table("sp")
    table.delete("user_id = 8")  # hidden by a DV, but its bytes are stored: erased too
    keys = spark.createDataFrame([(7,), (8,), (7,)], "user_id INT")
    n = fs.delete_matching(spark, uri, keys, on="user_id", mode="splice", expire=True,
                           grace=dt.timedelta(hours=2))
    assert n == sum(1 for i in range(2000) if i % 97 == 7)
    result = n.result
    assert result.complete and result.rows_removed == sum(
        1 for i in range(2000) if i % 97 in (7, 8))
    want = fpr.KeySetFingerprint(fpr.key_for(table.warehouse), ["user_id"]).update(
        pa.table({"user_id": [7, 8]})).result()
    head = table.head()
    assert head.operation == "delete_matching" and head.summary["request_fingerprint"] == want
    # the operator's list as it came, duplicates and NULLs included, gives the same
    # fingerprint through the public helper (it hashed every row: session 28)
    assert fpr.keys_fingerprint(table.warehouse, ["user_id"], pa.table(
        {"user_id": pa.array([7, None, 8, 7], pa.int32())})) == want
    cert = table.erasures()[-1]
    assert (cert["operation"], cert["source"], cert["status"]) == (
        "delete_matching", "spark", "erased")
    assert cert["request_fingerprint"] == want and cert["verification"]["matches"] == 0
    for m in table.store.list("data/"):
        users = pq.read_table(pa.BufferReader(table.store.get(m.key)[0]))["user_id"]
        assert not {7, 8} & set(users.to_pylist()), m.key
    # the shuffle path folds the same fingerprint on the executors; nothing left to erase
    again = fs.delete_matching(spark, uri, keys, on="user_id", mode="splice",
                               broadcast_limit=0)
    assert again == 0 and again.result.fingerprint == want
    # DV mode records the fingerprint, never the keys
    fs.delete_matching(spark, uri, spark.createDataFrame([(9,)], "user_id INT"), on="user_id")
    assert table.head().summary["request_fingerprint"].startswith("hmac-sha256:")
    fs.delete_where(spark, uri, "user_id = 10")
    assert table.head().summary["request_fingerprint"] == fpr.fingerprint(
        table.warehouse, "user_id = 10")
    assert "predicate" not in table.head().summary


def test_spark_erasures_take_grace_like_every_entry_point(local_uri):
    """ERASURE.md: every erasure entry point takes ``expire``, ``grace`` and
    ``certificate``; the Spark ones refused ``grace`` (TypeError). ``delete_where`` needs no
    Spark session; ``delete_matching`` passes ``grace`` the same way (to the splice)."""
    import inspect

    from flightsrv.spark import erasure

    for fn in (fs.delete_where, fs.delete_matching):
        params = inspect.signature(getattr(erasure, fn.__name__)).parameters
        assert {"expire", "grace", "certificate"} <= set(params), fn.__name__
    wh = Warehouse.open(local_uri)
    t = wh.create_table("g", pa.schema([("id", pa.int64())]))
    t.append(pa.table({"id": list(range(10))}))
    t.store.put("data/2020/01/01/00/orphan.parquet", b"a failed run's output")
    kept = fs.delete_where(None, f"{local_uri}/g", "id = 3", mode="splice", expire=True)
    assert kept.result.status == "pending"  # the orphan is younger than the default grace
    n = fs.delete_where(None, f"{local_uri}/g", "id = 4", mode="splice", expire=True,
                        grace=0)
    assert n == 1 and n.result.complete, n.result.verification
    assert "data/2020/01/01/00/orphan.parquet" in n.result.deleted_objects


def test_compaction_on_spark_keeps_deletes(spark, local_uri):
    uri = f"{local_uri}/cmp"
    for lo in range(0, 2000, 500):
        _events(spark, lo, lo + 500).write.format("flightsrv").mode("append").save(uri)
    table = Warehouse.open(local_uri).table("cmp")
    table.delete("user_id = 3")
    live = sorted(r["id"] for r in table.to_table(["id"]).to_pylist())
    snap, groups, _, options = compaction.plan(table)
    assert groups and len(snap.manifest.data_files) == 8
    written = compaction.rewrite_groups(spark, local_uri, "cmp", snap, groups, options)
    table.delete("id IN (11, 1999)")  # lands between the rewrite and its commit
    result = compaction.commit_groups(
        table, snap, written, compaction.CompactResult("cmp", False, snap.version))
    assert result.groups_committed == len(groups) and result.deletes_carried_over == 2
    head = table.head()
    assert head.operation == "compact" and len(head.data_files) < 8
    want = [i for i in live if i not in (11, 1999)]
    assert _ids(spark.read.format("flightsrv").load(uri)) == want
    # a second compaction folds the carried-over DV away
    r = fs.compact(spark, uri, min_deleted_fraction=0.0)
    assert r.version is not None and table.head().data_files[0].dv is None
    assert sorted(r["id"] for r in table.to_table(["id"]).to_pylist()) == want
    # the erasure-deadline report, as Table.compact gives it (it was always empty: the
    # deleted rows' bytes are kept by the retained versions; session 28)
    table.set_properties(**{"erasure.deadline": "0s"})
    r = fs.compact(spark, uri, dry_run=True)
    assert r.erasures_overdue and r.erasures_overdue == table.compact(
        dry_run=True).erasures_overdue


@pytest.mark.s3
def test_s3_write_read_erase(spark, s3_uri):
    uri = f"{s3_uri}/events"
    _events(spark, 0, 1000).write.format("flightsrv").mode("append").save(uri)
    keys = spark.createDataFrame([(5,), (6,)], "user_id LONG")
    assert fs.delete_matching(spark, uri, keys, on=["user_id"]) == sum(
        1 for i in range(1000) if i % 97 in (5, 6))
    got = _ids(spark.read.format("flightsrv").load(uri).where("id < 300"))
    assert got == [i for i in range(300) if i % 97 not in (5, 6)]
    assert Warehouse.open(s3_uri).table("events").count_rows() == sum(
        1 for i in range(1000) if i % 97 not in (5, 6))


def test_pipeline_end_to_end(spark, tmp_path, capsys):
    from flightsrv.spark import pipeline

    wh = str(tmp_path / "wh")
    rc = pipeline.run(spark, ["--warehouse", wh, "--input", str(tmp_path / "raw"),
                              "--generate", "600", "--files", "4", "--batch-files", "2",
                              "--format", "csv"])
    assert rc == 0
    out = capsys.readouterr().out
    table = Warehouse.open(wh).table("events")
    ops = [h["operation"] for h in reversed(table.history())]
    # the first batch creates the table with its rows in one commit
    assert ops == ["create", "spark_append", "delete", "compact"]
    erased = {int(x) for x in (tmp_path / "raw" / "erasure_list.csv").read_text().split()[1:]}
    users = table.to_table(["user_id"]).column("user_id").to_pylist()
    assert erased and not erased & set(users)
    assert len(users) + table.history()[1]["rows_deleted"] == 600
    assert "history of" in out and "compact" in out
