"""A result column typed by a bound parameter (``SELECT ? AS v``): GetFlightInfo announces
the schema of the statement with the bound values, the one DoGet streams, so clients that
check the two (ADBC: "endpoint 0 returned inconsistent schema") get their rows. Real
flightsrv engine over a local warehouse, real server, ADBC and raw pyarrow.flight clients."""

from __future__ import annotations

import warnings

import pyarrow as pa
import pytest
from adbc_driver_flightsql import dbapi
from pyarrow import flight

from flightsrv import Warehouse
from flightsrv.engine.duck import DuckEngine
from flightsrv.server import proto
from flightsrv.server.app import start_in_thread

pytestmark = pytest.mark.filterwarnings("ignore:Cannot disable autocommit")


@pytest.fixture(scope="module")
def port(tmp_path_factory):
    engine = DuckEngine(Warehouse.open(str(tmp_path_factory.mktemp("pschema") / "wh")))
    server, port = start_in_thread(engine)
    yield port
    server.shutdown()
    engine.close()


@pytest.fixture
def cur(port):
    conn = _connect(port)
    cursor = conn.cursor()
    yield cursor
    cursor.close()
    conn.close()


@pytest.mark.parametrize("sql,params,rows", [
    ("SELECT ? AS v", [1], [{"v": 1}]),
    ("SELECT ? AS v", ["t"], [{"v": "t"}]),
    ("SELECT ? AS v", [None], [{"v": None}]),
    ("SELECT ? AS v", [2**40], [{"v": 2**40}]),
    ("SELECT id, ? AS tag FROM range(3) t(id) ORDER BY id", ["t"],
     [{"id": 0, "tag": "t"}, {"id": 1, "tag": "t"}, {"id": 2, "tag": "t"}]),
    ("SELECT ? + 1 AS v, ? AS w", [1.5, "x"], [{"v": 2.5, "w": "x"}]),
    ("SELECT ?::INTEGER AS v", [1], [{"v": 1}]),
])
def test_parameter_typed_column_through_adbc(cur, sql, params, rows):
    cur.execute(sql, parameters=params)
    assert cur.fetch_arrow_table().to_pylist() == rows


def test_same_statement_with_other_parameter_types(cur):
    # one prepared text, bound with values of different types in turn
    for value in (1, "t", None, 2.5, 3):
        cur.execute("SELECT ? AS v", parameters=[value])
        assert cur.fetch_arrow_table().to_pylist() == [{"v": value}]


def _desc(msg):
    return flight.FlightDescriptor.for_command(proto.pack(msg))


def _prepare(client, query: str) -> bytes:
    """A prepared statement's handle, created through the raw Flight SQL action."""
    (raw,) = [r.body.to_pybytes() for r in client.do_action(flight.Action(
        "CreatePreparedStatement", proto.pack(proto.ActionCreatePreparedStatementRequest(
            query=query))))]
    return proto.unpack(raw).prepared_statement_handle


def _connect(port):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return dbapi.connect(f"grpc://127.0.0.1:{port}", autocommit=True)


@pytest.mark.parametrize("params", [
    pa.record_batch({"0": pa.array([7], pa.int64())}),
    pa.record_batch({"0": pa.array(["t"], pa.string())}),
    pa.record_batch({"0": pa.array([None], pa.null())}),
])
def test_announced_schema_is_the_streamed_schema(port, params):
    client = flight.connect(f"grpc://127.0.0.1:{port}")
    try:
        handle = _prepare(client, "SELECT id, ? AS tag FROM range(2) t(id)")
        cmd = proto.CommandPreparedStatementQuery(prepared_statement_handle=handle)
        writer, _ = client.do_put(_desc(cmd), params.schema)
        writer.write_batch(params)
        writer.close()
        info = client.get_flight_info(_desc(cmd))
        table = client.do_get(info.endpoints[0].ticket).read_all()
        assert info.schema.equals(table.schema), (info.schema, table.schema)
        # GetSchema of the same bound statement answers the same schema (never runs it)
        described = client.get_schema(_desc(cmd)).schema
        assert described.equals(table.schema), (described, table.schema)
        assert table.column("tag").to_pylist() == [params.column(0)[0].as_py()] * 2
    finally:
        client.close()


def test_a_nanosecond_timestamp_parameter_keeps_its_nanoseconds(cur):
    """SELECT and DELETE with the same bound value match the same rows (a query bound the
    value through Python, cut to microseconds, while DML bound the exact literal)."""
    cur.execute("CREATE OR REPLACE TABLE ns_t (ts TIMESTAMP_NS)")
    cur.execute("INSERT INTO ns_t VALUES ('2024-01-02 03:04:20.123456789')")
    value = pa.record_batch([pa.array([1704164660123456789], pa.timestamp("ns"))], names=["0"])
    cur.execute("SELECT ? AS v", parameters=value)
    got = cur.fetch_arrow_table()
    assert got.schema.field("v").type == pa.timestamp("ns")
    assert got.column("v")[0].value == 1704164660123456789
    cur.execute("SELECT count(*) AS n FROM ns_t WHERE ts = ?", parameters=value)
    assert cur.fetchall() == [(1,)]
    cur.execute("DELETE FROM ns_t WHERE ts = ?", parameters=value)
    assert cur.rowcount == 1


@pytest.mark.parametrize("sql,names", [
    ("SELECT 1 AS x, 2 AS x", ["x", "x"]),
    ("SELECT 1 AS x, 2 AS x, 3 AS x_1", ["x", "x", "x_1"]),
    ("SELECT * FROM (VALUES (1, 'a')) a(id, s) JOIN (VALUES (1, 'b')) b(id, s) USING (id)",
     None),
    ("SELECT * FROM (VALUES (1, 'a')) a(id, s), (VALUES (1, 'b')) b(id, s)",
     ["id", "s", "id", "s"]),
])
def test_duplicate_result_names_are_announced_as_streamed(cur, port, sql, names):
    """A result may repeat a column name (a join's SELECT *): GetFlightInfo announces the
    names DuckDB streams (a LIMIT 0 probe renamed them x_1 and ADBC refused the stream as
    "inconsistent schema")."""
    import duckdb

    expected = duckdb.sql(sql).to_arrow_table()
    if names is not None:
        assert expected.schema.names == names
    cur.execute(sql)
    got = cur.fetch_arrow_table()
    assert got.schema.names == expected.schema.names
    assert got.to_pylist() == expected.to_pylist()
    client = flight.connect(f"grpc://127.0.0.1:{port}")
    try:
        desc = _desc(proto.CommandStatementQuery(query=sql))
        info = client.get_flight_info(desc)
        assert info.schema.names == expected.schema.names
        assert client.get_schema(desc).schema.names == expected.schema.names
    finally:
        client.close()


def test_a_prepared_query_announces_the_schema_after_the_table_changed(cur, port):
    """A statement prepared before ALTER TABLE / CREATE OR REPLACE announces the schema it
    streams now (it announced the one from prepare time and ADBC refused the stream)."""
    cur.execute("CREATE OR REPLACE TABLE stale_t (id BIGINT, s VARCHAR)")
    cur.execute("INSERT INTO stale_t VALUES (1, 'a')")
    cur.adbc_prepare("SELECT * FROM stale_t")
    cur.execute("SELECT * FROM stale_t")
    assert cur.fetchall() == [(1, "a")]
    client = flight.connect(f"grpc://127.0.0.1:{port}")
    try:
        handle = _prepare(client, "SELECT * FROM stale_t")
        # another connection changes the table under both prepared statements
        with _connect(port) as other, other.cursor() as c2:
            c2.execute("ALTER TABLE stale_t ADD COLUMN n INTEGER DEFAULT 7")
        cur.execute("SELECT * FROM stale_t")  # ADBC re-executes its prepared statement
        assert cur.fetchall() == [(1, "a", 7)]
        with _connect(port) as third, third.cursor() as c:
            c.execute("CREATE OR REPLACE TABLE stale_t (id VARCHAR, s BIGINT)")
            c.execute("INSERT INTO stale_t VALUES ('x', 5)")
        desc = _desc(proto.CommandPreparedStatementQuery(prepared_statement_handle=handle))
        info = client.get_flight_info(desc)
        table = client.do_get(info.endpoints[0].ticket).read_all()
        assert info.schema.equals(table.schema), (info.schema, table.schema)
        assert client.get_schema(desc).schema.equals(table.schema)
        assert table.to_pylist() == [{"id": "x", "s": 5}]
    finally:
        client.close()


@pytest.mark.parametrize("sql,rows", [
    ("SELECT 'a'::ENUM('a', 'b') AS e", [{"e": "a"}]),
    ("SELECT NULL::ENUM('a', 'b') AS e", [{"e": None}]),
    ("SELECT ['b'::ENUM('a', 'b')] AS l, {'k': 'a'::ENUM('a', 'b')} AS s",
     [{"l": ["b"], "s": {"k": "a"}}]),
    ("SELECT range::VARCHAR::ENUM('0', '1', '2') AS e FROM range(3) ORDER BY range",
     [{"e": "0"}, {"e": "1"}, {"e": "2"}]),
])
def test_enum_results_stream_as_their_values(cur, port, sql, rows):
    """DuckDB exports an ENUM as an Arrow dictionary, which Flight clients refused ("IPC
    stream did not have the expected number of dictionaries"): results carry the values."""
    cur.execute(sql)
    assert cur.fetch_arrow_table().to_pylist() == rows
    client = flight.connect(f"grpc://127.0.0.1:{port}")
    try:
        info = client.get_flight_info(_desc(proto.CommandStatementQuery(query=sql)))
        table = client.do_get(info.endpoints[0].ticket).read_all()
        assert info.schema.equals(table.schema)
        assert table.to_pylist() == rows
    finally:
        client.close()


def test_get_tables_announces_the_types_a_select_streams(tmp_path):
    """GetTables(include_schema) describes each table as ``SELECT *`` streams it, not as it
    is stored: DuckDB reads a stored timestamp[ms]/[s] as [us], a fixed-size list as a list,
    and spells the UTC zone its own way; a BI tool that builds its model from GetTables then
    gets the types it is sent."""
    engine = DuckEngine(Warehouse.open(str(tmp_path / "wh")))
    server, port = start_in_thread(engine)
    client = flight.connect(f"grpc://127.0.0.1:{port}")
    data = pa.table({
        "ms": pa.array([1_700_000_000_000], pa.timestamp("ms")),
        "s_utc": pa.array([1_700_000_000], pa.timestamp("s", tz="UTC")),
        "fsl": pa.array([[1, 2]], pa.list_(pa.int32(), 2)),
        "d": pa.array([19000], pa.date32()),
    })
    engine.warehouse.create_table("typed_meta", data.schema).append(data)
    try:
        msg = proto.CommandGetTables(table_name_filter_pattern="typed_meta",
                                     include_schema=True)
        (row,) = client.do_get(client.get_flight_info(_desc(msg)).endpoints[0].ticket) \
            .read_all().to_pylist()
        info = client.get_flight_info(_desc(proto.CommandStatementQuery(
            query="SELECT * FROM typed_meta")))
        streamed = client.do_get(info.endpoints[0].ticket).read_all()
    finally:
        client.close()
        server.shutdown()
        engine.close()
    announced = pa.ipc.read_schema(pa.py_buffer(row["table_schema"]))
    assert [(f.name, f.type) for f in announced] == \
        [(f.name, f.type) for f in streamed.schema], (announced, streamed.schema)
    assert streamed.column("d").to_pylist() == data.column("d").to_pylist()


@pytest.fixture(scope="module")
def typed_t(port):
    conn = _connect(port)
    cur = conn.cursor()
    cur.execute("CREATE OR REPLACE TABLE ptypes (s VARCHAR, i INTEGER, d DATE, b BIGINT, "
                "ts TIMESTAMP, f FLOAT, t8 TINYINT)")
    cur.execute("INSERT INTO ptypes (s, i, d) VALUES ('ab', 1, DATE '2024-01-02'), "
                "('b', 2, DATE '2024-01-03'), (NULL, 3, NULL)")
    cur.close()
    conn.close()
    return "ptypes"


@pytest.mark.parametrize("sql,types", [
    ("SELECT count(*) FROM ptypes WHERE s = ?", [pa.string()]),
    ("SELECT count(*) FROM ptypes WHERE s LIKE ?", [pa.string()]),
    ("SELECT count(*) FROM ptypes WHERE s ILIKE ?", [pa.string()]),
    ("SELECT count(*) FROM ptypes WHERE s NOT LIKE ?", [pa.string()]),
    ("SELECT count(*) FROM ptypes WHERE starts_with(s, ?)", [pa.string()]),
    ("SELECT coalesce(s, ?) AS v FROM ptypes", [pa.string()]),
    ("SELECT lower(?) AS v", [pa.string()]),
    ("SELECT i FROM ptypes ORDER BY i LIMIT ? OFFSET ?", [pa.int64(), pa.int64()]),
    ("SELECT CAST(? AS INTEGER) AS v", [pa.int32()]),
    ("SELECT CAST(? AS VARCHAR) AS v", [pa.string()]),
    ("SELECT ?::DATE AS v", [pa.date32()]),
    ("SELECT count(*) FROM ptypes WHERE i BETWEEN ? AND ?", [pa.int32(), pa.int32()]),
    ("SELECT count(*) FROM ptypes WHERE d > ?", [pa.date32()]),
    ("SELECT count(*) FROM ptypes WHERE ? IS NULL OR s = ?", [pa.string(), pa.string()]),
    # DuckDB leaves these untyped (it types them by the value bound): announced VARCHAR
    ("SELECT ? AS v", [pa.string()]),
    ("SELECT ? + 1 AS v, i FROM ptypes WHERE s LIKE ?", [pa.string(), pa.string()]),
    # ... where the text fixes them: a number added to a column, a parameter named after
    # a column
    ("SELECT i + ? AS v FROM ptypes", [pa.int32()]),
    ("SELECT ? AS i", [pa.string()]),
    ("SELECT ? AS i FROM ptypes", [pa.int32()]),
    # writes: the text's types, then DuckDB's over empty tables of the same columns
    ("UPDATE ptypes SET i = i + ? WHERE s LIKE ?", [pa.int32(), pa.string()]),
    ("UPDATE ptypes SET d = ? WHERE i IN (SELECT i FROM ptypes WHERE s = ?)",
     [pa.date32(), pa.string()]),
    ("INSERT INTO ptypes (i, d) SELECT ?, ?", [pa.int32(), pa.date32()]),
    ("MERGE INTO ptypes USING (SELECT ? AS i, ? AS s) src ON ptypes.i = src.i "
     "WHEN MATCHED THEN UPDATE SET s = src.s", [pa.int32(), pa.string()]),
    ("DELETE FROM ptypes WHERE d < ? AND starts_with(s, ?)", [pa.date32(), pa.string()]),
    ("DELETE FROM ptypes WHERE d = CAST(? AS DATE) + 1", [pa.date32()]),
    # a point in time an interval is added to: the column it is compared with, else
    # TIMESTAMP (announced in ms, as the JDBC driver writes them)
    ("SELECT count(*) FROM ptypes WHERE d > ? - INTERVAL 1 DAY", [pa.date32()]),
    ("SELECT ? + INTERVAL 1 DAY AS v", [pa.timestamp("ms")]),
    # a parameter of several occurrences: the type DuckDB widens theirs to, whatever the
    # order (a client narrowing its value to one occurrence's type changes the answer)
    ("SELECT count(*) FROM ptypes WHERE i = $1 OR b = $1", [pa.int64()]),
    ("SELECT count(*) FROM ptypes WHERE b = $1 OR i = $1", [pa.int64()]),
    ("SELECT count(*) FROM ptypes WHERE d = $1 OR ts = $1", [pa.timestamp("ms")]),
    ("SELECT count(*) FROM ptypes WHERE ts = $1 OR d = $1", [pa.timestamp("ms")]),
    ("SELECT count(*) FROM ptypes WHERE f = $1 OR b = $1", [pa.float32()]),  # coalesce's
    ("SELECT count(*) FROM ptypes WHERE i = $1 OR s = $1", [pa.string()]),
    # ... and one that does not mix leaves the others typed
    ("SELECT i FROM ptypes WHERE i = $1 OR s = $1 LIMIT $2 OFFSET $3",
     [pa.string(), pa.int64(), pa.int64()]),
    ("DELETE FROM ptypes WHERE i IN (SELECT i FROM ptypes WHERE t8 = $1) OR b = $1",
     [pa.int64()]),
    ("DELETE FROM ptypes WHERE b = $1 OR t8 = $1", [pa.int64()]),
    ("INSERT INTO ptypes (t8, b) VALUES ($1, $1)", [pa.int64()]),
])
def test_parameter_types_are_duckdbs(cur, typed_t, sql, types):
    """The prepared statement's parameter schema holds the types DuckDB binds each
    parameter to from its context (never Arrow null, which a typed client cannot bind)."""
    schema = cur.adbc_prepare(sql)
    assert schema.types == types, schema


@pytest.mark.parametrize("sql,params,rows", [
    ("SELECT count(*) AS n FROM ptypes WHERE s LIKE ?", ["b%"], [{"n": 1}]),
    ("SELECT count(*) AS n FROM ptypes WHERE s ILIKE ?", ["A%"], [{"n": 1}]),
    ("SELECT count(*) AS n FROM ptypes WHERE s NOT LIKE ?", ["b%"], [{"n": 1}]),
    ("SELECT i FROM ptypes ORDER BY i LIMIT ? OFFSET ?", [1, 1], [{"i": 2}]),
    ("SELECT CAST(? AS INTEGER) AS v", ["7"], [{"v": 7}]),
    ("SELECT ?::DATE AS v", ["2024-01-02"], [{"v": __import__("datetime").date(2024, 1, 2)}]),
    ("SELECT count(*) AS n FROM ptypes WHERE d > ?", ["2024-01-02"], [{"n": 1}]),
    ("SELECT ? AS v", [1], [{"v": 1}]),
    # DuckDB types these only from the value (with every parameter NULL it cannot choose
    # the function): they prepare and run with the values sent
    ("SELECT count(*) AS n FROM ptypes WHERE d > ? - INTERVAL 1 DAY",
     [__import__("datetime").date(2024, 1, 3)], [{"n": 1}]),
    ("SELECT date_part('year', ?) AS y", [__import__("datetime").date(2020, 1, 3)],
     [{"y": 2020}]),
    ("SELECT x FROM unnest(?) AS u(x)", [[1, 2]], [{"x": 1}, {"x": 2}]),
])
def test_parameters_typed_by_duckdb_run_with_the_values_sent(cur, typed_t, sql, params, rows):
    cur.execute(sql, parameters=params)
    assert cur.fetch_arrow_table().to_pylist() == rows
