"""``INSERT INTO t BY NAME SELECT ...``: the query's column names are the column list
(matched as DuckDB matches names: case-insensitively), the other columns take their
DEFAULT or NULL, as DuckDB's own INSERT BY NAME does; a name the table lacks, a name twice
and a VALUES source are refused naming the statement, and nothing is written."""

from __future__ import annotations

import duckdb
import pyarrow as pa
import pytest

from flightsrv import Warehouse
from flightsrv.engine import DuckEngine, Session
from flightsrv.errors import SqlError

SETUP = ["CREATE TABLE m (id BIGINT, v VARCHAR)", "ALTER TABLE m ADD COLUMN w INTEGER DEFAULT 7"]
INSERTS = [
    "INSERT INTO m BY NAME SELECT 'x' AS v, 10 AS id",
    'INSERT INTO m BY NAME SELECT 11 AS "ID"',
    "INSERT INTO m BY NAME (SELECT 12 AS id, 'q' AS V)",
    "INSERT INTO m BY NAME WITH s AS (SELECT 13 AS id, 1 AS w) SELECT * FROM s",
    "INSERT INTO m BY NAME SELECT v, id + 100 AS id FROM m WHERE id = 10",
]


@pytest.fixture
def engine(tmp_path):
    e = DuckEngine(Warehouse.open(str(tmp_path / "wh")))
    s = Session("s")
    for sql in SETUP:
        e.execute_update(sql, s)
    yield e, s
    e.close()


def _rows(e, s):
    return e.execute_query("SELECT * FROM m ORDER BY id", s).reader.read_all().to_pylist()


def test_insert_by_name_matches_plain_duckdb(engine):
    e, s = engine
    plain = duckdb.connect()
    plain.execute("CREATE TABLE m (id BIGINT, v VARCHAR, w INTEGER DEFAULT 7)")
    for sql in INSERTS:
        assert e.execute_update(sql, s) == 1
        plain.execute(sql)
    want = plain.sql("SELECT * FROM m ORDER BY id").to_arrow_table().to_pylist()
    assert _rows(e, s) == want
    assert {"id": 11, "v": None, "w": 7} in want and {"id": 13, "v": None, "w": 1} in want


def test_insert_by_name_binds_parameters_by_their_names(engine):
    e, s = engine
    params = pa.record_batch([pa.array(["p"]), pa.array([42], pa.int64())], names=["0", "1"])
    assert e.execute_update("INSERT INTO m BY NAME SELECT ? AS v, ? AS id", s, params) == 1
    assert _rows(e, s) == [{"id": 42, "v": "p", "w": 7}]


@pytest.mark.parametrize("sql, match", [
    ("INSERT INTO m BY NAME SELECT 1 AS nope", "column the table does not have.*nope"),
    ("INSERT INTO m BY NAME SELECT 1 AS id, 2 AS ID", "names a column twice"),
    ("INSERT INTO m BY NAME VALUES (1)", "BY NAME needs a SELECT"),
])
def test_a_bad_insert_by_name_is_refused_and_writes_nothing(engine, sql, match):
    e, s = engine
    with pytest.raises(SqlError, match=match) as ei:
        e.execute_update(sql, s)
    assert "INSERT INTO m BY NAME" in str(ei.value)
    assert _rows(e, s) == []
