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


SQLALCHEMY_CLIENT = textwrap.dedent(
    """
    import json, sys, warnings
    warnings.simplefilter("ignore")
    import sqlalchemy as sa
    import flightsql.sqlalchemy  # registers datafusion+flightsql
    engine = sa.create_engine(f"datafusion+flightsql://127.0.0.1:{sys.argv[1]}"
                           "?insecure=true&feature-sqlalchemy-prepared-statements=on")
    out = {}
    with engine.connect() as c:
        insp = sa.inspect(c)
        out["tables"] = sorted(insp.get_table_names())
        out["schemas"] = insp.get_schema_names()
        out["columns"] = [(col["name"], type(col["type"]).__name__, col["nullable"])
                          for col in insp.get_columns("sa_people")]
        out["has"] = [insp.has_table("sa_people"), insp.has_table("nope")]
        people = sa.Table("sa_people", sa.MetaData(), autoload_with=c)
        q = sa.select(people.c.name).where(people.c.id >= 2).order_by(people.c.id)
        out["core"] = [r[0] for r in c.execute(q)]
        out["bound"] = c.execute(sa.text("SELECT name FROM sa_people WHERE id = :i"),
                                 {"i": 3}).fetchall()[0][0]
        out["count"] = c.execute(sa.select(sa.func.count()).select_from(people)).scalar()
        c.execute(sa.text("DELETE FROM sa_people WHERE name = 'bo'"))
        out["after_delete"] = c.execute(sa.select(sa.func.count()).select_from(people)).scalar()
    print(json.dumps(out))
    """
)


@pytest.fixture
def product_server(tmp_path):
    """The server over the product engine (a local warehouse), as `flightsrv serve` runs."""
    from flightsrv import Warehouse
    from flightsrv.engine import DuckEngine
    from flightsrv.server import start_in_thread

    engine = DuckEngine(Warehouse.open(str(tmp_path / "wh")))
    srv, port = start_in_thread(engine)
    yield port
    srv.shutdown()
    engine.close()


@pytest.mark.filterwarnings("ignore:Cannot disable autocommit")
def test_sqlalchemy_dialect(product_server):
    """flightsql-dbapi's SQLAlchemy dialect against the product engine: reflection (tables,
    schemas, columns with types and nullability), Core selects, bound text (with the
    dialect's prepared-statement feature on: its literal-binding compiler renders binds as
    NULL under SQLAlchemy 1.4), and a DELETE that really deletes."""
    pytest.importorskip("sqlalchemy")
    from adbc_driver_flightsql import dbapi

    port = product_server
    with dbapi.connect(f"grpc://127.0.0.1:{port}") as conn, conn.cursor() as cur:
        cur.execute("CREATE TABLE sa_people (id BIGINT NOT NULL, name VARCHAR, score DOUBLE)")
        cur.execute("INSERT INTO sa_people VALUES (1, 'ann', 1.5), (2, 'bo', NULL), "
                    "(3, 'cy', 2.5)")
    proc = subprocess.run([sys.executable, "-c", SQLALCHEMY_CLIENT, str(port)],
                          check=False, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert "sa_people" in out["tables"] and out["schemas"] == ["main"]
    assert out["columns"] == [["id", "BIGINT", False], ["name", "TEXT", True],
                              ["score", "FLOAT", True]]
    assert out["has"] == [True, False]
    assert out["core"] == ["bo", "cy"]
    assert out["bound"] == "cy"
    assert out["count"] == 3 and out["after_delete"] == 2
