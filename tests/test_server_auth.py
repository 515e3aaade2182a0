"""Authentication and roles: basic -> bearer, static tokens, reader vs writer."""

import adbc_driver_manager
import pyarrow as pa
import pytest
from _server_engine import start_test_server
from adbc_driver_flightsql import dbapi
from pyarrow import flight

from flightsrv.engine.api import Role
from flightsrv.runtime import ManualClock
from flightsrv.server import proto
from flightsrv.server.auth import (
    AuthConfig,
    Principal,
    TokenIssuer,
    hash_password,
    verify_password,
)

pytestmark = pytest.mark.filterwarnings("ignore:Cannot disable autocommit")
TOKEN_HEADER = "adbc.flight.sql.authorization_header"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    users = tmp_path_factory.mktemp("auth") / "users"
    users.write_text(
        "# user:hash:role\n"
        f"alice:{hash_password('alice-pw', iterations=1000)}:writer\n"
        f"bob:{hash_password('bob-pw', iterations=1000)}:reader\n"
    )
    auth = AuthConfig.from_users_file(users, tokens={
        "static-writer": Principal("svc", Role.WRITER),
        "static-reader": Principal("viewer", Role.READER)})  # fmt: skip
    srv, _engine, uri = start_test_server(auth=auth)
    with dbapi.connect(uri, db_kwargs={TOKEN_HEADER: "Bearer static-writer"}) as c, \
            c.cursor() as cur:
        cur.execute("CREATE TABLE secret AS SELECT range AS id FROM range(10)")
    yield srv, uri
    srv.shutdown()


def _connect(uri, **db_kwargs):
    return dbapi.connect(uri, db_kwargs=db_kwargs)


def test_password_hashing():
    h = hash_password("pw", iterations=1000)
    assert verify_password("pw", h) and not verify_password("nope", h)
    assert not verify_password("pw", "garbage")


def test_issued_tokens_expire():
    clock = ManualClock(step_ms=0)
    issuer = TokenIssuer(clock, ttl_s=60)
    token = issuer.issue(Principal("u", Role.READER))
    assert issuer.verify(token) == Principal("u", Role.READER)
    assert issuer.verify(token[:-2] + "xx") is None
    clock.advance(61_000)
    assert issuer.verify(token) is None


def test_adbc_username_password_gets_bearer_token(server):
    _, uri = server
    with _connect(uri, username="alice", password="alice-pw") as conn, conn.cursor() as cur:
        cur.execute("SELECT count(*) FROM secret")
        assert cur.fetchone() == (10,)


def test_pyarrow_basic_handshake_returns_bearer(server):
    _, uri = server
    client = flight.connect(uri)
    key, value = client.authenticate_basic_token("bob", "bob-pw")
    assert key.lower() == b"authorization" and value.startswith(b"Bearer ")
    opts = flight.FlightCallOptions(headers=[(key, value)])
    desc = flight.FlightDescriptor.for_command(proto.pack(proto.CommandGetCatalogs()))
    info = client.get_flight_info(desc, opts)
    assert client.do_get(info.endpoints[0].ticket, opts).read_all().num_rows == 1


@pytest.mark.parametrize("kwargs", [
    {}, {TOKEN_HEADER: "Bearer wrong"}, {TOKEN_HEADER: "Bearer None"},
    {"username": "alice", "password": "bad"}, {"username": "mallory", "password": "x"},
])  # fmt: skip
def test_missing_or_wrong_credentials_are_unauthenticated(server, kwargs):
    _, uri = server
    with pytest.raises(adbc_driver_manager.Error) as exc, _connect(uri, **kwargs) as conn, \
            conn.cursor() as cur:
        cur.execute("SELECT 1")
    assert "UNAUTHENTICATED" in str(exc.value)


def test_raw_flight_without_credentials_is_unauthenticated(server):
    _, uri = server
    with flight.connect(uri) as client, pytest.raises(flight.FlightUnauthenticatedError):
        list(client.list_actions())


def test_reader_may_select_but_not_delete_or_ingest(server):
    _, uri = server
    for creds in ({"username": "bob", "password": "bob-pw"},
                  {TOKEN_HEADER: "Bearer static-reader"}):  # fmt: skip
        with _connect(uri, **creds) as conn:
            with conn.cursor() as cur:
                cur.execute("SELECT count(*) FROM secret")
                assert cur.fetchone() == (10,)
            with conn.cursor() as cur, pytest.raises(adbc_driver_manager.Error) as exc:
                cur.execute("DELETE FROM secret")
            assert "UNAUTHORIZED" in str(exc.value)
            with conn.cursor() as cur, pytest.raises(adbc_driver_manager.Error) as exc:
                cur.adbc_ingest("secret2", pa.table({"a": [1]}), mode="create")
            assert "UNAUTHORIZED" in str(exc.value)
    with _connect(uri, **{TOKEN_HEADER: "Bearer static-writer"}) as conn, conn.cursor() as cur:
        cur.execute("SELECT count(*) FROM secret")
        assert cur.fetchone() == (10,)  # nothing was deleted


def test_writer_may_delete(server):
    _, uri = server
    with _connect(uri, username="alice", password="alice-pw") as conn, conn.cursor() as cur:
        cur.execute("CREATE TABLE w AS SELECT range AS id FROM range(4)")
        cur.execute("DELETE FROM w WHERE id < 2")
        assert cur.rowcount == 2

