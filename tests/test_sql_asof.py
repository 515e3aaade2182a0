"""Time travel as Delta, Iceberg, Spark and Trino spell it (``VERSION AS OF n``, ``FOR
SYSTEM_TIME AS OF '...'``) is read as DuckDB's ``AT (...)`` clause (sql/asof.py), and only
where it is that clause: never inside a string, a quoted name or a comment, never a column
aliased ``of``."""

from __future__ import annotations

import pyarrow as pa
import pytest

from flightsrv import Warehouse
from flightsrv.engine import DuckEngine, Session
from flightsrv.errors import SqlError
from flightsrv.sql.asof import canonical


@pytest.mark.parametrize("text, want", [
    ("SELECT * FROM t VERSION AS OF 1", "SELECT * FROM t AT (VERSION => 1)"),
    ("SELECT * FROM t FOR VERSION AS OF 12 AS x", "SELECT * FROM t AT (VERSION => 12) AS x"),
    ("SELECT * FROM t AS x for system_version as of 3", "SELECT * FROM t AS x AT (VERSION => 3)"),
    ("SELECT * FROM t TIMESTAMP AS OF '2026-01-01'",
     "SELECT * FROM t AT (TIMESTAMP => '2026-01-01')"),
    ("SELECT * FROM t FOR SYSTEM_TIME AS OF TIMESTAMP '2026-01-01 10:00:00'",
     "SELECT * FROM t AT (TIMESTAMP => '2026-01-01 10:00:00')"),
    ('SELECT * FROM "t" VERSION AS OF 3 JOIN main.u FOR VERSION AS OF 4 USING (id)',
     'SELECT * FROM "t" AT (VERSION => 3) JOIN main.u AT (VERSION => 4) USING (id)'),
])
def test_time_travel_clauses_become_at_clauses(text, want):
    assert canonical(text) == want


@pytest.mark.parametrize("text", [
    "SELECT version AS of FROM t",  # a column aliased "of"
    "SELECT 'x VERSION AS OF 1' FROM t",
    'SELECT "t VERSION AS OF 1" FROM t',
    "SELECT * FROM t -- VERSION AS OF 1",
    "SELECT * FROM t /* VERSION AS OF 1 */",
    "SELECT * FROM t VERSION AS OF 1.5",  # not a version number: DuckDB's error
    "SELECT * FROM t VERSION AS OF ?",
    "SELECT * FROM t TIMESTAMP AS OF now()",
    "SELECT * FROM t VERSION AS OF 'abc",  # unreadable text is DuckDB's to refuse
])
def test_anything_else_is_left_as_written(text):
    assert canonical(text) == text


def test_a_delta_style_query_reads_the_version_it_names(tmp_path):
    wh = Warehouse.open(str(tmp_path / "wh"))
    t = wh.create_table("t", pa.schema([("id", pa.int64())]))
    t.append(pa.table({"id": pa.array(range(10), pa.int64())}))
    v = t.head().version
    t.delete("id < 4")
    e = DuckEngine(wh)
    s = Session("s")

    def count(sql):
        return e.execute_query(sql, s).reader.read_all().column(0)[0].as_py()

    try:
        assert count("SELECT count(*) FROM t") == 6
        assert count(f"SELECT count(*) FROM t VERSION AS OF {v}") == 10
        assert count("SELECT count(*) FROM t TIMESTAMP AS OF '2999-01-01T00:00:00Z'") == 6
        assert count(f"SELECT count(*) FROM t AS a FOR VERSION AS OF {v} "
                     f"JOIN t AS b USING (id)") == 6
        # a time before the table's first version
        with pytest.raises(Exception, match="no retained version at or before that time"):
            count("SELECT count(*) FROM t TIMESTAMP AS OF '2000-01-01T00:00:00Z'")
        with pytest.raises(SqlError, match="target of DELETE is always the latest"):
            e.execute_update(f"DELETE FROM t VERSION AS OF {v} WHERE id = 5", s)
        # the prepared form keeps the version it names
        p = e.prepare(f"SELECT count(*) FROM t VERSION AS OF {v}", s)
        assert count(p.sql) == 10
    finally:
        e.close()
