"""flightsql-dbapi against the server. It registers Arrow's FlightSql protobufs in the
default pool (as does nothing else in our process, but keep it isolated anyway) and needs
pandas, so it runs in a subprocess that prints JSON results."""

import json
import subprocess
import sys
import textwrap

import pytest
from _server_engine import start_test_server

pytest.importorskip("flightsql")
pytest.importorskip("pandas")

CLIENT = textwrap.dedent(
    """
    import json, sys
    from flightsql import FlightSQLClient, connect
    port = int(sys.argv[1])
    client = FlightSQLClient(host="127.0.0.1", port=port, insecure=True)
    out = {}
    conn = connect(client)
    cur = conn.cursor()
    cur.execute("SELECT id, name FROM people ORDER BY id")
    out["rows"] = [list(r) for r in cur.fetchall()]
    out["description"] = [d[0] for d in cur.description]
    cur.execute("SELECT name FROM people WHERE id = ?", [2])
    out["param_rows"] = [list(r) for r in cur.fetchall()]
    out["updated"] = client.execute_update("DELETE FROM people WHERE id = 3")
    cur.execute("SELECT count(*) AS n FROM people")
    out["after_delete"] = cur.fetchall()[0][0]
    def read(info):
        return client.do_get(info.endpoints[0].ticket).read_all()
    out["tables"] = read(client.get_tables(include_schema=True)).column("table_name").to_pylist()
    out["catalogs"] = read(client.get_catalogs()).to_pylist()
    out["schemas"] = read(client.get_db_schemas()).to_pylist()
    out["table_types"] = read(client.get_table_types()).to_pylist()
    from flightsql.client import TableRef
    out["pk_rows"] = read(client.get_primary_keys(TableRef(table="people"))).num_rows
    out["xdbc_rows"] = read(client.get_xdbc_type_info(12)).num_rows
    out["sql_info_rows"] = read(client.get_sql_info([0, 1, 504])).num_rows
    try:
        cur.execute("SELECT * FROM nope")
        out["error"] = None
    except Exception as exc:
        out["error"] = type(exc).__name__ + ": " + str(exc)
    cur.execute("SELECT 1 AS one")
    out["after_error"] = cur.fetchall()[0][0]
    print(json.dumps(out))
    """
)


@pytest.fixture(scope="module")
def server():
    srv, _engine, uri = start_test_server()
    from adbc_driver_flightsql import dbapi

    with dbapi.connect(uri) as conn, conn.cursor() as cur:
        cur.execute("CREATE TABLE people AS SELECT * FROM (VALUES (1, 'ann'), (2, 'bo'), "
                    "(3, 'cy')) t(id, name)")  # fmt: skip
    yield srv
    srv.shutdown()


@pytest.mark.filterwarnings("ignore:Cannot disable autocommit")
def test_flightsql_dbapi_client(server):
    proc = subprocess.run([sys.executable, "-c", CLIENT, str(server.port)],
                          check=False, capture_output=True, text=True, timeout=120)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["rows"] == [[1, "ann"], [2, "bo"], [3, "cy"]]
    assert out["description"] == ["id", "name"]
    assert out["param_rows"] == [["bo"]]
    assert out["updated"] == 1
    assert out["after_delete"] == 2
    assert "people" in out["tables"]
    assert out["catalogs"] == [{"catalog_name": "flightsrv"}]
    assert out["schemas"] == [{"catalog_name": "flightsrv", "db_schema_name": "main"}]
    assert out["table_types"] == [{"table_type": "TABLE"}]
    assert out["pk_rows"] == 0 and out["xdbc_rows"] == 1 and out["sql_info_rows"] == 3
    assert out["error"] and "nope" in out["error"]
    assert out["after_error"] == 1
