"""A cancel (or a deadline) that lands after the engine's last check but before DuckDB's
query begins: DuckDB forgets an ``interrupt()`` that reaches a connection before its query
starts, so the server's watchdog interrupts a tripped call again until it ends
(``Cancel.reinterrupt``). Without that, the statement below runs for a minute, past any
deadline; with it, it stops within a few watchdog polls."""

from __future__ import annotations

import time

import pyarrow as pa
import pytest

import flightsrv.engine.duck as duck
from flightsrv import Warehouse
from flightsrv.engine import DuckEngine, Session
from flightsrv.engine.api import Cancel
from flightsrv.errors import QueryCancelled
from flightsrv.server.calls import CallTracker

#: about a minute of DuckDB's time on two threads (hash of 2e10 integers)
LONG = "SELECT sum(hash(i)) AS h FROM range(20000000000) AS r(i), t WHERE t.id = 1"


@pytest.fixture
def engine(tmp_path):
    wh = Warehouse.open(str(tmp_path / "wh"))
    wh.create_table("t", pa.schema([("id", pa.int64())])).append(
        pa.table({"id": pa.array([1], pa.int64())}))
    e = DuckEngine(wh, threads=2)
    yield e
    e.close()


@pytest.fixture
def tracker():
    t = CallTracker(poll_s=0.05)
    yield t
    t.close()


def _trip_before_duckdb_starts(monkeypatch, trip):
    """Run ``trip()`` right before the engine hands its statement to DuckDB: after every
    check the engine makes and after its interrupt is registered (the race's window)."""
    real = duck.run_to_arrow

    def run_to_arrow(*args, **kwargs):
        trip()
        return real(*args, **kwargs)

    monkeypatch.setattr(duck, "run_to_arrow", run_to_arrow)


def _run(engine, cancel: Cancel) -> float:
    t0 = time.monotonic()
    with pytest.raises(QueryCancelled):
        engine.execute_query(LONG, Session("s"), cancel=cancel).reader.read_all()
    return time.monotonic() - t0


@pytest.mark.parametrize("timeout_s, reason", [(None, "cancelled"), (0.2, "timeout")],
                         ids=["cancel", "deadline"])
def test_a_cancel_or_deadline_just_before_duckdb_starts_still_stops_the_query(
        engine, tracker, monkeypatch, timeout_s, reason):
    call = tracker.start("alice", timeout_s)
    # the client cancels, or the deadline passes (the watchdog trips it), while the engine
    # is about to start the query
    _trip_before_duckdb_starts(monkeypatch, (lambda: call.cancel.cancel("cancelled"))
                               if timeout_s is None else (lambda: time.sleep(0.4)))
    try:
        took = _run(engine, call.cancel)
    finally:
        tracker.finish(call)
    assert took < 10, f"ran {took:.1f} s after its {reason}"
    assert call.cancel.reason == reason


def test_an_unregistered_interrupt_is_not_run_again():
    cancel = Cancel()
    runs = []
    unregister = cancel.interrupt_with(lambda: runs.append(1))
    cancel.cancel()
    cancel.reinterrupt()
    assert len(runs) == 2
    unregister()
    cancel.reinterrupt()
    assert len(runs) == 2
    late = cancel.interrupt_with(lambda: runs.append(2))  # registered once tripped: runs now
    assert runs == [1, 1, 2]
    late()
