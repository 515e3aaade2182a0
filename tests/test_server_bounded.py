"""Issue 30's "every RPC is bounded" and issue 32's admission control, with two principals
over the product engine: hostile input from one principal (patterns, floods) never stalls
another's ``SELECT 1``, and a limit that is hit is named (``limit=... value=...``)."""

from __future__ import annotations

import threading
import time

import pytest
from _server_harness import READER, WRITER, desc, fetch, make_table, query, start
from pyarrow import flight

from flightsrv.server import proto


class Probe:
    """A second principal running ``SELECT 1`` every ``every_s`` seconds in a thread,
    recording each latency (and any error)."""

    def __init__(self, uri: str, token: str, every_s: float = 0.1):
        self.latencies: list[float] = []
        self.errors: list[BaseException] = []
        self._stop = threading.Event()
        self._client = flight.connect(uri)
        self._token, self._every = token, every_s
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self):
        while not self._stop.is_set():
            t0 = time.perf_counter()
            try:
                _, table = fetch(self._client, query("SELECT 1 AS one"), self._token)
                assert table.to_pylist() == [{"one": 1}]
            except BaseException as exc:  # noqa: BLE001 - reported by the test
                self.errors.append(exc)
            self.latencies.append(time.perf_counter() - t0)
            self._stop.wait(self._every)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join(30)
        self._client.close()

    def p99(self) -> float:
        ordered = sorted(self.latencies)
        return ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]


@pytest.fixture
def served(tmp_path):
    server, engine, wh, uri = start(tmp_path, query_timeout_s=5)
    make_table(wh, "people", batches=1, rows=10)
    yield server, uri
    server.shutdown()
    engine.close()


def _get_tables(client, pattern: str, token: str):
    cmd = proto.CommandGetTables(table_name_filter_pattern=pattern)
    return fetch(client, desc(cmd), token)[1]


def test_a_pathological_table_pattern_is_answered_at_once_and_stalls_nobody(served):
    """``'%' * 24 + 'Z'`` took 13.8 s as a backtracking regex and froze every client."""
    _, uri = served
    with Probe(uri, WRITER) as probe, flight.connect(uri) as client:
        time.sleep(0.3)
        t0 = time.perf_counter()
        for pattern in ("%" * 24 + "Z", "%" * 30 + "Z", "%p%e%o%p%l%e%" * 50 + "Z"):
            assert _get_tables(client, pattern, READER).num_rows == 0
        assert _get_tables(client, "%e%p%", READER).column("table_name").to_pylist() == ["people"]
        assert time.perf_counter() - t0 < 2
        time.sleep(0.3)
    assert not probe.errors and probe.latencies
    assert probe.p99() < 1.0
