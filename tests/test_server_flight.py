"""The Flight SQL server through raw pyarrow.flight: every command, action and error path."""

import threading

import pyarrow as pa
import pytest
from _server_engine import start_test_server
from pyarrow import flight

from flightsrv.server import metadata as md
from flightsrv.server import proto


@pytest.fixture(scope="module")
def server():
    srv, engine, uri = start_test_server()
    client = flight.connect(uri)
    _update(client, "CREATE TABLE items AS SELECT range AS id, range * 2 AS v FROM range(100)")
    yield srv, engine, client
    client.close()
    srv.shutdown()


@pytest.fixture
def client(server):
    return server[2]


def _desc(msg):
    return flight.FlightDescriptor.for_command(proto.pack(msg))


def _fetch(client, msg) -> tuple[flight.FlightInfo, pa.Table]:
    info = client.get_flight_info(_desc(msg))
    tables = [client.do_get(ep.ticket).read_all() for ep in info.endpoints]
    return info, pa.concat_tables(tables) if tables else None


def _update(client, sql) -> int:
    writer, reader = client.do_put(_desc(proto.CommandStatementUpdate(query=sql)), pa.schema([]))
    writer.done_writing()
    buf = reader.read()
    writer.close()
    return proto.parse(proto.DoPutUpdateResult, buf.to_pybytes()).record_count


def _action(client, kind, body=b""):
    return [r.body.to_pybytes() for r in client.do_action(flight.Action(kind, body))]


def test_statement_query(client):
    info, table = _fetch(client, proto.CommandStatementQuery(query="SELECT sum(v) AS s FROM items"))
    assert info.schema.names == ["s"]
    assert info.total_records == -1
    assert table.column("s").to_pylist() == [9900]


def test_ticket_of_another_server_is_unauthenticated(server):
    """Tickets are signed by a per-server key: another server refuses them."""
    _, _, client = server
    info = client.get_flight_info(_desc(proto.CommandStatementQuery(query="SELECT 7 AS x")))
    other, _, uri = start_test_server()
    try:
        with flight.connect(uri) as c2, pytest.raises(flight.FlightUnauthenticatedError,
                                                      match="signature"):
            c2.do_get(info.endpoints[0].ticket).read_all()
        assert client.do_get(info.endpoints[0].ticket).read_all().to_pylist() == [{"x": 7}]
    finally:
        other.shutdown()


def test_statement_update_and_dml_through_query(client):
    _update(client, "CREATE TABLE upd AS SELECT range AS id FROM range(10)")
    assert _update(client, "DELETE FROM upd WHERE id < 3") == 3
    info, table = _fetch(client, proto.CommandStatementQuery(query="DELETE FROM upd WHERE id < 5"))
    assert info.total_records == 2
    assert table.num_rows == 0


def test_prepared_statement_lifecycle(client):
    (raw,) = _action(client, "CreatePreparedStatement",
                     proto.pack(proto.ActionCreatePreparedStatementRequest(
                         query="SELECT id FROM items WHERE id < ? ORDER BY id")))  # fmt: skip
    result = proto.unpack(raw)
    handle = result.prepared_statement_handle
    assert pa.ipc.read_schema(pa.py_buffer(result.dataset_schema)).names == ["id"]
    assert len(pa.ipc.read_schema(pa.py_buffer(result.parameter_schema))) == 1
    cmd = proto.CommandPreparedStatementQuery(prepared_statement_handle=handle)
    params = pa.record_batch({"0": pa.array([3], pa.int64())})
    writer, _ = client.do_put(_desc(cmd), params.schema)
    writer.write_batch(params)
    writer.close()
    schema = client.get_schema(_desc(cmd)).schema
    assert schema.names == ["id"]
    _, table = _fetch(client, cmd)
    assert table.column("id").to_pylist() == [0, 1, 2]
    assert _action(client, "ClosePreparedStatement", proto.pack(
        proto.ActionClosePreparedStatementRequest(prepared_statement_handle=handle))) == []
    with pytest.raises(pa.ArrowKeyError, match="prepared statement"):
        client.get_flight_info(_desc(cmd))


def test_prepared_update_with_many_parameter_rows(client):
    _update(client, "CREATE TABLE pu (id BIGINT)")
    (raw,) = _action(client, "CreatePreparedStatement", proto.pack(
        proto.ActionCreatePreparedStatementRequest(query="INSERT INTO pu VALUES (?)")))
    handle = proto.unpack(raw).prepared_statement_handle
    cmd = proto.CommandPreparedStatementUpdate(prepared_statement_handle=handle)
    params = pa.record_batch({"0": pa.array(range(7), pa.int64())})
    writer, reader = client.do_put(_desc(cmd), params.schema)
    writer.write_batch(params)
    writer.done_writing()
    count = proto.parse(proto.DoPutUpdateResult, reader.read().to_pybytes()).record_count
    writer.close()
    assert count == 7


def test_sql_info_all_and_subset(client):
    _, table = _fetch(client, proto.CommandGetSqlInfo())
    assert table.schema.equals(md.SQL_INFO_SCHEMA)
    keys = set(table.column("info_name").to_pylist())
    assert {0, 1, 2, 3, 8, 504, 508, 563} <= keys
    _, table = _fetch(client, proto.CommandGetSqlInfo(info=[0, 3, 504, 99999]))
    assert {r["info_name"]: r["value"] for r in table.to_pylist()} == {
        0: "flightsrv", 3: False, 504: '"'}


@pytest.mark.parametrize(
    "msg, schema, rows",
    [
        (proto.CommandGetCatalogs(), md.CATALOGS_SCHEMA, 1),
        (proto.CommandGetDbSchemas(), md.DB_SCHEMAS_SCHEMA, 1),
        (proto.CommandGetDbSchemas(catalog="other"), md.DB_SCHEMAS_SCHEMA, 0),
        (proto.CommandGetDbSchemas(catalog="flightsrv"), md.DB_SCHEMAS_SCHEMA, 1),
        # an empty catalog asks for objects without one: there are none
        (proto.CommandGetDbSchemas(catalog=""), md.DB_SCHEMAS_SCHEMA, 0),
        (proto.CommandGetTables(catalog=""), md.TABLES_SCHEMA, 0),
        (proto.CommandGetTables(catalog="flightsrv", table_name_filter_pattern="items"),
         md.TABLES_SCHEMA, 1),
        (proto.CommandGetTableTypes(), md.TABLE_TYPES_SCHEMA, 1),
        (proto.CommandGetPrimaryKeys(table="items"), md.PRIMARY_KEYS_SCHEMA, 0),
        (proto.CommandGetExportedKeys(table="items"), md.FOREIGN_KEYS_SCHEMA, 0),
        (proto.CommandGetImportedKeys(table="items"), md.FOREIGN_KEYS_SCHEMA, 0),
        (proto.CommandGetCrossReference(pk_table="a", fk_table="b"), md.FOREIGN_KEYS_SCHEMA, 0),
        (proto.CommandGetXdbcTypeInfo(), md.XDBC_TYPE_INFO_SCHEMA, 22),
        (proto.CommandGetXdbcTypeInfo(data_type=4), md.XDBC_TYPE_INFO_SCHEMA, 2),
    ],
)
def test_metadata_commands(client, msg, schema, rows):
    info, table = _fetch(client, msg)
    assert info.schema.equals(schema)
    assert table.schema.equals(schema)
    assert table.num_rows == rows
    assert client.get_schema(_desc(msg)).schema.equals(schema)


def test_get_tables_filters_and_schema(client):
    msg = proto.CommandGetTables(table_name_filter_pattern="ite%", include_schema=True)
    info, table = _fetch(client, msg)
    assert info.schema.equals(md.TABLES_SCHEMA_WITH_SCHEMA)
    (row,) = table.to_pylist()
    assert (row["catalog_name"], row["db_schema_name"], row["table_name"]) == (
        "flightsrv", "main", "items")
    schema = pa.ipc.read_schema(pa.py_buffer(row["table_schema"]))
    assert schema.names == ["id", "v"]
    assert schema.field("id").metadata[b"ARROW:FLIGHT:SQL:TYPE_NAME"] == b"BIGINT"
    _, table = _fetch(client, proto.CommandGetTables(table_types=["VIEW"]))
    assert table.num_rows == 0
    _, table = _fetch(client, proto.CommandGetTables(db_schema_filter_pattern="other"))
    assert table.num_rows == 0
    _, table = _fetch(client, proto.CommandGetTables())
    assert table.schema.equals(md.TABLES_SCHEMA) and "items" in table.column(2).to_pylist()


def _ingest(client, cmd, data: pa.RecordBatch) -> int:
    """DoPut of ``data`` under ingest command ``cmd``: the record count answered."""
    writer, reader = client.do_put(_desc(cmd), data.schema)
    writer.write_batch(data)
    writer.done_writing()
    count = proto.parse(proto.DoPutUpdateResult, reader.read().to_pybytes()).record_count
    writer.close()
    return count


def test_ingest_via_raw_doput(client):
    cmd = proto.CommandStatementIngest(table="raw_ing")
    cmd.table_definition_options.if_not_exist = proto.TableNotExistOption.CREATE
    cmd.table_definition_options.if_exists = proto.TableExistsOption.FAIL
    data = pa.record_batch({"a": [1, 2]})
    assert _ingest(client, cmd, data) == 2
    bad = proto.CommandStatementIngest(table="raw_ing2")  # options left UNSPECIFIED
    writer, _ = client.do_put(_desc(bad), data.schema)
    with pytest.raises(pa.ArrowInvalid, match="table_definition_options"):
        writer.write_batch(data)
        writer.close()


def test_catalog_and_schema_names_match_in_any_case(client):
    """As in SQL (``FLIGHTSRV.MAIN.items``): ingest and the metadata filters take the one
    catalog and schema in any case; another name is still refused or matches nothing."""
    cmd = proto.CommandStatementIngest(table="cased_ing", catalog="FLIGHTSRV", schema="Main")
    cmd.table_definition_options.if_not_exist = proto.TableNotExistOption.CREATE
    cmd.table_definition_options.if_exists = proto.TableExistsOption.APPEND
    data = pa.record_batch({"a": [1, 2]})
    assert _ingest(client, cmd, data) == 2
    cmd.schema = "other"
    writer, _ = client.do_put(_desc(cmd), data.schema)
    with pytest.raises(pa.ArrowInvalid, match="unknown schema"):
        writer.write_batch(data)
        writer.close()
    _, table = _fetch(client, proto.CommandGetDbSchemas(catalog="FlightSrv",
                                                        db_schema_filter_pattern="MA%"))
    assert table.to_pylist() == [{"catalog_name": "flightsrv", "db_schema_name": "main"}]
    _, table = _fetch(client, proto.CommandGetTables(catalog="FLIGHTSRV",
                                                     db_schema_filter_pattern="MAIN"))
    assert {"items", "cased_ing"} <= set(table.column("table_name").to_pylist())
    _, table = _fetch(client, proto.CommandGetTables(catalog="flightsrv2"))
    assert table.num_rows == 0


def test_statement_update_with_rows_is_refused_before_it_runs(client):
    """CommandStatementUpdate carries no data: rows sent with it would be ignored (or read
    as unbound parameters), so the request is refused and the statement does not run."""
    _update(client, "CREATE TABLE no_rows (a BIGINT)")
    data = pa.record_batch({"a": [5, 6, 7]})
    for sql in ("INSERT INTO no_rows VALUES (?)", "INSERT INTO no_rows VALUES (1)"):
        writer, _ = client.do_put(_desc(proto.CommandStatementUpdate(query=sql)), data.schema)
        with pytest.raises(pa.ArrowInvalid, match="takes no parameters.*CreatePrepared"):
            writer.write_batch(data)
            writer.done_writing()
            writer.close()
    _, table = _fetch(client, proto.CommandStatementQuery(
        query="SELECT count(*) AS n FROM no_rows"))  # fmt: skip
    assert table.to_pylist() == [{"n": 0}]
    cmd = proto.CommandStatementIngest(table="no_rows", transaction_id=b"t")
    cmd.table_definition_options.if_not_exist = proto.TableNotExistOption.FAIL
    cmd.table_definition_options.if_exists = proto.TableExistsOption.APPEND
    writer, _ = client.do_put(_desc(cmd), data.schema)
    with pytest.raises(pa.ArrowNotImplementedError, match="transactions"):
        writer.write_batch(data)
        writer.close()


def test_cancel_flight_info_before_doget(client):
    info = client.get_flight_info(_desc(proto.CommandStatementQuery(query="SELECT 1 AS one")))
    req = proto.CancelFlightInfoRequest(info=info.serialize())
    (raw,) = _action(client, "CancelFlightInfo", req.SerializeToString())
    assert proto.parse(proto.CancelFlightInfoResult, raw).status == proto.CancelStatus.CANCELLED
    with pytest.raises(flight.FlightCancelledError):
        client.do_get(info.endpoints[0].ticket).read_all()


def test_cancel_flight_info_stops_a_running_stream(client):
    info = client.get_flight_info(_desc(proto.CommandStatementQuery(
        query="SELECT range AS i FROM range(5000000)")))  # fmt: skip
    reader = client.do_get(info.endpoints[0].ticket)
    first = reader.read_chunk()
    assert first.data.num_rows > 0
    req = proto.CancelFlightInfoRequest(info=info.serialize())
    _action(client, "CancelFlightInfo", req.SerializeToString())
    rows = first.data.num_rows
    # read_chunk, not read_all: pyarrow's read_all turns a CANCELLED status into a
    # KeyboardInterrupt in the main thread (its signal-handling wrapper)
    with pytest.raises(flight.FlightCancelledError, match="cancelled"):
        while True:
            rows += reader.read_chunk().data.num_rows
    assert rows < 5_000_000


def test_close_session_and_list_actions(client):
    (raw,) = _action(client, "CloseSession", proto.CloseSessionRequest().SerializeToString())
    assert proto.parse(proto.CloseSessionResult, raw).status == proto.CloseSessionStatus.CLOSED
    kinds = {a.type for a in client.list_actions()}
    assert {"CreatePreparedStatement", "ClosePreparedStatement", "CancelFlightInfo",
            "CloseSession"} <= kinds  # fmt: skip


@pytest.mark.parametrize(
    "call, exc, match",
    [
        (lambda c: c.get_flight_info(flight.FlightDescriptor.for_path("x")),
         pa.ArrowInvalid, "command descriptors"),
        (lambda c: c.get_flight_info(flight.FlightDescriptor.for_command(b"junk")),
         pa.ArrowInvalid, "protobuf|type_url|Flight SQL"),
        (lambda c: c.do_get(flight.Ticket(b"junk")).read_all(), pa.ArrowInvalid,
         "protobuf|type_url|Flight SQL"),
        (lambda c: c.do_get(flight.Ticket(proto.pack(proto.TicketStatementQuery(
            statement_handle=b"forged")))).read_all(), pa.ArrowInvalid, "not issued"),
        (lambda c: c.get_flight_info(_desc(proto.CommandStatementQuery(
            query="SELECT 1", transaction_id=b"t"))), pa.ArrowNotImplementedError,
         "transactions"),
        (lambda c: list(c.do_action(flight.Action("BeginTransaction", b""))),
         pa.ArrowNotImplementedError, "transactions"),
        (lambda c: c.get_flight_info(_desc(proto.CommandStatementUpdate(query="SELECT 1"))),
         pa.ArrowInvalid, "DoPut"),
        (lambda c: c.get_flight_info(_desc(proto.CommandStatementQuery(
            query="SELECT * FROM nope_tbl"))), pa.ArrowKeyError, "nope_tbl"),
    ],
)  # fmt: skip
def test_bad_requests_map_to_status_codes(client, call, exc, match):
    with pytest.raises(exc, match=match):
        call(client)
    _, table = _fetch(client, proto.CommandStatementQuery(query="SELECT 1 AS ok"))
    assert table.to_pylist() == [{"ok": 1}]  # still serving


def test_concurrent_clients(server):
    _, _, client = server
    errors = []

    def work():
        try:
            for _ in range(10):
                _, t = _fetch(client, proto.CommandStatementQuery(
                    query="SELECT count(*) AS n FROM items"))
                assert t.column("n").to_pylist() == [100]
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=work) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors


def test_error_while_streaming_is_invalid_argument(client):
    q = "SELECT CASE WHEN range > 50000 THEN error('boom') ELSE range END AS x FROM range(100000)"
    info = client.get_flight_info(_desc(proto.CommandStatementQuery(query=q)))
    with pytest.raises(pa.ArrowInvalid, match="boom"):
        client.do_get(info.endpoints[0].ticket).read_all()
    _, table = _fetch(client, proto.CommandStatementQuery(query="SELECT 2 AS two"))
    assert table.to_pylist() == [{"two": 2}]


#: DuckDB column type -> (the GetXdbcTypeInfo row its TYPE_NAME names, its java.sql.Types
#: code): REAL for the 4-byte FLOAT, TIMESTAMP_WITH_TIMEZONE, and the nested types as the
#: Flight SQL JDBC driver types them (ARRAY; JAVA_OBJECT for STRUCT, MAP and INTERVAL)
XDBC_COLUMNS = {
    "BOOLEAN": ("BOOLEAN", 16), "TINYINT": ("TINYINT", -6), "SMALLINT": ("SMALLINT", 5),
    "INTEGER": ("INTEGER", 4), "BIGINT": ("BIGINT", -5), "UTINYINT": ("UTINYINT", -6),
    "USMALLINT": ("USMALLINT", 5), "UINTEGER": ("UINTEGER", 4), "UBIGINT": ("UBIGINT", -5),
    "REAL": ("FLOAT", 7), "DOUBLE": ("DOUBLE", 8), "DECIMAL(10,2)": ("DECIMAL", 3),
    "VARCHAR": ("VARCHAR", 12), "BLOB": ("BLOB", -3), "DATE": ("DATE", 91),
    "TIME": ("TIME", 92), "TIMESTAMP": ("TIMESTAMP", 93),
    "TIMESTAMPTZ": ("TIMESTAMP WITH TIME ZONE", 2014), "INTERVAL": ("INTERVAL", 2000),
    "INTEGER[]": ("LIST", 2003), "STRUCT(x INTEGER)": ("STRUCT", 2000),
    "MAP(VARCHAR, INTEGER)": ("MAP", 2000),
}  # fmt: skip


def test_xdbc_type_info_has_a_row_with_the_jdbc_code_for_every_column_type(client):
    cols = ", ".join(f"c{i} {t}" for i, t in enumerate(XDBC_COLUMNS))
    _update(client, f"CREATE TABLE xdbc_types ({cols})")
    _, tables = _fetch(client, proto.CommandGetTables(table_name_filter_pattern="xdbc_types",
                                                      include_schema=True))
    schema = pa.ipc.read_schema(pa.py_buffer(tables.column("table_schema")[0].as_py()))
    _, info = _fetch(client, proto.CommandGetXdbcTypeInfo())
    rows = {r["type_name"]: r for r in info.to_pylist()}
    for field, (sql_type, (name, code)) in zip(schema, XDBC_COLUMNS.items(), strict=True):
        announced = field.metadata[b"ARROW:FLIGHT:SQL:TYPE_NAME"].decode()
        assert announced.split("(")[0] == name, (sql_type, announced)
        assert rows[name]["data_type"] == code, (sql_type, rows[name])
    assert schema.field("c11").metadata[b"ARROW:FLIGHT:SQL:TYPE_NAME"] == b"DECIMAL(10,2)"
    assert (rows["DECIMAL"]["column_size"], rows["DECIMAL"]["maximum_scale"]) == (38, 38)
    assert rows["DECIMAL"]["create_params"] == ["precision", "scale"]
    assert rows["TIMESTAMP WITH TIME ZONE"]["datetime_subcode"] == 5  # ..._WITH_TIMEZONE
    assert rows["UBIGINT"]["unsigned_attribute"] is True
    assert rows["BIGINT"]["unsigned_attribute"] is False
    assert set(rows) == {name for name, _ in XDBC_COLUMNS.values()}  # nothing unreachable
    # the data_type filter keeps exactly the rows of that code, in JDBC's order
    assert [r["type_name"] for r in info.to_pylist()] == sorted(
        rows, key=lambda n: (rows[n]["data_type"], n))
    for code in (7, 2014, 2000, 6):
        _, some = _fetch(client, proto.CommandGetXdbcTypeInfo(data_type=code))
        assert some.column("type_name").to_pylist() == sorted(
            n for n, r in rows.items() if r["data_type"] == code)
    _, none = _fetch(client, proto.CommandGetXdbcTypeInfo(data_type=6))  # nothing is FLOAT(6)
    assert none.num_rows == 0


@pytest.mark.parametrize("rows", [1, 100_000, 1_000_000])
def test_small_results_are_read_whole_and_large_ones_stream(client, rows):
    """A result up to ``EAGER_RESULT_BYTES`` is read before DoGet answers, a larger one
    streams from its first batches on: either way every row arrives, in order, and an
    error after the first batches still reaches the client as the statement's error."""
    from flightsrv.server.flight import EAGER_RESULT_BYTES

    assert rows * 8 < EAGER_RESULT_BYTES or rows * 8 > 2 * EAGER_RESULT_BYTES
    _, table = _fetch(client, proto.CommandStatementQuery(
        query=f"SELECT range AS i FROM range({rows}) ORDER BY i"))
    assert table.num_rows == rows
    assert table.column("i").to_pylist()[-3:] == list(range(rows))[-3:]
    info = client.get_flight_info(_desc(proto.CommandStatementQuery(
        query=f"SELECT CASE WHEN range = {rows - 1} THEN error('late') ELSE range END AS x "
              f"FROM range({rows}) ORDER BY range")))
    with pytest.raises(pa.ArrowInvalid, match="late"):
        client.do_get(info.endpoints[0].ticket).read_all()
    _, table = _fetch(client, proto.CommandStatementQuery(query="SELECT 3 AS three"))
    assert table.to_pylist() == [{"three": 3}]
