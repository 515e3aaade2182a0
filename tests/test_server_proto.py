"""The runtime-built Flight SQL messages: wire compatibility and SqlInfo coverage."""

import subprocess
import sys
import textwrap

import pytest

from flightsrv.server import metadata as md
from flightsrv.server import proto


def test_pack_unpack_round_trip_uses_arrow_type_url():
    msg = proto.CommandStatementQuery(query="SELECT 1")
    data = proto.pack(msg)
    assert b"type.googleapis.com/arrow.flight.protocol.sql.CommandStatementQuery" in data
    back = proto.unpack(data)
    assert isinstance(back, proto.CommandStatementQuery)
    assert back.query == "SELECT 1"
    assert not back.HasField("transaction_id")


def test_ingest_message_nested_options_and_map():
    msg = proto.CommandStatementIngest(table="t", schema="main")
    msg.table_definition_options.if_not_exist = proto.TableNotExistOption.CREATE
    msg.table_definition_options.if_exists = proto.TableExistsOption.APPEND
    msg.options["k"] = "v"
    back = proto.unpack(proto.pack(msg))
    assert back.table_definition_options.if_exists == 2
    assert back.HasField("schema") and not back.HasField("catalog")
    assert dict(back.options) == {"k": "v"}


@pytest.mark.parametrize("data", [b"\xff\xff", b""])
def test_unpack_rejects_garbage(data):
    with pytest.raises(proto.ProtocolError):
        proto.unpack(data)


def test_unpack_rejects_foreign_type_url():
    from google.protobuf import any_pb2

    data = any_pb2.Any(type_url="type.googleapis.com/x.Y", value=b"").SerializeToString()
    with pytest.raises(proto.ProtocolError, match="type_url"):
        proto.unpack(data)


def test_field_numbers_match_arrow_and_coexist_with_flightsql_dbapi():
    """flightsql-dbapi ships Arrow's generated FlightSql descriptors in the default pool.
    Importing both in one process must work, and every field we share must agree."""
    code = textwrap.dedent(
        """
        import flightsql.flightsql_pb2 as theirs
        from flightsrv.server import proto
        checked = 0
        for name, desc in theirs.DESCRIPTOR.message_types_by_name.items():
            ours = getattr(proto, name, None)
            if ours is None:
                continue
            for f in desc.fields:
                mine = ours.DESCRIPTOR.fields_by_name.get(f.name)
                if mine is None:
                    continue
                assert mine.number == f.number, (name, f.name)
                assert mine.is_repeated == f.is_repeated, (name, f.name)
                want = 5 if f.type == 14 else f.type  # our enums are int32 (same varint)
                assert mine.type == want, (name, f.name, mine.type, f.type)
                checked += 1
        print(checked)
        """
    )
    out = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True,
                         timeout=60)  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert int(out.stdout.strip()) >= 40


def test_sql_info_answers_every_spec_key():
    values = md.sql_info_values("9.9")
    spec_keys = set(range(10)) | {100, 101} | set(range(500, 577))
    assert spec_keys <= set(values)
    table = md.sql_info_table(values, [])
    assert table.num_rows == len(values)
    by_key = {r["info_name"]: r["value"] for r in table.to_pylist()}
    assert by_key[0] == "flightsrv" and by_key[1] == "9.9"
    assert by_key[504] == '"' and by_key[563] is False
    assert "QUALIFY" in by_key[508]


def test_like_patterns():
    r = md.like_pattern("t\\_%")
    assert md.matches(r, "t_1") and not md.matches(r, "tx1")
    assert md.matches(md.like_pattern("_a%"), "bar")
    assert md.matches(None, "anything")


def test_like_patterns_agree_with_duckdb():
    """DuckDB's LIKE decides what a filter pattern means; ours must agree on every case."""
    import random

    import duckdb

    rng = random.Random(30)
    con = duckdb.connect()
    cases = []
    for _ in range(3000):
        pattern = "".join(rng.choice("ab_%\\") for _ in range(rng.randint(0, 7)))
        if (len(pattern) - len(pattern.rstrip("\\"))) % 2:  # DuckDB refuses a trailing escape
            pattern = pattern.rstrip("\\")
        name = "".join(rng.choice("ab_%\\") for _ in range(rng.randint(0, 7)))
        cases.append((name, pattern))
    want = con.execute(
        "SELECT list(n LIKE p ESCAPE '\\' ORDER BY i) FROM "
        "(SELECT unnest(?) AS n, unnest(?) AS p, generate_subscripts(?, 1) AS i)",
        [[n for n, _ in cases], [p for _, p in cases], [n for n, _ in cases]]).fetchone()[0]
    got = [md.matches(md.like_pattern(p), n) for n, p in cases]
    bad = [(n, p, w) for (n, p), g, w in zip(cases, got, want, strict=True) if g != w]
    assert not bad, bad[:10]


def test_like_pattern_takes_linear_time():
    """A pattern a backtracking regex needs minutes for is answered at once (issue 30 #5)."""
    import time

    t0 = time.perf_counter()
    for pattern in ("%" * 30 + "Z", "%a" * 5000 + "Z", "_%" * 100_000):
        assert not md.matches(md.like_pattern(pattern), "a" * 60 + "b")
    assert md.matches(md.like_pattern("%a%a%b"), "a" * 60 + "b")
    assert time.perf_counter() - t0 < 10.0  # backtracking: minutes
