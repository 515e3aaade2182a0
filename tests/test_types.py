"""The write type rules (flightsrv.table.types) through the Python API, SQL INSERT and Flight
SQL ingest, and the warehouse-level vacuum of failed creates (Python API and CLI)."""

from __future__ import annotations

import datetime as dt
import decimal
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pytest

from flightsrv.errors import ConfigurationError, SchemaMismatch, SqlError
from flightsrv.table import types as rules
from flightsrv.table.schema import duckdb_storable
from flightsrv.table.table import parse_timestamp_ms
from flightsrv.warehouse import Warehouse

ROOT = Path(__file__).resolve().parent.parent

#: Arrow type -> values that reach its edges (NULL is added)
VALUES: dict[pa.DataType, list] = {
    pa.bool_(): [True, False],
    pa.int8(): [-128, 127, 0],
    pa.int16(): [-32768, 32767],
    pa.int32(): [-2**31, 2**31 - 1],
    pa.int64(): [-2**63, 2**63 - 1],
    pa.uint8(): [0, 255],
    pa.uint16(): [65535],
    pa.uint32(): [2**32 - 1],
    pa.uint64(): [2**64 - 1],
    pa.float16(): [float("nan"), float("inf"), -0.0, 65504.0],
    pa.float32(): [float("nan"), float("-inf"), -0.0, 3.4028234663852886e38, 1e-45],
    pa.float64(): [float("nan"), float("inf"), -0.0, 1.7976931348623157e308, 5e-324],
    pa.decimal128(10, 2): [decimal.Decimal("99999999.99"), decimal.Decimal("-0.01")],
    pa.decimal128(38, 10): [decimal.Decimal("9" * 28 + "." + "9" * 10)],
    pa.string(): ["", "12", "héllo"],
    pa.large_string(): ["x", "2024-01-01"],
    pa.binary(): [b"", b"\x00\xff"],
    pa.date32(): [dt.date(1, 1, 1), dt.date(9999, 12, 31)],
    pa.timestamp("s"): [dt.datetime(1, 1, 1), dt.datetime(9999, 12, 31, 23, 59, 59)],
    pa.timestamp("ms"): [dt.datetime(2024, 2, 29, 12, 0, 0, 123000)],
    pa.timestamp("us"): [dt.datetime(1, 1, 1), dt.datetime(9999, 12, 31, 23, 59, 59, 999999)],
    pa.timestamp("ns"): [dt.datetime(2024, 1, 1, 0, 0, 0, 1)],
    pa.timestamp("us", tz="UTC"): [dt.datetime(1, 1, 1, tzinfo=dt.UTC)],
    pa.timestamp("us", tz="Europe/Paris"): [dt.datetime(2024, 6, 1, 12, tzinfo=dt.UTC)],
    pa.time64("us"): [dt.time(23, 59, 59, 999999)],
    pa.duration("us"): [dt.timedelta(days=-10**6)],
    pa.list_(pa.int32()): [[2**31 - 1, None], []],
    pa.list_(pa.int64()): [[2**63 - 1]],
    pa.struct([("a", pa.int32()), ("b", pa.string())]): [{"a": 1, "b": "x"},
                                                          {"a": None, "b": None}],
    pa.struct([("b", pa.string()), ("a", pa.int64())]): [{"a": 2**40, "b": "y"}],
    pa.map_(pa.string(), pa.int32()): [[("k", 2**31 - 1)]],
    pa.map_(pa.string(), pa.int64()): [[("k", 2**63 - 1)]],
}

EXPECTED = {  # (table type, incoming type) exact widenings among VALUES' types
    (pa.int16(), pa.int8()), (pa.int32(), pa.int8()), (pa.int64(), pa.int8()),
    (pa.int32(), pa.int16()), (pa.int64(), pa.int16()), (pa.int64(), pa.int32()),
    (pa.int16(), pa.uint8()), (pa.int32(), pa.uint8()), (pa.int64(), pa.uint8()),
    (pa.uint16(), pa.uint8()), (pa.uint32(), pa.uint8()), (pa.uint64(), pa.uint8()),
    (pa.int32(), pa.uint16()), (pa.int64(), pa.uint16()), (pa.uint32(), pa.uint16()),
    (pa.uint64(), pa.uint16()), (pa.int64(), pa.uint32()), (pa.uint64(), pa.uint32()),
    (pa.float32(), pa.int8()), (pa.float64(), pa.int8()), (pa.float32(), pa.int16()),
    (pa.float64(), pa.int16()), (pa.float64(), pa.int32()), (pa.float32(), pa.uint8()),
    (pa.float64(), pa.uint8()), (pa.float32(), pa.uint16()), (pa.float64(), pa.uint16()),
    (pa.float64(), pa.uint32()),
    (pa.float32(), pa.float16()), (pa.float64(), pa.float16()), (pa.float64(), pa.float32()),
    (pa.decimal128(10, 2), pa.int8()), (pa.decimal128(10, 2), pa.int16()),
    (pa.decimal128(10, 2), pa.uint8()), (pa.decimal128(10, 2), pa.uint16()),
    (pa.decimal128(38, 10), pa.int8()), (pa.decimal128(38, 10), pa.int16()),
    (pa.decimal128(38, 10), pa.int32()), (pa.decimal128(38, 10), pa.int64()),
    (pa.decimal128(38, 10), pa.uint8()), (pa.decimal128(38, 10), pa.uint16()),
    (pa.decimal128(38, 10), pa.uint32()), (pa.decimal128(38, 10), pa.uint64()),
    (pa.decimal128(38, 10), pa.decimal128(10, 2)),
    (pa.string(), pa.large_string()), (pa.large_string(), pa.string()),
    (pa.timestamp("s"), pa.date32()), (pa.timestamp("ms"), pa.date32()),
    (pa.timestamp("us"), pa.date32()),
    (pa.timestamp("ms"), pa.timestamp("s")), (pa.timestamp("us"), pa.timestamp("s")),
    (pa.timestamp("us"), pa.timestamp("ms")),
    (pa.timestamp("us", tz="UTC"), pa.timestamp("us", tz="Europe/Paris")),
    (pa.timestamp("us", tz="Europe/Paris"), pa.timestamp("us", tz="UTC")),
    (pa.list_(pa.int64()), pa.list_(pa.int32())),
    (pa.struct([("b", pa.string()), ("a", pa.int64())]),
     pa.struct([("a", pa.int32()), ("b", pa.string())])),
    (pa.map_(pa.string(), pa.int64()), pa.map_(pa.string(), pa.int32())),
}


def _column(t: pa.DataType) -> pa.Array:
    return pa.array(VALUES[t] + [None], t)


def _same(a, b) -> bool:
    if a is None or b is None:
        return a is None and b is None
    if isinstance(a, float) or isinstance(b, float):
        a, b = float(a), float(b)
        return (math.isnan(a) and math.isnan(b)) or (
            a == b and math.copysign(1, a) == math.copysign(1, b))
    if isinstance(a, dt.date) and not isinstance(a, dt.datetime) and isinstance(b, dt.datetime):
        return b == dt.datetime.combine(a, dt.time())
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b


def test_type_matrix_python_api(tmp_path):
    """Every (table type, incoming type) pair: an exact widening (values, edges included,
    read back unchanged) or SchemaMismatch before any file is written."""
    wh = Warehouse.open(str(tmp_path / "wh"))
    types = list(VALUES)
    allowed = {(tt, it) for tt in types for it in types if rules.refusal(tt, it) is None}
    assert allowed == EXPECTED | {(t, t) for t in types}
    for n, declared in enumerate(types):
        table = wh.create_table(f"t{n}", pa.schema([("c", declared)]))
        # a type DuckDB has none for is stored as the one it reads (float16 as float32)
        tt = duckdb_storable(declared)
        assert table.schema.field("c").type == tt
        for it in types:
            data = pa.table({"c": _column(it)})
            if rules.refusal(tt, it) is not None:
                with pytest.raises(SchemaMismatch) as e:
                    table.append(data)
                msg = str(e.value)
                assert f"column=c table_type={rules.type_name(tt)}" in msg, msg
                assert f"incoming_type={rules.type_name(it)}" in msg, msg
                continue
            v = table.append(data).version
            got = table.to_table(version=v).column("c").to_pylist()[-len(data):]
            assert all(_same(a, b) for a, b in zip(data.column("c").to_pylist(), got)), (tt, it)
        assert len(list(table.store.list("data/"))) == len(table.head().data_files)


def test_docs_show_the_rules():
    text = (ROOT / "docs" / "TYPES.md").read_text()
    assert rules.markdown_table() in text


def test_nested_not_null_and_names():
    t = pa.schema([pa.field("a", pa.list_(pa.field("element", pa.int32(), False))),
                   pa.field("s", pa.struct([pa.field("x", pa.int64(), False)]))])
    ok = pa.table({"a": pa.array([[1], None], pa.list_(pa.int8())),
                   "s": pa.array([{"x": 1}, None], pa.struct([("x", pa.int32())]))})
    match = rules.plan_columns(t, ok.schema)
    out = rules.conform_batch(ok.to_batches()[0], t, match)
    assert out.schema == t and out.column("a").to_pylist() == [[1], None]
    bad = pa.table({"a": pa.array([[1, None]], pa.list_(pa.int32())),
                    "s": pa.array([{"x": 1}], pa.struct([("x", pa.int32())]))})
    with pytest.raises(SchemaMismatch, match="column=a.element"):
        rules.conform_batch(bad.to_batches()[0], t, match, table="t")
    bad = pa.table({"a": pa.array([[1]], pa.list_(pa.int32())),
                    "s": pa.array([{"x": None}], pa.struct([("x", pa.int32())]))})
    with pytest.raises(SchemaMismatch, match="column=s.x"):
        rules.conform_batch(bad.to_batches()[0], t, match, table="t")
    # names: exact by default, case-insensitive on request; nested struct fields too
    upper = pa.schema([("A", pa.list_(pa.int32())), ("S", pa.struct([("X", pa.int64())]))])
    with pytest.raises(SchemaMismatch, match="missing=a,s"):
        rules.plan_columns(t, upper)
    match = rules.plan_columns(t, upper, case_sensitive=False)
    assert match == {"a": "A", "s": "S"}
    batch = pa.record_batch([pa.array([[3]], pa.list_(pa.int32())),
                             pa.array([{"X": 4}], upper.field("S").type)], schema=upper)
    assert rules.conform_batch(batch, t, match, case_sensitive=False).to_pylist() == [
        {"a": [3], "s": {"x": 4}}]
    with pytest.raises(SchemaMismatch, match="differ only in case"):
        rules.plan_columns(pa.schema([("a", pa.int64())]),
                           pa.schema([("a", pa.int64()), ("A", pa.int64())]),
                           case_sensitive=False)
    assert rules.nullable_nested(t.field("a").type).value_field.nullable


def test_sql_insert_casts_like_duckdb(tmp_path):
    """SQL INSERT: DuckDB's assignment casts (a statement, not Arrow data), errors name the
    statement."""
    wh = Warehouse.open(str(tmp_path / "wh"))
    wh.sql("CREATE TABLE t (i INTEGER, d DOUBLE, ts TIMESTAMPTZ, m DECIMAL(10,2))")
    assert wh.sql("INSERT INTO t VALUES ('12', 1.5, '2024-01-01 00:00:00+00', 2)") == 1
    assert wh.sql("INSERT INTO t (i) SELECT 7::TINYINT") == 1
    got = wh.sql("SELECT * FROM t ORDER BY i").to_pylist()
    assert got[0] == {"i": 7, "d": None, "ts": None, "m": None}
    assert got[1]["i"] == 12 and got[1]["d"] == 1.5 and got[1]["m"] == decimal.Decimal("2.00")
    with pytest.raises(SqlError, match="statement="):
        wh.sql("INSERT INTO t (i) VALUES ('x')")
    assert wh.table("t").count_rows() == 2


def test_ingest_follows_the_rules(tmp_path):
    """Arrow Flight SQL ingest (ADBC) into an existing table: widening accepted, anything
    else refused with column, table type and incoming type; nothing written."""
    import warnings

    import adbc_driver_manager
    from _server_engine import start_test_server
    from adbc_driver_flightsql import dbapi

    from flightsrv.engine import DuckEngine

    wh = Warehouse.open(str(tmp_path / "wh"))
    srv, engine, uri = start_test_server(engine=DuckEngine(wh))
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            conn = dbapi.connect(uri)
        with conn.cursor() as cur:
            cur.execute("CREATE TABLE ing (id BIGINT, n INTEGER)")
            assert cur.adbc_ingest("ing", pa.table({"id": pa.array([1], pa.int32()),
                                                    "n": pa.array([2], pa.int16())}),
                                   mode="append") == 1
        with conn.cursor() as cur, pytest.raises(adbc_driver_manager.Error) as e:
            cur.adbc_ingest("ing", pa.table({"id": pa.array([2], pa.int64()),
                                             "n": ["12"]}), mode="append")
        msg = str(e.value)
        assert "column=n" in msg and "table_type=int32" in msg and "incoming_type=string" in msg
        conn.close()
        assert wh.table("ing").count_rows() == 1
        assert len(list(wh.table("ing").store.list("data/"))) == 1
    finally:
        srv.shutdown()
        engine.close()


def test_timestamps_as_of_parse():
    assert parse_timestamp_ms("1700000000000") == 1700000000000
    assert parse_timestamp_ms(" 1700000000000 ") == 1700000000000
    assert parse_timestamp_ms(1700000000000) == 1700000000000
    assert parse_timestamp_ms("2023-11-14T22:13:20Z") == 1700000000000
    assert parse_timestamp_ms("2023-11-14 23:13:20+01:00") == 1700000000000
    assert parse_timestamp_ms("2023-11-14") == parse_timestamp_ms("2023-11-14T00:00:00Z")
    with pytest.raises(ConfigurationError, match="does not parse"):
        parse_timestamp_ms("last tuesday")


# -- failed creates: the warehouse-level vacuum ---------------------------------------------


def _stray(wh: Warehouse, name: str) -> str:
    key = f"{name}/data/2026/11/22/00/stray.parquet"
    wh.store.put(key, b"PAR1 not really")
    return key


def test_vacuum_orphans(warehouse_uri):
    wh = Warehouse.open(warehouse_uri)
    t = wh.create_table("kept", pa.schema([("a", pa.int64())]))
    t.append(pa.table({"a": [1, 2]}))
    wh.create_table("gone", pa.schema([("a", pa.int64())]))
    wh.drop_table("gone")  # a dropped table keeps its log: its own vacuum applies
    stray = _stray(wh, "newt")
    _stray(wh, "gone")
    wh.store.put("_flightsrv-keys/other.json", b"{}")  # not a table name: never touched
    kept = sorted(m.key for m in wh.store.list("kept/"))
    assert wh.vacuum_orphans().deleted_objects == 0  # younger than 7 days
    dry = wh.vacuum_orphans(grace=0, dry_run=True)
    assert dry.prefixes == ["newt"] and [o["key"] for o in dry.objects] == [stray]
    assert [m.key for m in wh.store.list("newt/")] == [stray]
    done = wh.vacuum_orphans(grace=dt.timedelta(0))
    assert done.deleted_objects == 1 and done.deleted_bytes == len(b"PAR1 not really")
    assert list(wh.store.list("newt/")) == []
    assert sorted(m.key for m in wh.store.list("kept/")) == kept
    assert len(list(wh.store.list("gone/data/"))) == 1
    assert len(list(wh.store.list("_flightsrv-keys/"))) >= 1
    assert wh.table("kept").count_rows() == 2


def test_cli_warehouse_vacuum(tmp_path):
    wh_path = str(tmp_path / "wh")
    wh = Warehouse.open(wh_path)
    wh.create_table("kept", pa.schema([("a", pa.int64())]))
    stray = _stray(wh, "newt")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "flightsrv.cli", "--warehouse", wh_path, "warehouse", "vacuum"]

    def run(*args):
        return subprocess.run([*cmd, *args], capture_output=True, text=True, env=env,
                              timeout=120, check=False)

    r = run("--grace", "0")
    assert r.returncode == 1 and "below the minimum grace" in r.stderr
    assert "Traceback" not in r.stderr
    r = run("--grace", "0", "--allow-short-grace", "--dry-run", "--format", "jsonl")
    assert r.returncode == 0, r.stderr
    got = {d["metric"]: d["value"] for d in map(json.loads, r.stdout.splitlines())}
    assert got["prefixes"] == "newt" and str(got["deleted_objects"]) == "1"
    assert [m.key for m in wh.store.list("newt/")] == [stray]
    r = run("--grace", "0s", "--allow-short-grace")
    assert r.returncode == 0, r.stderr
    assert list(wh.store.list("newt/")) == []
    r = run()  # nothing left; the default grace keeps young files anyway
    assert r.returncode == 0 and "deleted_objects" in r.stdout


@pytest.mark.parametrize("t", [pa.time32("s"), pa.time32("ms"), pa.time64("us"),
                               pa.time64("ns")])
def test_time_columns_store_statistics_and_prune_by_them(tmp_path, t):
    """time32 columns failed to append (their statistics were cast to int64, which pyarrow
    cannot do for time32); every time unit keeps min/max and SQL filters on them."""
    wh = Warehouse.open(str(tmp_path / "wh"))
    table = wh.create_table("tm", pa.schema([("c", t)]))
    early = pa.table({"c": pa.array([dt.time(1, 2, 3), dt.time(2, 0)], t)})
    late = pa.table({"c": pa.array([dt.time(5, 0), dt.time(6, 30)], t)})
    table.append(early)
    table.append(late)
    files = table.head().data_files
    assert all(f.stats for f in files)
    got = wh.sql("SELECT c FROM tm WHERE c > '03:00:00' ORDER BY c").to_pylist()
    assert got == [{"c": dt.time(5, 0)}, {"c": dt.time(6, 30)}]
    assert table.to_table().column("c").to_pylist() == early.column("c").to_pylist() + \
        late.column("c").to_pylist()


def test_dates_past_year_9999_and_infinities_are_stored_and_filtered_like_duckdb(tmp_path):
    """Their Parquet bounds do not fit Python's datetime: the column keeps no bounds for
    that file (never pruned on) instead of the append failing with an OverflowError."""
    import duckdb

    wh = Warehouse.open(str(tmp_path / "wh"))
    ddl = "CREATE TABLE d (id INTEGER, dt DATE, ts TIMESTAMP)"
    rows = ["(1, '10000-01-01', '12000-05-05 00:00:00')", "(2, 'infinity', '-infinity')",
            "(3, '2020-01-01', '2020-01-01 00:00:00')"]
    ref = duckdb.connect()
    for con in (wh.sql, ref.execute):
        con(ddl)
        for r in rows:
            con(f"INSERT INTO d VALUES {r}")
    for where in ("dt > DATE '2021-01-01'", "ts < TIMESTAMP '2000-01-01'", "dt = 'infinity'",
                  "true"):
        q = f"SELECT id, dt::VARCHAR AS dt, ts::VARCHAR AS ts FROM d WHERE {where} ORDER BY id"
        assert [tuple(r.values()) for r in wh.sql(q).to_pylist()] == ref.execute(q).fetchall()


def pd_ns(n: int):
    """A duration[ns] value as pyarrow gives it back."""
    return pa.scalar(n, pa.duration("ns")).as_py()


def test_durations_read_through_sql_as_duckdb_reads_them(tmp_path):
    """A duration column is what DuckDB makes of the same Arrow data: INTERVAL (Parquet
    stores the integer, which DuckDB's Parquet reader alone gives as BIGINT), from a clean
    file, a file with deletes, inlined rows and after OPTIMIZE; INTERVAL values DuckDB
    computes (UPDATE, INSERT) and timedelta parameters are written back, and an INTERVAL
    with months is refused naming the column."""
    import duckdb

    units = ("s", "ms", "us", "ns")
    values = [90, -1500, 0, None, 7]
    data = pa.table({"id": pa.array(range(len(values)), pa.int64()),
                     **{f"d_{u}": pa.array(values, pa.duration(u)) for u in units}})
    ref = duckdb.connect()
    ref.register("data", data)
    cols = ", ".join(f"d_{u}, typeof(d_{u}) AS t_{u}" for u in units)
    query = f"SELECT id, {cols} FROM {{}} WHERE id <> 4 ORDER BY id"
    expected = ref.sql(query.format("data")).to_arrow_table().to_pylist()
    assert {r["t_ns"] for r in expected} == {"INTERVAL"}
    wh = Warehouse.open(str(tmp_path / "wh"))
    for name, props in (("files", {}), ("inlined", {"inline.max_rows": "100"})):
        wh.create_table(name, data.schema, props).append(data)
        wh.sql(f"DELETE FROM {name} WHERE id = 4")
        assert wh.sql(query.format(name)).to_pylist() == expected, name
    wh.table("files").append(data.slice(0, 2))
    # DuckDB's INTERVAL holds microseconds: a rewrite that would drop a duration[ns]
    # value's nanoseconds (id 0 holds 90 ns) is refused, nothing changes
    version = wh.table("files").head().version
    with pytest.raises(SchemaMismatch, match="below a microsecond"):
        wh.sql("UPDATE files SET d_ms = d_ms + INTERVAL 1 SECOND WHERE id = 0")
    assert wh.table("files").head().version == version
    assert wh.sql("UPDATE files SET d_ms = d_ms + INTERVAL 1 SECOND, d_ns = d_ns * 2 "
                  "WHERE id = 2") == 1
    assert wh.sql("INSERT INTO files (id, d_s, d_us) VALUES (9, INTERVAL 2 DAYS, "
                  "INTERVAL 3 MICROSECONDS)") == 1
    wh.sql("OPTIMIZE files")
    stored = wh.table("files").to_table().sort_by([("id", "ascending")]).to_pylist()
    by_id: dict = {}
    for row in stored:
        by_id.setdefault(row.pop("id"), []).append(row)
    assert by_id[0] == [{"d_s": dt.timedelta(seconds=90), "d_ms": dt.timedelta(seconds=0.09),
                         "d_us": dt.timedelta(microseconds=90), "d_ns": pd_ns(90)}] * 2
    assert by_id[1] == [{"d_s": dt.timedelta(seconds=-1500),
                         "d_ms": dt.timedelta(seconds=-1.5),
                         "d_us": dt.timedelta(microseconds=-1500),
                         "d_ns": pd_ns(-1500)}] * 2  # OPTIMIZE copies exactly
    assert by_id[2] == [{"d_s": dt.timedelta(0), "d_ms": dt.timedelta(seconds=1),
                         "d_us": dt.timedelta(0), "d_ns": pd_ns(0)}]
    assert by_id[9] == [{"d_s": dt.timedelta(days=2), "d_ms": None,
                         "d_us": dt.timedelta(microseconds=3), "d_ns": None}]
    assert wh.sql("SELECT count(*) AS n FROM files WHERE d_s = ?",
                  params=[dt.timedelta(days=2)]).to_pylist() == [{"n": 1}]
    with pytest.raises((SchemaMismatch, SqlError), match="months"):
        wh.sql("UPDATE files SET d_s = INTERVAL 1 MONTH WHERE id = 9")
    with pytest.raises((SchemaMismatch, SqlError), match="whole number"):
        wh.sql("UPDATE files SET d_s = INTERVAL 1 MILLISECOND WHERE id = 9")
    assert wh.sql("SELECT d_s = INTERVAL 2 DAYS AS same FROM files WHERE id = 9"
                  ).to_pylist() == [{"same": True}]


def test_a_column_of_type_null_takes_a_type_by_alter(tmp_path):
    """An all-NULL first batch (pandas' None column) makes a column of type null: an append
    of values is refused with the way out (ALTER ... TYPE), which is metadata-only from null
    to any type; old rows (deleted ones included) read NULL under the new type."""
    wh = Warehouse.open(str(tmp_path / "wh"))
    t = wh.create_table("n", pa.schema([("id", pa.int64()), ("note", pa.null())]))
    t.append(pa.table({"id": [1, 2, 3], "note": pa.nulls(3)}))
    wh.sql("DELETE FROM n WHERE id = 3")
    with pytest.raises(SchemaMismatch, match="ALTER TABLE"):
        wh.table("n").append(pa.table({"id": [4], "note": ["hello"]}))
    version = wh.table("n").head().version
    assert wh.sql("ALTER TABLE n ALTER COLUMN note TYPE VARCHAR") == 0
    assert wh.table("n").head().version == version + 1
    wh.table("n").append(pa.table({"id": [4], "note": ["hello"]}))
    assert wh.sql("INSERT INTO n VALUES (5, 'x')") == 1
    assert wh.sql("UPDATE n SET note = 'y' WHERE id = 1") == 1
    query = "SELECT id, note, typeof(note) AS t FROM n ORDER BY id"
    want = [{"id": 1, "note": "y", "t": "VARCHAR"}, {"id": 2, "note": None, "t": "VARCHAR"},
            {"id": 4, "note": "hello", "t": "VARCHAR"}, {"id": 5, "note": "x", "t": "VARCHAR"}]
    assert wh.sql(query).to_pylist() == want
    wh.sql("OPTIMIZE n")
    assert wh.sql(query).to_pylist() == want
    with pytest.raises(ConfigurationError, match="only widening"):
        wh.sql("ALTER TABLE n ALTER COLUMN note TYPE INTEGER")
