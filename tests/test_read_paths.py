"""The faster read paths of issue 13 keep their contracts (behaviour only; speed is measured in
benchmarks/bench_peers.py):

- ``Snapshot.take`` returns exactly the rows at the given physical positions;
- long ``IN`` lists prune by their range and still delete exactly what DuckDB selects;
- UPDATE/MERGE read the candidates' whole rows by position, also when the statement reads
  the whole row (``t.*``-shaped references fall back to every column);
- S3 data files are read through the store's native Arrow filesystem, and a counting
  wrapper (which must see every read) opts out of it.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from flightsrv import Warehouse
from flightsrv.engine.api import ExecInfo, Session
from flightsrv.store import open_store
from flightsrv.store.base import arrow_filesystem
from flightsrv.store.faults import CountingStore

SCHEMA = pa.schema([("id", pa.int64()), ("v", pa.float64()), ("s", pa.string())])


def rows(lo: int, hi: int) -> pa.Table:
    ids = np.arange(lo, hi, dtype=np.int64)
    return pa.table({"id": ids, "v": ids * 0.5, "s": [f"s{i}" for i in ids]}, schema=SCHEMA)


def _table(uri: str, files: int = 5, per: int = 1000):
    wh = Warehouse.open(uri)
    t = wh.create_table("t", SCHEMA, {"row_group_bytes": "8KB"})
    for i in range(files):
        t.append(rows(i * per, (i + 1) * per))
    return wh, t


def test_take_returns_the_rows_at_the_positions(local_uri):
    per = 2500  # row groups hold at least 1,024 rows: several per file
    wh, t = _table(local_uri, files=3, per=per)
    snap = t.snapshot()
    files = snap.manifest.data_files
    assert all(f.row_groups > 1 for f in files)
    rng = np.random.default_rng(3)
    want = {f.path: np.sort(rng.choice(f.rows, 37, replace=False)).astype(np.int64)
            for f in files[:2]}
    got = snap.take(want)
    expected = []
    for i, f in enumerate(files[:2]):
        expected += [i * per + int(p) for p in want[f.path]]  # ids are positions per file
    assert got.column("id").to_pylist() == expected
    assert got.column("s").to_pylist() == [f"s{i}" for i in expected]
    assert got.schema == SCHEMA
    assert snap.take({}).num_rows == 0


def test_long_in_list_prunes_files_and_deletes_exactly(local_uri):
    wh, t = _table(local_uri)
    ids = list(range(2000, 2040)) + [2990]  # 41 values, all in the third file
    info = ExecInfo()
    n = wh.engine.execute_update(f"DELETE FROM t WHERE id IN ({', '.join(map(str, ids))})",
                                 Session("test"), info=info)
    assert n == len(ids)
    assert (info.files_scanned, info.files_pruned) == (1, 4)
    left = set(t.to_table().column("id").to_pylist())
    assert left == set(range(5000)) - set(ids)
    # a list DuckDB types as DECIMAL/DOUBLE takes the text path and is exact too
    mixed = ", ".join(["3000", "3001.0", "-1"] + [str(3002 + i) for i in range(20)])
    assert wh.engine.execute_update(f"DELETE FROM t WHERE id IN ({mixed})",
                                    Session("test")) == 22
    # values beyond BIGINT and NULLs in the list prune nothing they should not
    big = ", ".join(["NULL", "99999999999999999999"] + [str(4000 + i) for i in range(20)])
    assert wh.engine.execute_update(f"DELETE FROM t WHERE id IN ({big})",
                                    Session("test")) == 20
    assert t.count_rows() == 5000 - len(ids) - 22 - 20


def test_update_and_merge_read_whole_rows_by_position(local_uri):
    wh, t = _table(local_uri, files=2)
    t.delete("id % 10 = 0")  # DVs: the masked scan path
    s = Session("test")
    assert wh.engine.execute_update("UPDATE t SET v = v + 1000 WHERE id % 7 = 3", s) == \
        len([i for i in range(2000) if i % 7 == 3 and i % 10])
    got = {r["id"]: r for r in t.to_table().to_pylist()}
    assert got[3]["v"] == 1001.5 and got[3]["s"] == "s3" and got[4]["v"] == 2.0
    # the statement reads the whole row (the table as a value): every column is read
    n = wh.engine.execute_update("UPDATE t SET s = 'w' WHERE t.s = 's5' AND "
                                 "struct_pack(a := t.id, b := t.s).b = 's5'", s)
    assert n == 1
    wh.sql("CREATE TABLE src (id BIGINT, v DOUBLE)")
    wh.sql("INSERT INTO src VALUES (1, -1.0), (2, -2.0), (5000, 9.0)")
    n = wh.engine.execute_update(
        "MERGE INTO t USING src ON t.id = src.id WHEN MATCHED THEN UPDATE SET v = src.v "
        "WHEN NOT MATCHED THEN INSERT (id, v, s) VALUES (src.id, src.v, 'new')", s)
    assert n == 3
    got = {r["id"]: r for r in t.to_table().to_pylist()}
    assert (got[1]["v"], got[1]["s"]) == (-1.0, "s1")
    assert (got[5000]["v"], got[5000]["s"]) == (9.0, "new")
    assert got[5]["s"] == "w" and len(got) == 2000 - 200 + 1


def test_s3_scans_read_through_the_native_filesystem(s3_uri):
    store = open_store(s3_uri)
    fs = arrow_filesystem(store)
    assert fs is not None and type(fs[0]).__name__ == "S3FileSystem"
    assert arrow_filesystem(CountingStore(store)) is None
    wh, t = _table(s3_uri, files=2)
    assert t.to_table().num_rows == 2000
    assert sorted(t.to_table(filter="id BETWEEN 10 AND 12").column("id").to_pylist()) == \
        [10, 11, 12]
    counted = CountingStore(open_store(s3_uri))
    tc = Warehouse(counted).table("t")
    counted.reset()
    assert tc.snapshot().to_table().num_rows == 2000
    assert counted.counts.get("get_range", 0) > 0  # every data read went through the store


def test_s3_size_mismatch_is_corrupt(s3_uri):
    import dataclasses

    from flightsrv.errors import CorruptObject
    from flightsrv.table.scan import Snapshot

    wh, t = _table(s3_uri, files=1)
    snap = t.snapshot()
    f = snap.manifest.data_files[0]
    wrong = Snapshot(snap.table, dataclasses.replace(snap.manifest, data_files=(
        dataclasses.replace(f, size=f.size + 1),)))
    with pytest.raises(CorruptObject, match="size differs"):
        wrong.to_table()


def _damage(t, key: str) -> None:
    """Break the first ZSTD frame of a data file (its magic number), keeping its size and
    footer: locally in place with its mtime restored, as bit rot leaves it, on S3 by an
    overwrite. Parquet has no checksums, so flipped bytes elsewhere may decode silently."""
    import os

    from flightsrv.store.base import PutMode

    body = bytearray(t.store.get(key)[0])
    at = body.index(b"\x28\xb5\x2f\xfd", 4)
    body[at:at + 4] = bytes(b ^ 0xFF for b in body[at:at + 4])
    path = t.store.local_path(key)
    if path is None:
        t.store.put(key, bytes(body), mode=PutMode.OVERWRITE)
        return
    st = os.stat(path)
    with open(path, "r+b") as f:
        f.write(body)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


def test_a_damaged_data_file_is_corrupt_object_on_every_decode(warehouse_uri):
    """A data file whose pages do not decompress (same size, footer intact) fails a scan, a
    read by position, compaction and a purge's splice with CorruptObject naming the table,
    the object and the version (not a decoder's OSError naming neither)."""
    from flightsrv.errors import CorruptObject

    wh, t = _table(warehouse_uri, files=2)
    t.delete("id % 10 = 3")  # a DV on both files: compaction and purge rewrite them
    version = t.head().version
    f = t.head().data_files[0]
    _damage(t, f.path)
    snap = t.snapshot()
    for what, run in (
        ("scan", lambda: t.to_table()),
        ("take", lambda: snap.take({f.path: np.array([5, 6], dtype=np.int64)})),
        ("compact", lambda: t.compact(min_deleted_fraction=0.01)),
        ("purge", lambda: t.purge()),
    ):
        with pytest.raises(CorruptObject) as info:
            run()
        text = str(info.value)
        assert "table=t" in text and f"object={f.path}" in text, (what, text)
        assert f"version={version}" in text, (what, text)
        assert "OSError" not in text and "/tmp" not in text, (what, text)
    assert t.head().version == version  # nothing was committed


TEMPORAL = pa.schema([("id", pa.int64()), ("ts", pa.timestamp("us")),
                      ("tms", pa.timestamp("ms")), ("tz", pa.timestamp("us", tz="UTC")),
                      ("d", pa.date32())])


@pytest.mark.parametrize("where", [
    "ts = TIMESTAMP '2026-01-03 06:00:00'",
    "ts = DATETIME '2026-01-03 06:00:00'",
    "ts = CAST('2026-01-03 06:00:00' AS TIMESTAMP)",
    "ts = '2026-01-03 06:00:00'",
    "ts >= TIMESTAMP_MS '2026-01-03' AND ts < TIMESTAMP_NS '2026-01-04'",
    "ts BETWEEN TIMESTAMP_S '2026-01-03' AND TIMESTAMP_US '2026-01-03 23:00:00'",
    "tms = TIMESTAMP '2026-01-03 06:00:00'",
    "tz = TIMESTAMPTZ '2026-01-03 06:00:00+00'",
    "d = DATE '2026-01-03'",
    "ts IN (TIMESTAMP '2026-01-03 06:00:00', TIMESTAMP '2026-01-03 07:00:00')",
    "ts >= DATE '2026-01-03' AND ts < DATE '2026-01-04'",
    "tms BETWEEN DATE '2026-01-03' AND '2026-01-03 23:59:59'",
])
def test_a_typed_temporal_constant_prunes_files_by_their_statistics(local_uri, where):
    """Event logs are queried by time: a constant of every spelling of a timestamp, date or
    timestamptz type skips the files whose statistics rule it out (sqlglot reads DuckDB's
    TIMESTAMP as TIMESTAMPNTZ; that spelling pruned nothing, and a point query read every
    file). The rows are DuckDB's own answer over the same rows either way."""
    import datetime as dt

    import duckdb

    wh = Warehouse.open(local_uri)
    t = wh.create_table("ev", TEMPORAL)
    every = []
    for day in range(5):  # one file per day, 24 rows each
        stamps = [dt.datetime(2026, 1, 1 + day, h) for h in range(24)]
        part = pa.table({"id": range(day * 24, day * 24 + 24), "ts": stamps, "tms": stamps,
                         "tz": [s.replace(tzinfo=dt.timezone.utc) for s in stamps],
                         "d": [s.date() for s in stamps]}, schema=TEMPORAL)
        t.append(part)
        every.append(part)
    res = wh.engine.execute_query(f"SELECT id FROM ev WHERE {where} ORDER BY id",
                                  Session("test"))
    got = res.reader.read_all().column("id").to_pylist()
    assert (res.info.files_scanned, res.info.files_pruned) == (1, 4), where
    con = duckdb.connect()
    con.execute("SET TimeZone = 'UTC'")
    con.register("ev", pa.concat_tables(every))
    want = [r[0] for r in con.execute(f"SELECT id FROM ev WHERE {where} ORDER BY id")
            .fetchall()]
    assert got == want and got, where


def _recent_days(t, days: int = 10):
    """``days`` files, one per UTC day ending today (24 hourly rows each, at minute 30 so
    no row sits on a whole-hour boundary), as Arrow tables."""
    import datetime as dt

    today = dt.datetime.now(dt.timezone.utc).replace(hour=0, minute=0, second=0,
                                                       microsecond=0, tzinfo=None)
    every = []
    for k in range(days):
        day = today - dt.timedelta(days=days - 1 - k)
        stamps = [day + dt.timedelta(hours=h, minutes=30) for h in range(24)]
        part = pa.table({"id": range(k * 24, k * 24 + 24), "ts": stamps, "tms": stamps,
                         "tz": [s.replace(tzinfo=dt.timezone.utc) for s in stamps],
                         "d": [s.date() for s in stamps]}, schema=TEMPORAL)
        t.append(part)
        every.append(part)
    return every


def _duckdb_ids(rows: pa.Table, where: str) -> list[int]:
    import duckdb

    con = duckdb.connect()
    con.execute("SET TimeZone = 'UTC'")
    con.register("ev", rows)
    return [r[0] for r in con.execute(f"SELECT id FROM ev WHERE {where} ORDER BY id")
            .fetchall()]


# (WHERE, at least this many of the 10 daily files pruned). A bound that reads the clock is
# widened by 48 hours for statistics (twice when the comparison casts through the time zone)
@pytest.mark.parametrize("where,pruned", [
    ("tz > now() - INTERVAL 1 DAY", 5),
    ("tz >= current_timestamp - INTERVAL '36 hours'", 5),
    ("now() - INTERVAL 1 DAY < tz", 5),
    ("tz >= date_trunc('day', now())", 5),
    ("tz >= CAST(now() AS DATE)", 3),
    ("ts > now() - INTERVAL 1 DAY", 3),
    ("ts >= date_trunc('day', localtimestamp) - INTERVAL 2 DAY", 3),
    ("tms >= current_date - 1", 5),
    ("d >= current_date - 1", 5),
    ("d >= today() - INTERVAL 1 DAY", 5),
    ("ts BETWEEN current_date - 2 AND localtimestamp", 3),
    ("tz < now() - INTERVAL 7 DAY", 4),
    ("d < current_date - 7", 4),
    ("ts <= CAST(now() AS TIMESTAMP) - INTERVAL 7 DAY", 4),
    # equal to a function of the clock: between its values two days either side
    ("d = current_date - 8", 5),
    ("CAST(ts AS DATE) = current_date - 8", 5),
    ("date_trunc('day', tms) = date_trunc('day', localtimestamp) - INTERVAL 8 DAY", 5),
    ("tz = now()", 5),
    ("year(ts) = year(now()) - 1 OR year(ts) = year(now()) - 2", 0),
    ("year(d) >= EXTRACT(YEAR FROM current_date) + 1", 10),
])
def test_a_bound_relative_to_the_clock_prunes_files_and_never_a_match(local_uri, where, pruned):
    """Dashboards ask for "the last day": ``ts > now() - INTERVAL 1 DAY``. The pruner reads
    the clock a moment before the statement does (in a transaction of its own), so such a
    bound prunes by statistics only widened in the safe direction, and the statement's own
    WHERE still decides every row: the rows are DuckDB's answer over the same rows."""
    wh = Warehouse.open(local_uri)
    t = wh.create_table("ev", TEMPORAL)
    rows = pa.concat_tables(_recent_days(t))
    before = _duckdb_ids(rows, where)
    res = wh.engine.execute_query(f"SELECT id FROM ev WHERE {where} ORDER BY id",
                                  Session("test"))
    got = res.reader.read_all().column("id").to_pylist()
    after = _duckdb_ids(rows, where)
    assert got in (before, after), where  # a row can only change sides between the reads
    assert res.info.files_pruned >= pruned, (where, res.info.files_pruned)
    assert res.info.files_scanned + res.info.files_pruned == 10


@pytest.mark.parametrize("where", [
    "tz > now() - INTERVAL 3 DAY",
    "ts > now() - INTERVAL 3 DAY",
    "d < current_date - 2",
    "ts BETWEEN current_date - 3 AND now()",
])
def test_a_clock_bound_over_deleted_rows_reads_only_live_rows(local_uri, where):
    """Files with deleted rows are read with the clock bound as a row condition (in the
    scan, or in a prefetch that runs before the statement): the answer is DuckDB's over the
    live rows, and a DELETE by a clock bound removes exactly the rows DuckDB matches."""
    wh = Warehouse.open(local_uri)
    t = wh.create_table("ev", TEMPORAL)
    rows = pa.concat_tables(_recent_days(t))
    gone = list(range(0, 240, 5))
    t.delete(f"id IN ({', '.join(map(str, gone))})")
    live = rows.filter(pa.compute.invert(pa.compute.is_in(rows["id"], pa.array(gone))))
    session = Session("test")
    before = _duckdb_ids(live, where)
    got = wh.engine.execute_query(f"SELECT id FROM ev WHERE {where} ORDER BY id",
                                  session).reader.read_all().column("id").to_pylist()
    after = _duckdb_ids(live, where)
    assert got in (before, after) and got, where
    point = wh.engine.execute_query(f"SELECT id FROM ev WHERE {where} AND id = {got[0]}",
                                    session).reader.read_all().column("id").to_pylist()
    assert point == [got[0]], where
    before = _duckdb_ids(live, where)
    wh.engine.execute_update(f"DELETE FROM ev WHERE {where}", session)
    after = _duckdb_ids(live, where)
    left = sorted(t.scan(["id"]).read_all().column("id").to_pylist())
    assert left in ([i for i in live.column("id").to_pylist() if i not in before],
                    [i for i in live.column("id").to_pylist() if i not in after]), where


def _pruned_query(local_uri, name: str, schema: pa.Schema, parts: list, where: str):
    """A table ``name`` of one file per Arrow table of ``parts``; ``SELECT id ... WHERE
    where`` through the engine: (ids, files scanned, files pruned), the ids checked against
    DuckDB's answer over the same rows."""
    import duckdb

    wh = Warehouse.open(local_uri)
    t = wh.create_table(name, schema)
    for part in parts:
        t.append(part)
    res = wh.engine.execute_query(f"SELECT id FROM {name} WHERE {where} ORDER BY id",
                                  Session("test"))
    got = res.reader.read_all().column("id").to_pylist()
    con = duckdb.connect()
    con.execute("SET TimeZone = 'UTC'")
    con.register(name, pa.concat_tables(parts))
    assert got == [r[0] for r in con.execute(f"SELECT id FROM {name} WHERE {where} ORDER BY id")
                   .fetchall()], where
    return wh, got, res.info.files_scanned, res.info.files_pruned


@pytest.mark.parametrize("where,scanned", [
    ("id = '77'", 1), ("id IN ('3', '77')", 2), ("id BETWEEN '30' AND 50", 2),
    ("id > '95'", 1), ("f >= '8.5'", 1), ("id = '7.6'", 1),
    # a multi-select filter spelled as ORs of one column: the listed values
    ("id = 3 OR id = 77", 2), ("(id = '3') OR (ID IN (77, 78)) OR id = 79", 2),
    ("(id = 3 OR id = 4) AND f < 1", 1), ("id = 3 OR f > 9.5", 5), ("id = 3 OR id > 90", 5),
])
def test_a_string_literal_against_a_number_column_prunes_as_its_number(local_uri, where,
                                                                       scanned):
    """``id = '77'`` (a BI tool quoting a number): DuckDB casts the literal to the column's
    type, so the files whose bounds rule that number out are skipped; the rows, and the
    error for a literal that is no number, are DuckDB's. ``id = 3 OR id = 77`` prunes as
    ``id IN (3, 77)``; an OR over two columns or of a range prunes nothing."""
    schema = pa.schema([("id", pa.int64()), ("f", pa.float64())])
    parts = [pa.table({"id": range(k * 20, k * 20 + 20),  # ids 0..99 in 5 files of 20
                       "f": [float(i) / 10 for i in range(k * 20, k * 20 + 20)]}, schema=schema)
             for k in range(5)]
    wh, _, *files = _pruned_query(local_uri, "nums", schema, parts, where)
    assert files == [scanned, 5 - scanned], where
    with pytest.raises(Exception, match="Could not convert string 'abc'"):
        wh.engine.execute_query("SELECT id FROM nums WHERE id = 'abc'", Session("test")
                                ).reader.read_all()


@pytest.mark.parametrize("where,scanned", [
    ("CAST(ts AS DATE) = DATE '2023-03-01'", 1),
    ("ts::DATE BETWEEN '2022-01-01' AND '2022-12-31'", 1),
    ("date(tms) >= DATE '2026-01-01'", 1),
    ("date_trunc('month', ts) = TIMESTAMP '2024-05-01'", 1),
    ("date_trunc('year', d) = DATE '2025-01-01'", 1),
    ("year(ts) = 2022", 1),
    ("EXTRACT(YEAR FROM d) IN (2021, 2026)", 2),
    ("year(ts) BETWEEN 2023 AND '2024'", 2),
    ("date_trunc('day', ts) < DATE '2022-06-01'", 2),
    # through the time zone: never pruned
    ("CAST(tz AS DATE) = DATE '2023-03-01'", 6),
    ("date_trunc('week', tz) = TIMESTAMPTZ '2024-01-01 00:00:00+00'", 6),
])
def test_a_function_of_a_time_column_prunes_by_the_function_of_its_bounds(local_uri, where,
                                                                          scanned):
    """BI tools filter on ``CAST(ts AS DATE)``, ``date_trunc('month', ts)`` or
    ``EXTRACT(YEAR FROM ts)``: non-decreasing functions of a DATE or TIMESTAMP column map a
    file's bounds to bounds of theirs, so the files they rule out are skipped (never one of a
    TIMESTAMPTZ column: that cast goes through local time). The rows are DuckDB's."""
    import datetime as dt

    parts = []
    for k in range(6):  # one file per year 2021..2026
        stamps = [dt.datetime(2021 + k, 1 + m // 2, 1 + (m % 2) * 14, m) for m in range(24)]
        parts.append(pa.table({"id": range(k * 24, k * 24 + 24), "ts": stamps, "tms": stamps,
                               "tz": [s.replace(tzinfo=dt.timezone.utc) for s in stamps],
                               "d": [s.date() for s in stamps]}, schema=TEMPORAL))
    _, got, *files = _pruned_query(local_uri, "ev", TEMPORAL, parts, where)
    assert files == [scanned, 6 - scanned] and got, where


@pytest.mark.parametrize("where,scanned", [
    ("s LIKE 'c1%'", 1), ("s LIKE 'c%'", 1), ("s LIKE 'b_9%'", 1), ("s ^@ 'd'", 1),
    ("starts_with(s, 'e42')", 1), ("s GLOB 'a0*'", 1), ("s LIKE 'c10'", 1),
    ("s LIKE 'it''s%'", 0), ("s LIKE 'é%'", 0), ("s LIKE 'a%' OR s LIKE 'e%'", 5),
    ("s LIKE '%1'", 5), ("s NOT LIKE 'a%'", 5), ("s ILIKE 'C1%'", 5),
])
def test_a_string_prefix_pattern_prunes_files_by_their_bounds(local_uri, where, scanned):
    """``url LIKE 'https://shop/%'``: every match starts with the pattern's text before its
    first wildcard, so a file whose bounds hold no string with that prefix is skipped
    (DuckDB compares and matches, bytewise); NOT LIKE, ILIKE, a leading wildcard prune
    nothing. The rows are DuckDB's."""
    schema = pa.schema([("id", pa.int64()), ("s", pa.string())])
    parts = [pa.table({"id": range(k * 100, k * 100 + 100),  # a0..a99, b0..b99, ...
                       "s": [f"{letter}{i}" for i in range(100)]}, schema=schema)
             for k, letter in enumerate("abcde")]
    _, _, *files = _pruned_query(local_uri, "strs", schema, parts, where)
    assert files == [scanned, 5 - scanned], where


def test_an_or_of_thousands_of_values_prunes_without_recursion(local_uri):
    """A BI tool's multi-select of 20,000 ids, spelled as ORs: read as one IN list (the OR
    tree is walked without recursion), pruned to the one file that holds them."""
    schema = pa.schema([("id", pa.int64()), ("f", pa.float64())])
    parts = [pa.table({"id": range(k * 20, k * 20 + 20), "f": [0.0] * 20}, schema=schema)
             for k in range(5)]
    where = " OR ".join(f"id = {i}" for i in [41, 42] + list(range(1000, 20998)))
    _, got, *files = _pruned_query(local_uri, "nums", schema, parts, where)
    assert got == [41, 42] and files == [1, 4]
