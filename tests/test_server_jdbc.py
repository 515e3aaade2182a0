"""The Arrow Flight SQL JDBC driver against the server (issue 12 item 4), the way BI tools
(DBeaver, DataGrip, Tableau, Metabase) use it: a small Java program
(tests/jdbc/FlightJdbcCheck.java) compiled and run here with the driver from Maven Central.

The driver jar is fetched once by ``mvn dependency:get`` into the local Maven repository
(``~/.m2``, or ``$FLIGHTSRV_M2_REPO``) and reused by later runs. If Java, Maven or Maven
Central is missing the test fails and says so: it is never skipped silently.
"""

from __future__ import annotations

import datetime as dt
import decimal
import json
import os
import shutil
import signal
import subprocess
from pathlib import Path

import pyarrow as pa
import pytest
from pyarrow import flight

from flightsrv import Warehouse
from flightsrv.engine import DuckEngine
from flightsrv.engine.api import Role
from flightsrv.server.app import start_in_thread
from flightsrv.server.auth import AuthConfig, Principal, hash_password
from flightsrv.server import proto
from flightsrv.server.flight import TlsConfig

JDBC_VERSION = "18.3.0"
ARTIFACT = f"org.apache.arrow:flight-sql-jdbc-driver:{JDBC_VERSION}"
SOURCE = Path(__file__).parent / "jdbc" / "FlightJdbcCheck.java"

# java.sql.Types
BOOLEAN, BIT, TINYINT, SMALLINT, INTEGER, BIGINT = 16, -7, -6, 5, 4, -5
REAL, FLOAT, DOUBLE, DECIMAL, VARCHAR, VARBINARY = 7, 6, 8, 3, 12, -3
DATE, TIME, TIMESTAMP, TIMESTAMP_TZ, ARRAY, STRUCT = 91, 92, 93, 2014, 2003, 2002
JAVA_OBJECT = 2000  # the driver's own choice for an Arrow struct (TYPE_NAME says STRUCT)

#: every Arrow type a table holds, the JDBC type getColumns reports for it (the driver derives
#: DATA_TYPE from the Arrow type alone: SqlTypes.getSqlTypeIdFromArrowType, arrow-java 18.3)
#: and the TYPE_NAME the server announces (ARROW:FLIGHT:SQL:TYPE_NAME)
TYPES = [
    ("b", pa.bool_(), BOOLEAN, "BOOLEAN"),
    ("i8", pa.int8(), TINYINT, "TINYINT"),
    ("i16", pa.int16(), SMALLINT, "SMALLINT"),
    ("i32", pa.int32(), INTEGER, "INTEGER"),
    ("i64", pa.int64(), BIGINT, "BIGINT"),
    ("f32", pa.float32(), FLOAT, "FLOAT"),  # the driver's FLOAT (6), the server's REAL (7)
    ("f64", pa.float64(), DOUBLE, "DOUBLE"),
    ("dec", pa.decimal128(10, 2), DECIMAL, "DECIMAL(10,2)"),
    ("s", pa.string(), VARCHAR, "VARCHAR"),
    ("bin", pa.binary(), VARBINARY, "BLOB"),
    ("d", pa.date32(), DATE, "DATE"),
    ("tm", pa.time64("us"), TIME, "TIME"),
    ("ts", pa.timestamp("us"), TIMESTAMP, "TIMESTAMP"),
    ("tstz", pa.timestamp("us", tz="UTC"), TIMESTAMP_TZ, "TIMESTAMP WITH TIME ZONE"),
    ("lst", pa.list_(pa.int64()), ARRAY, "LIST"),
    ("st", pa.struct([("x", pa.int32()), ("y", pa.string())]), JAVA_OBJECT, "STRUCT"),
]
#: where the driver's getColumns code and the server's GetXdbcTypeInfo code differ, and why:
#: the driver maps every 4-byte float to FLOAT (6), which JDBC defines as double precision
DRIVER_DIFFERS = {"f32": (FLOAT, REAL)}


def _types_table() -> pa.Table:
    rows = {
        "b": [True, False], "i8": [1, 2], "i16": [1, 2], "i32": [1, 2],
        "i64": [10_000_000_000, 20_000_000_000], "f32": [1.5, 2.5], "f64": [1.5, 2.5],
        "dec": [decimal.Decimal("1.25"), decimal.Decimal("2.50")], "s": ["one", "two"],
        "bin": [b"\x01", b"\x02"], "d": [dt.date(2026, 1, 2), dt.date(2026, 1, 3)],
        "tm": [dt.time(10, 0), dt.time(11, 30)],
        "ts": [dt.datetime(2026, 1, 2, 3, 4, 5), dt.datetime(2026, 1, 3, 3, 4, 5)],
        "tstz": [dt.datetime(2026, 1, 2, tzinfo=dt.UTC), dt.datetime(2026, 1, 3, tzinfo=dt.UTC)],
        "lst": [[1, 2], [3]], "st": [{"x": 1, "y": "a"}, {"x": 2, "y": "b"}],
    }
    schema = pa.schema([(name, t) for name, t, _, _ in TYPES])
    return pa.table(rows, schema=schema)


def _m2_repo() -> Path:
    return Path(os.environ.get("FLIGHTSRV_M2_REPO", "~/.m2/repository")).expanduser()


def _driver_jar() -> Path:
    jar = (_m2_repo() / "org/apache/arrow/flight-sql-jdbc-driver" / JDBC_VERSION
           / f"flight-sql-jdbc-driver-{JDBC_VERSION}.jar")
    if jar.exists():
        return jar  # cached by an earlier run: no network
    if not shutil.which("mvn"):
        pytest.fail("the JDBC test needs Maven (`mvn`) to fetch " + ARTIFACT +
                    "; .ci/run installs it (apt-get install maven)")
    cmd = ["mvn", "-q", "-B", "dependency:get", f"-Dartifact={ARTIFACT}", "-Dtransitive=false"]
    if "FLIGHTSRV_M2_REPO" in os.environ:
        cmd.append(f"-Dmaven.repo.local={_m2_repo()}")
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900, check=False)
    if proc.returncode != 0 or not jar.exists():
        tail = (proc.stdout + proc.stderr)[-2000:]
        pytest.fail(f"could not fetch {ARTIFACT} from Maven Central (is it reachable?):\n{tail}")
    return jar


@pytest.fixture(scope="module")
def java_program(tmp_path_factory):
    for tool in ("javac", "java"):
        if not shutil.which(tool):
            pytest.fail(f"the JDBC test needs a JDK (`{tool}`); .ci/run installs "
                        "openjdk-17-jdk-headless")
    jar = _driver_jar()
    out = tmp_path_factory.mktemp("jdbc")
    proc = subprocess.run(["javac", "-cp", str(jar), "-d", str(out), str(SOURCE)],
                          capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr

    def run(url: str, suite: str, **props) -> dict:
        # each check is a short JVM: the C1 compiler alone and the serial collector use a
        # third less CPU than the defaults (41.9 s -> 27.6 s for this file, the suite runs
        # on 2 cores)
        cmd = ["java", "-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC", "-XX:-UsePerfData",
               "--add-opens=java.base/java.nio=ALL-UNNAMED",
               "-cp", f"{out}{os.pathsep}{jar}", "FlightJdbcCheck", url, suite,
               *[f"{k}={v}" for k, v in props.items()]]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=False)
        assert proc.returncode == 0, proc.stderr[-4000:]
        result = {}
        for line in proc.stdout.splitlines():
            if line.startswith("{"):
                item = json.loads(line)
                result[item["k"]] = item["v"]
        return result

    return run


def _self_signed_ca(tmp_path):
    """A CA and a server certificate for localhost/127.0.0.1 signed by it."""
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = dt.datetime.now(dt.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "flightsrv test CA")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name)
          .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
          .not_valid_before(now - dt.timedelta(minutes=1))
          .not_valid_after(now + dt.timedelta(days=1))
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), True)
          .sign(ca_key, hashes.SHA256()))
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")]))
            .issuer_name(ca_name).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=1))
            .not_valid_after(now + dt.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([
                x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                False)
            .sign(ca_key, hashes.SHA256()))
    pem = serialization.Encoding.PEM
    paths = {name: tmp_path / f"{name}.pem" for name in ("ca", "cert", "key")}
    paths["ca"].write_bytes(ca.public_bytes(pem))
    paths["cert"].write_bytes(cert.public_bytes(pem))
    paths["key"].write_bytes(key.private_bytes(pem, serialization.PrivateFormat.PKCS8,
                                               serialization.NoEncryption()))
    return paths


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("jdbc-server")
    wh = Warehouse.open(str(tmp / "wh"))
    wh.create_table("types", _types_table().schema).append(_types_table())
    t = wh.create_table("t", pa.schema([("id", pa.int64()), ("v", pa.string())]))
    t.append(pa.table({"id": pa.array(range(20), pa.int64()), "v": [f"v{i}" for i in range(20)]}))
    users = tmp / "users"
    users.write_text(f"ann:{hash_password('ann-pw', iterations=1000)}:writer\n"
                     f"bob:{hash_password('bob-pw', iterations=1000)}:reader\n")
    auth = AuthConfig.from_users_file(users, tokens={"jdbc-token": Principal("bi", Role.READER)})
    engine = DuckEngine(wh)
    plain, port = start_in_thread(engine, auth=auth)
    certs = _self_signed_ca(tmp)
    trust = tmp / "trust.jks"
    subprocess.run(["keytool", "-importcert", "-noprompt", "-alias", "flightsrv-ca", "-file",
                    str(certs["ca"]), "-keystore", str(trust), "-storepass", "changeit",
                    "-storetype", "JKS"], check=True, capture_output=True, timeout=120)
    tls, tls_port = start_in_thread(engine, auth=auth,
                                    tls=TlsConfig(str(certs["cert"]), str(certs["key"])))
    yield {"plain": port, "tls": tls_port, "trust": trust, "wh": wh, "wh_path": str(tmp / "wh")}
    plain.shutdown()
    tls.shutdown()
    engine.close()


def _url(port: int, **params) -> str:
    params.setdefault("useEncryption", "false")
    return f"jdbc:arrow-flight-sql://localhost:{port}/?" + "&".join(
        f"{k}={v}" for k, v in params.items())


def test_database_metadata(java_program, servers):
    got = java_program(_url(servers["plain"], user="bob", password="bob-pw"), "metadata")
    assert got["catalogs"] == [["flightsrv"]]
    assert ["main", "flightsrv"] in got["schemas"]
    assert sorted(r[2] for r in got["tables"]) == ["t", "types"]
    assert all(r[0] == "flightsrv" and r[1] == "main" and r[3] == "TABLE"
               for r in got["tables"])
    assert got["tables_view"] == []
    assert got["tables_pattern"] == [["types"]]
    # a table name in any case finds the table, as in SQL (the server folds it to lower case)
    assert got["tables_upper"] == [["types"]] and got["tables_upper_pattern"] == [["types"]]
    assert got["columns_upper"] == [["i32"]]
    assert got["table_types"] == [["TABLE"]]
    columns = {row[0]: row[1:] for row in got["columns"]}
    assert list(columns) == [name for name, _, _, _ in TYPES]
    for position, (name, arrow_type, jdbc_type, type_name) in enumerate(TYPES, start=1):
        assert columns[name][:3] == [jdbc_type, type_name, position], (name, arrow_type)
    assert columns["dec"][3:] == [10, 2]  # COLUMN_SIZE, DECIMAL_DIGITS from PRECISION/SCALE
    # driver 18.3 does not implement getTypeInfo (Avatica's empty default; it never calls
    # the server): it must not fail. What the server answers is checked below.
    assert got["type_info"] == []
    assert got["primary_keys"] == [] and got["imported_keys"] == []
    assert got["exported_keys"] == []
    assert got["read_only"] is True  # bob is a reader
    assert got["transactions"] is False and got["quote"] == '"'
    # DuckDB runs FULL OUTER JOIN: the driver reads item 528 as a bitmask of levels
    assert got["outer_joins"] == [True, True, True]
    assert got["default_isolation"] == 0  # TRANSACTION_NONE (the driver reads an int64)
    assert got["properties_failed"] == [], got["properties_failed"]


def test_type_info_agrees_with_get_columns(java_program, servers):
    """For every column type, GetXdbcTypeInfo (what getTypeInfo would read) has a row named
    by the column's TYPE_NAME whose code is the one the driver reports in getColumns, except
    the driver's own FLOAT for a 4-byte float, where the server says REAL per the JDBC spec."""
    got = java_program(_url(servers["plain"], user="bob", password="bob-pw"), "metadata")
    client = flight.connect(f"grpc://127.0.0.1:{servers['plain']}")
    bearer = client.authenticate_basic_token("bob", "bob-pw")
    options = flight.FlightCallOptions(headers=[bearer])
    desc = flight.FlightDescriptor.for_command(proto.pack(proto.CommandGetXdbcTypeInfo()))
    info = client.get_flight_info(desc, options)
    rows = client.do_get(info.endpoints[0].ticket, options).read_all().to_pylist()
    codes = {r["type_name"]: r["data_type"] for r in rows}
    for name, jdbc_type, type_name, *_ in got["columns"]:
        expected = DRIVER_DIFFERS.get(name, (jdbc_type, jdbc_type))[1]
        assert codes[type_name.split("(")[0]] == expected, (name, type_name, jdbc_type)
    assert codes["FLOAT"] == REAL and codes["TIMESTAMP WITH TIME ZONE"] == TIMESTAMP_TZ
    client.close()


def test_statement_execute_query(java_program, servers):
    got = java_program(_url(servers["plain"], token="jdbc-token"), "query")
    assert got["count"] == 20 and got["sum"] == sum(range(20))
    rows = got["rows"]
    names = [name for name, _, _, _ in TYPES]
    first = dict(zip(names, rows[0]))
    assert (first["b"], first["i32"], first["i64"], first["s"]) == (
        "true", "1", "10000000000", "one")
    assert first["dec"] == "1.25" and first["d"] == "2026-01-02"
    assert first["lst"] == "[1,2]" and first["tm"] == "10:00:00"
    # driver 18.3: getObject on TIMESTAMP WITH TIME ZONE is "not implemented"; getString
    # (and getTimestamp) work (docs/SERVER.md)
    assert first["tstz"].endswith("getString: 2026-01-02 00:00:00.0")
    # the workarounds docs/SERVER.md names: getObject with a class, getTimestamp
    assert got["tstz_offset"] == "2026-01-02T00:00Z"
    assert got["tstz_instant"] == "2026-01-02T00:00:00Z"
    assert got["tstz_millis"] == int(dt.datetime(2026, 1, 2, tzinfo=dt.UTC).timestamp() * 1000)
    assert first["ts"].startswith("2026-01-02") and "03:04:05" in first["ts"]
    assert len(rows) == 2


def test_prepared_statement_parameters_of_each_basic_type(java_program, servers):
    got = java_program(_url(servers["plain"], user="bob", password="bob-pw"), "prepared")
    assert got["prepared_count"] == 1
    assert got["prepared_count_2"] == 1
    assert got["prepared_string"] == "two"


def test_parameters_typed_by_their_context(java_program, servers):
    """A parameter whose type only its context gives (LIKE, LIMIT, CAST, a function's
    argument) is announced with the type DuckDB binds it to, so the driver can bind a value
    (a null-typed one takes only NULL: "Can't set non-null value on NullVector"); one
    DuckDB leaves untyped is announced VARCHAR (docs/SERVER.md, "Parameters")."""
    got = java_program(_url(servers["plain"], user="bob", password="bob-pw"), "context_params")
    assert got["like"] == [1] and got["ilike"] == [1] and got["not_like"] == [1], got
    assert got["starts_with"] == [1], got
    assert got["limit_offset"] == [2] and got["limit_int"] == [1], got
    assert got["cast_varchar"] == ["x"] and got["cast_integer"] == [7], got
    assert got["cast_date"] == ["2026-01-02"], got
    assert got["lower"] == ["ab"] and got["coalesce"] == ["none", "two"], got
    assert got["untyped"] == ["hi"] and got["untyped_null"] == [None], got
    # DuckDB cannot type ``? - INTERVAL 1 DAY`` with the parameter NULL: it prepares
    # (the result described once the value is bound) and the timestamp binds
    assert got["minus_interval"] == [1], got


def test_prepared_writes_bind_the_columns_java_types(java_program, servers):
    """A prepared write's parameters that DuckDB leaves untyped are announced with the type
    of the column they go to (added to ``amount``, a MERGE source's ``? AS id``, ``INSERT ...
    SELECT ?, ?``), so setDouble/setInt/setBigDecimal bind (announced VARCHAR they failed in
    the driver: only setString binds to a string vector)."""
    got = java_program(_url(servers["plain"], user="ann", password="ann-pw"), "dml_params")
    assert got["add"] == 1, got
    assert got["merge_insert"] == 1 and got["merge_update"] == 1, got
    assert got["insert_select"] == 1, got
    assert got["rows"] == [[1, 12.5, "1.00"], [2, 8.5, None], [3, None, "2.50"]], got
    # a $n used twice is announced with the type its occurrences widen to (BIGINT, not the
    # TINYINT of one of them): the driver sends 300 whole and the right row goes
    assert got["twice_delete"] == 1 and got["twice_query"] == [5000000000], got
    assert got["twice_rows"] == [[44], [5000000000]], got
    servers["wh"].sql("DROP TABLE jd")
    servers["wh"].sql("DROP TABLE jn")


def test_execute_update_counts(java_program, servers):
    got = java_program(_url(servers["plain"], user="ann", password="ann-pw"), "update")
    assert got["delete_count"] == 5
    assert got["insert_count"] == 2
    assert got["prepared_delete_count"] == 1
    assert got["count_after"] == 20 - 5 + 2 - 1
    assert servers["wh"].table("t").count_rows() == 16


def test_errors_show_duckdbs_hint_and_caret(java_program, servers):
    """What the driver's SQLException says: DuckDB's hint and its caret under the user's
    own statement, on lines of their own (docs/SERVER.md, "Error codes")."""
    got = java_program(_url(servers["plain"], token="jdbc-token"), "errors")
    assert 'Candidate bindings: "v"' in got["column"], got
    assert "\nLINE 1: SELECT vv FROM t\n               ^^\n" in got["column"], got
    assert "no such table" in got["table"] and 'Did you mean "t"?' in got["table"], got
    assert "\nLINE 1: SELECT * FROM tt\n                      ^^\n" in got["table"], got
    assert "__fsrv" not in got["column"] + got["table"]


def test_login_errors(java_program, servers):
    port = servers["plain"]
    assert java_program(_url(port, user="ann", password="ann-pw"), "login")["login"] == 42
    assert java_program(_url(port, token="jdbc-token"), "login")["login"] == 42
    wrong = java_program(_url(port, user="ann", password="nope"), "login")
    assert "login" not in wrong and "invalid user or password" in wrong["login_error"]
    bad_token = java_program(_url(port, token="nope"), "login")
    assert "login" not in bad_token and "bearer token" in bad_token["login_error"]


def test_tls_with_self_signed_ca(java_program, servers):
    port = servers["tls"]
    creds = {"user": "bob", "password": "bob-pw"}
    skip_verify = _url(port, useEncryption="true", disableCertificateVerification="true",
                       **creds)
    assert java_program(skip_verify, "login")["login"] == 42
    trusted = _url(port, useEncryption="true", useSystemTrustStore="false",
                   trustStore=servers["trust"], trustStorePassword="changeit", **creds)
    assert java_program(trusted, "login")["login"] == 42
    untrusted = java_program(_url(port, useEncryption="true", **creds), "login")
    assert "login" not in untrusted  # the system trust store does not know our CA


def test_the_driver_through_worker_relays(java_program, servers, tmp_path):
    """``serve --workers 2`` relays each connection's bytes to a worker (server/relay.py):
    the JDBC driver's queries, prepared statements with parameters, parameters typed by
    their context, metadata and login work the same through it, on the same warehouse."""
    from test_server_workers import Workers

    users = tmp_path / "users"
    users.write_text(f"bob:{hash_password('bob-pw', iterations=1000)}:reader\n")
    srv = Workers(servers["wh_path"], "--users-file", str(users),
                  "--auth-token", "jdbc-token:reader")
    try:
        # the module's other tests change table t: the one-process server on the same
        # warehouse says what it holds now
        def seen(got):  # a byte[] prints as its JVM identity ([B@1a2b3c), not its value
            rows = [[None if str(v).startswith("[B@") else v for v in row]
                    for row in got["rows"]]
            return got["count"], got["sum"], rows

        want = seen(java_program(_url(servers["plain"], token="jdbc-token"), "query"))
        for _ in range(3):  # new connections, spread over both workers by the kernel
            assert seen(java_program(_url(srv.port, token="jdbc-token"), "query")) == want
        got = java_program(_url(srv.port, user="bob", password="bob-pw"), "prepared")
        assert (got["prepared_count"], got["prepared_count_2"], got["prepared_string"]) \
            == (1, 1, "two")
        # parameters typed by their context, and the metadata a BI tool reads first: the
        # same answers as the one-process server's on the same warehouse
        for suite in ("context_params", "metadata"):
            one = java_program(_url(servers["plain"], user="bob", password="bob-pw"), suite)
            assert java_program(_url(srv.port, user="bob", password="bob-pw"), suite) == one
        srv.proc.send_signal(signal.SIGTERM)
        assert srv.proc.wait(timeout=60) == 0
    finally:
        srv.kill()
