"""CREATE OR REPLACE is one commit: the old table stays whole and readable until the new
one is complete, a failed replace changes nothing, racing replaces each commit one whole
table, and rows written for the old table never land in the new one."""

import threading

import pyarrow as pa
import pytest

from flightsrv import Warehouse
from flightsrv.errors import FlightsrvError, TableNotFound, VersionNotFound


def _objects(wh, name, prefix):
    return sorted(m.key for m in wh.table(name, dropped_ok=True).store.list(prefix))


@pytest.fixture
def wh(tmp_path):
    w = Warehouse.open(str(tmp_path / "wh"))
    w.sql("CREATE TABLE precious (id INTEGER, v VARCHAR)")
    w.sql("INSERT INTO precious VALUES (1, 'important'), (2, 'data')")
    return w


def _rows(wh, name="precious"):
    return wh.sql(f"SELECT * FROM {name} ORDER BY ALL").to_pylist()


OLD = [{"id": 1, "v": "important"}, {"id": 2, "v": "data"}]


@pytest.mark.parametrize("statement", [
    # fails part way through its rows, after some were written
    "CREATE OR REPLACE TABLE precious AS SELECT range AS id, CAST(CASE WHEN range = 200000 "
    "THEN 'x' ELSE '1' END AS INTEGER) AS v FROM range(300000)",
    "CREATE OR REPLACE TABLE precious AS SELECT 'x'::JSON AS j",
    "CREATE OR REPLACE TABLE precious AS SELECT 1 AS \"a\nb\"",
    "CREATE OR REPLACE TABLE precious AS SELECT * FROM no_such_table",
    "CREATE OR REPLACE TABLE precious (id INTEGER) PARTITIONED BY (day(nosuch))",
    "CREATE OR REPLACE TABLE precious AS SELECT 1 AS id PARTITIONED BY (bucket(0, id))",
])
def test_a_failed_replace_leaves_the_table_as_it_was(wh, statement):
    head = wh.table("precious").head()
    data_before = _objects(wh, "precious", "data/")
    with pytest.raises(FlightsrvError) as exc:
        wh.sql(statement)
    assert "Traceback" not in str(exc.value) and "OSError" not in str(exc.value)
    assert _rows(wh) == OLD
    after = wh.table("precious").head()
    assert (after.version, after.table_uuid) == (head.version, head.table_uuid)
    assert _objects(wh, "precious", "data/") == data_before  # what it wrote is removed


def test_a_replace_is_one_commit_that_starts_a_new_table(wh):
    t = wh.table("precious")
    old = t.head()
    pinned = t.snapshot()  # a reader that pinned the old table before the replace
    n = wh.sql("CREATE OR REPLACE TABLE precious AS SELECT range AS k FROM range(5)")
    assert n == 5
    new = t.head()
    assert new.version == old.version + 1 and new.operation == "replace"
    assert new.table_uuid != old.table_uuid
    assert new.summary["rows_added"] == 5 and new.summary["rows_deleted"] == 2
    assert new.summary["replaced_version"] == old.version
    assert _rows(wh) == [{"k": i} for i in range(5)]
    assert pinned.scan().read_all().sort_by("id").to_pylist() == OLD
    with pytest.raises(VersionNotFound, match="replaced by CREATE OR REPLACE"):
        t.snapshot(version=old.version)
    assert t.history(limit=1)[0]["operation"] == "replace"


@pytest.mark.parametrize("how", ["replace", "drop and create"])
def test_errors_and_stats_name_the_oldest_version_that_can_be_read(wh, how):
    """``oldest_retained`` names a version time travel can read: one of the current table,
    not one of the table it replaced (which is refused as a dropped table's)."""
    if how == "replace":
        wh.sql("CREATE OR REPLACE TABLE precious (k INTEGER)")
    else:
        wh.sql("DROP TABLE precious")
        wh.sql("CREATE TABLE precious (k INTEGER)")
    wh.sql("INSERT INTO precious VALUES (1)")
    t = wh.table("precious")
    first = t.head().version - 1  # the CREATE (or the replace) of the current table
    with pytest.raises(VersionNotFound) as ei:
        t.snapshot(version=t.head().version + 5)
    assert ei.value.context["oldest_retained"] == first
    t.snapshot(version=first)  # readable
    with pytest.raises(VersionNotFound, match="dropped"):
        t.snapshot(version=first - 1)
    with pytest.raises(VersionNotFound) as ei:
        t.snapshot(as_of=0)
    assert ei.value.context["oldest_retained"] == first
    assert t.stats().oldest_retained_version == first


def test_create_or_replace_with_a_schema_and_on_a_missing_table(wh):
    wh.sql("CREATE OR REPLACE TABLE precious (x BIGINT)")
    assert wh.table("precious").head().operation == "replace"
    assert _rows(wh) == []
    wh.sql("CREATE OR REPLACE TABLE fresh AS SELECT 7 AS x")
    assert wh.table("fresh").head().operation == "create"
    assert _rows(wh, "fresh") == [{"x": 7}]
    wh.sql("DROP TABLE fresh")
    wh.sql("CREATE OR REPLACE TABLE fresh AS SELECT 8 AS x")  # over a dropped table
    assert _rows(wh, "fresh") == [{"x": 8}]


def test_racing_replaces_each_commit_one_whole_table(tmp_path):
    wh = Warehouse.open(str(tmp_path / "wh"))
    wh.sql("CREATE TABLE r AS SELECT -1 AS who, range AS i FROM range(10)")
    errors, seen, stop = [], [], threading.Event()

    def replacer(who):
        try:
            for _ in range(3):
                wh.sql(f"CREATE OR REPLACE TABLE r AS SELECT {who} AS who, range AS i "
                       f"FROM range(1000)")
        except Exception as exc:  # noqa: BLE001 - collected and asserted on
            errors.append(exc)

    def reader():
        while not stop.is_set():
            got = wh.sql("SELECT count(*) AS n, count(DISTINCT who) AS w FROM r").to_pylist()
            seen.append((got[0]["n"], got[0]["w"]))

    threads = [threading.Thread(target=replacer, args=(k,)) for k in range(4)]
    watch = threading.Thread(target=reader)
    watch.start()
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    stop.set()
    watch.join()
    assert errors == []
    assert wh.sql("SELECT count(*) AS n, count(DISTINCT who) AS w FROM r").to_pylist() == \
        [{"n": 1000, "w": 1}]
    # a reader only ever sees one whole table: the first, or one replacer's
    assert seen and set(seen) <= {(10, 1), (1000, 1)}
    assert wh.table("r").head().version == 12


def test_rows_written_for_the_old_table_never_land_in_the_new_one(wh):
    t = wh.table("precious")
    head = t.head()
    batch = pa.table({"id": pa.array([3], pa.int32()), "v": ["late"]})
    files, _, _ = t.write_files(batch, head=head)  # an append in flight ...
    wh.sql("CREATE OR REPLACE TABLE precious (id INTEGER, v VARCHAR)")  # ... raced by this
    with pytest.raises(TableNotFound, match="replaced while the data was written"):
        t.commit_files(files, expected_schema=head.schema, expected_uuid=head.table_uuid)
    assert _rows(wh) == []


def test_vacuum_keeps_the_replaced_tables_files_for_the_grace_period(wh):
    t = wh.table("precious")
    old_files = {f.path for f in t.head().data_files}
    wh.sql("CREATE OR REPLACE TABLE precious AS SELECT 1 AS z")
    t.vacuum(grace=3600)
    assert old_files <= set(_objects(wh, "precious", "data/"))
    t.vacuum(grace=0)
    assert not old_files & set(_objects(wh, "precious", "data/"))
    assert _rows(wh) == [{"z": 1}]


def test_an_insert_select_racing_a_replace_inserts_nothing(tmp_path):
    """INSERT ... SELECT computes its rows for the table version it pinned; if the table is
    replaced before they are committed, none of them land in the new table."""
    d = str(tmp_path / "wh")
    wh = Warehouse.open(d)
    wh.sql("CREATE TABLE t AS SELECT 1 AS gen, range AS id FROM range(10)")
    schema = pa.schema([("gen", pa.int32()), ("id", pa.int64())])
    new = pa.table({"gen": pa.array([2] * 10, pa.int32()), "id": pa.array(range(10))})

    def rows():  # DuckDB pulls this while the INSERT runs: the replace lands meanwhile
        Warehouse.open(d).create_table("t", schema, replace=True, data=new)
        yield pa.record_batch({"gen": pa.array([1], pa.int32()), "id": pa.array([99])},
                              schema=schema)

    for committer in (False, True):
        wh.engine.committer = None if not committer else __import__(
            "flightsrv.engine.group_commit", fromlist=["GroupCommitter"]).GroupCommitter()
        src = pa.RecordBatchReader.from_batches(schema, rows())
        with pytest.raises(TableNotFound, match="replaced"):
            wh.engine.execute_update("INSERT INTO t SELECT gen, id FROM src", wh._session(),
                                     extra={"src": src})
        assert _rows(wh, "t") == new.to_pylist()


@pytest.mark.parametrize("query", [
    "SELECT * FROM precious a JOIN precious b ON a.id = b.id",
    "SELECT 1 AS x, 2 AS X, 3 AS x_1, 4 AS x",
    "SELECT id, v, id FROM precious",
])
def test_a_created_table_renames_repeated_columns_as_duckdb_does(wh, query):
    """CREATE TABLE ... AS over a result that repeats a name (a join's SELECT *) was refused
    ("duplicate column name"); DuckDB creates it with the repeats renamed."""
    import duckdb

    con = duckdb.connect()
    con.sql("CREATE TABLE precious (id INTEGER, v VARCHAR)")
    con.sql("INSERT INTO precious VALUES (1, 'important'), (2, 'data')")
    con.sql(f"CREATE TABLE made AS {query}")
    expected = con.sql("SELECT * FROM made ORDER BY ALL").to_arrow_table()
    wh.sql(f"CREATE TABLE made AS {query}")
    got = wh.sql("SELECT * FROM made ORDER BY ALL")
    assert got.schema.names == expected.schema.names
    assert got.to_pylist() == expected.to_pylist()
