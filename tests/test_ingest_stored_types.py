"""Arrow types DuckDB has no type for (``float16``, ``decimal256``, ``time32``, a zoned
``timestamp[s|ms]``), handed in by ADBC bulk ingest: the table stores the DuckDB type that
holds their values, so SQL reads (deleted rows and an empty table included), writes
(INSERT, UPDATE, MERGE), DESCRIBE and ``information_schema`` work on it, and one such
table never breaks ``information_schema`` for the others (found in session 28: every
``information_schema`` query of the warehouse failed with DuckDB's "Unsupported Internal
Arrow Type")."""

from __future__ import annotations

import datetime as dt
import decimal

import pyarrow as pa
import pytest

from _server_harness import WRITER, adbc, start

COLUMNS = {
    "f16": (pa.array([1.5, 2.5, 3.5], pa.float16()), "FLOAT", [1.5, 2.5, 3.5]),
    "d256": (pa.array([decimal.Decimal("1.5"), decimal.Decimal("-2.25"), None],
                      pa.decimal256(20, 3)), "DECIMAL(20,3)",
             [decimal.Decimal("1.500"), decimal.Decimal("-2.250"), None]),
    "t32": (pa.array([1, 2, 3], pa.time32("s")), "TIME",
            [dt.time(0, 0, 1), dt.time(0, 0, 2), dt.time(0, 0, 3)]),
    "tsz": (pa.array([1000, 2000, 3000], pa.timestamp("ms", tz="UTC")),
            "TIMESTAMP WITH TIME ZONE",
            [dt.datetime(1970, 1, 1, 0, 0, k, tzinfo=dt.timezone.utc) for k in (1, 2, 3)]),
    "nested": (pa.array([[1.5], [], None], pa.list_(pa.float16())), "FLOAT[]",
               [[1.5], [], None]),
    # a fixed-size list is a list (Parquet stores one; DuckDB reads LIST back)
    "fsl": (pa.array([[1, 2], [3, 4], None], pa.list_(pa.int32(), 2)), "INTEGER[]",
            [[1, 2], [3, 4], None]),
    # kept as it is (Iceberg's fixed[n]); DuckDB's BLOBs are written back length-checked
    "fsb": (pa.array([b"ab", b"cd", b"ef"], pa.binary(2)), "BLOB", [b"ab", b"cd", b"ef"]),
}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    srv, _engine, _wh, uri = start(tmp_path_factory.mktemp("stored"))
    yield uri
    srv.shutdown()


def _rows(cur, sql):
    cur.execute(sql)
    return cur.fetch_arrow_table().to_pylist()


@pytest.mark.parametrize("kind", sorted(COLUMNS))
def test_ingested_types_read_and_write_through_sql(server, kind):
    arr, duck_type, values = COLUMNS[kind]
    name = f"k_{kind}"
    with adbc(server, WRITER) as conn, conn.cursor() as cur:
        cur.execute("CREATE TABLE IF NOT EXISTS plain_t (a INTEGER)")
        first = pa.table({"id": pa.array([1], pa.int32()), "c": arr.slice(0, 1)})
        cur.adbc_ingest(name, first, mode="create")
        cur.execute(f"DELETE FROM {name}")  # an empty table reads through an Arrow scan
        assert _rows(cur, f"SELECT * FROM {name}") == []
        cur.adbc_ingest(name, pa.table({"id": pa.array([1, 2, 3], pa.int32()), "c": arr}),
                        mode="append")
        assert [r["c"] for r in _rows(cur, f"SELECT c FROM {name} ORDER BY id")] == values
        assert _rows(cur, f"DESCRIBE {name}")[1]["column_type"] == duck_type
        # information_schema answers, for this table and the others
        got = _rows(cur, "SELECT table_name, data_type FROM information_schema.columns "
                         f"WHERE table_name IN ('plain_t', '{name}') AND column_name IN "
                         "('a', 'c') ORDER BY table_name")
        assert got == [{"table_name": name, "data_type": duck_type},
                       {"table_name": "plain_t", "data_type": "INTEGER"}]
        cur.execute(f"DELETE FROM {name} WHERE id = 2")  # a masked scan (Arrow)
        assert [r["c"] for r in _rows(cur, f"SELECT c FROM {name} ORDER BY id")] == \
            [values[0], values[2]]
        # SQL writes: DuckDB's values of the stored type
        cur.execute(f"INSERT INTO {name} SELECT id + 10, c FROM {name}")
        cur.execute(f"UPDATE {name} SET id = id + 100 WHERE id = 1")
        cur.execute(f"MERGE INTO {name} AS t USING (SELECT 3 AS id) AS s ON t.id = s.id "
                    "WHEN MATCHED THEN UPDATE SET id = 4")
        got = _rows(cur, f"SELECT id, c FROM {name} ORDER BY id")
        assert got == [{"id": 4, "c": values[2]}, {"id": 11, "c": values[0]},
                       {"id": 13, "c": values[2]}, {"id": 101, "c": values[0]}]
        cur.execute(f"DROP TABLE {name}")


def test_a_fixed_size_binary_column_takes_blobs_of_its_length(server):
    """SQL writes into a ``fixed_size_binary[2]`` column (and a list of them): DuckDB's
    BLOBs of that length are stored as the column's type, one of another length is
    SchemaMismatch naming the column and nothing is written (every INSERT, UPDATE and MERGE
    of such a table failed before: session 28)."""
    with adbc(server, WRITER) as conn, conn.cursor() as cur:
        cur.adbc_ingest("fx", pa.table({
            "id": pa.array([1], pa.int32()), "c": pa.array([b"ab"], pa.binary(2)),
            "l": pa.array([[b"zz"]], pa.list_(pa.binary(2)))}), mode="create")
        cur.execute("INSERT INTO fx VALUES (2, 'gh', ['yy'])")  # the VALUES fast path
        cur.execute("INSERT INTO fx SELECT 3, 'kl'::BLOB, ['ww']")
        cur.execute("UPDATE fx SET l = list_append(l, 'qq'::BLOB) WHERE id = 1")
        for bad, column in (("INSERT INTO fx VALUES (4, 'abc', NULL)", "column=c"),
                            ("INSERT INTO fx SELECT 5, 'ij', ['x']", "column=l"),
                            ("UPDATE fx SET c = 'toolong' WHERE id = 1", "column=c")):
            with pytest.raises(Exception, match="length differs") as e:
                cur.execute(bad)
            assert column in str(e.value)
        assert _rows(cur, "SELECT id, c, l FROM fx ORDER BY id") == [
            {"id": 1, "c": b"ab", "l": [b"zz", b"qq"]}, {"id": 2, "c": b"gh", "l": [b"yy"]},
            {"id": 3, "c": b"kl", "l": [b"ww"]}]


def test_create_table_as_stores_a_fixed_size_array_as_a_list(server):
    """``CREATE TABLE ... AS`` a fixed-size ARRAY column stores a list (docs/TYPES.md): the
    table takes SQL writes, and DESCRIBE agrees with ``typeof`` (it was stored as a
    fixed-size list, DESCRIBE said INTEGER[3], and every INSERT failed: session 29)."""
    with adbc(server, WRITER) as conn, conn.cursor() as cur:
        cur.execute("CREATE TABLE ctas_arr AS SELECT 1 AS id, [1, 2, 3]::INTEGER[3] AS arr, "
                    "{'v': [1.5, 2.5]::DOUBLE[2]} AS s")
        cur.execute("INSERT INTO ctas_arr VALUES (2, [4, 5], {'v': [1.0]})")
        cur.execute("INSERT INTO ctas_arr (id) VALUES (3)")
        cur.execute("UPDATE ctas_arr SET arr = [7, 8, 9]::INTEGER[3] WHERE id = 1")
        assert [(r["column_name"], r["column_type"]) for r in _rows(cur, "DESCRIBE ctas_arr")] \
            == [("id", "INTEGER"), ("arr", "INTEGER[]"), ("s", "STRUCT(v DOUBLE[])")]
        assert _rows(cur, "SELECT id, arr, s, typeof(arr) AS t FROM ctas_arr ORDER BY id") == [
            {"id": 1, "arr": [7, 8, 9], "s": {"v": [1.5, 2.5]}, "t": "INTEGER[]"},
            {"id": 2, "arr": [4, 5], "s": {"v": [1.0]}, "t": "INTEGER[]"},
            {"id": 3, "arr": None, "s": None, "t": "INTEGER[]"}]
        cur.execute("DROP TABLE ctas_arr")


def test_timestamps_past_duckdbs_range_are_refused_and_nothing_is_written(server):
    """An Arrow ``timestamp[ms]`` (or ``[s]``) value DuckDB cannot read as microseconds,
    top-level or nested: the ingest is refused with SchemaMismatch naming the column and
    nothing is written (it was accepted, and every read of the column failed from then on,
    a DELETE of the row or OPTIMIZE did not help: session 29); ±infinity stays."""
    inf = 2 ** 63 - 1
    with adbc(server, WRITER) as conn, conn.cursor() as cur:
        ok = pa.table({"id": pa.array([1, 2], pa.int32()),
                       "v": pa.array([inf, -inf], pa.int64()).cast(pa.timestamp("ms")),
                       "l": pa.array([[0], None], pa.list_(pa.timestamp("s")))})
        cur.adbc_ingest("far", ok, mode="create")
        for column, arr in (
                ("v", pa.array([2 ** 60], pa.int64()).cast(pa.timestamp("ms"))),
                ("l", pa.array([[2 ** 52]], pa.list_(pa.int64())).cast(
                    pa.list_(pa.timestamp("s"))))):
            cols = {"id": pa.array([3], pa.int32()),
                    "v": pa.array([0], pa.int64()).cast(pa.timestamp("ms")),
                    "l": pa.array([[0]], pa.list_(pa.timestamp("s")))}
            cols[column] = arr
            with pytest.raises(Exception, match="beyond DuckDB's range") as e:
                cur.adbc_ingest("far", pa.table(cols), mode="append")
            assert f"column={column}" in str(e.value)
        got = _rows(cur, "SELECT id, CAST(v AS VARCHAR) AS v, l FROM far ORDER BY id")
        assert got == [{"id": 1, "v": "infinity", "l": [dt.datetime(1970, 1, 1)]},
                       {"id": 2, "v": "-infinity", "l": None}]
        # a zoned one is stored in microseconds (see COLUMNS): the cast refuses it
        with pytest.raises(Exception, match="out of the column type's range"):
            cur.adbc_ingest("far2", pa.table({"v": pa.array([-(2 ** 62)], pa.int64()).cast(
                pa.timestamp("ms", tz="UTC"))}), mode="create")
        assert "far2" not in [r["name"] for r in _rows(cur, "SHOW TABLES")]
        cur.execute("DROP TABLE far")
