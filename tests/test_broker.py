"""The slot broker of ``serve --workers N`` (server/broker.py), over real unix sockets: two
``BrokerLink``s stand for two worker processes sharing one principal's slots."""

from __future__ import annotations

import socket
import threading
import time

import pytest

from flightsrv.errors import QueryCancelled
from flightsrv.server.broker import BrokerLink, SharedConcurrency, SlotBroker
from flightsrv.server.status import ResourceLimit


@pytest.fixture
def broker(tmp_path):
    b = SlotBroker(str(tmp_path / "slots.sock"), {"queries": (2, 3), "puts": (1, 1)})
    b.start()
    yield b
    b.stop()


def _workers(broker, n=2, pool="queries", **kw):
    limit, queued = {"queries": (2, 3), "puts": (1, 1)}[pool]
    links = [BrokerLink(broker.path) for _ in range(n)]
    return links, [SharedConcurrency(link, pool, limit, queued, poll_s=0.02, **kw)
                   for link in links]


def _settle(broker, pool, want, timeout=5.0):
    deadline = time.monotonic() + timeout
    while broker.counts(pool) != want and time.monotonic() < deadline:
        time.sleep(0.01)
    return broker.counts(pool)


def _close(links):
    for link in links:
        link.close()


def _all_free(broker, user="alice", pool="queries", limit=2):
    """A new worker gets all ``limit`` of ``user``'s slots at once: none was lost (idle
    leases elsewhere are recalled)."""
    link = BrokerLink(broker.path)
    shared = SharedConcurrency(link, pool, limit, 4, poll_s=0.02)
    try:
        for _ in range(limit):
            shared.acquire(user, time.monotonic() + 3)
        return shared.count() == limit
    finally:
        link.close()


def test_a_principals_slots_are_counted_over_every_worker(broker):
    links, (a, b) = _workers(broker)
    try:
        a.acquire("alice")
        a.acquire("alice")
        assert (a.count(), b.count()) == (2, 0)
        with pytest.raises(QueryCancelled) as info:  # worker b's statement waits, then
            b.acquire("alice", time.monotonic() + 0.2)  # its deadline passes
        assert info.value.context["limit"] == "max_concurrent_queries"
        assert info.value.context["value"] == 2
        b.acquire("bob", time.monotonic() + 1)  # another principal has its own slots
        got = []
        t = threading.Thread(target=lambda: got.append(b.acquire("alice")))
        t.start()
        deadline = time.monotonic() + 2
        while b.queued() != 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert b.queued() == 1
        a.release("alice")  # the slot freed on worker a goes to worker b's waiter
        t.join(5)
        assert got and got[0] > 0
        assert (a.count(), b.count(), b.queued()) == (1, 2, 0)
        a.release("alice")
        b.release("alice")
        b.release("bob")
        assert (a.count(), b.count()) == (0, 0)
        assert _all_free(broker)
    finally:
        _close(links)


def test_waiters_are_served_in_order_whichever_worker_they_are_on(broker):
    links, (a, b) = _workers(broker)
    order = []
    try:
        a.acquire("alice")
        a.acquire("alice")

        def wait(side, name):
            side.acquire("alice", time.monotonic() + 10)
            order.append(name)

        threads = []
        for side, name in ((b, "b1"), (a, "a1"), (b, "b2")):
            t = threading.Thread(target=wait, args=(side, name))
            t.start()
            threads.append(t)
            assert _settle(broker, "queries", (2, len(threads)))[1] == len(threads)
        for k, side in enumerate((a, a, b), 1):  # a's two, then b1's
            side.release("alice")
            deadline = time.monotonic() + 5
            while len(order) < k and time.monotonic() < deadline:
                time.sleep(0.01)
        for t in threads:
            t.join(5)
        assert order == ["b1", "a1", "b2"]
    finally:
        _close(links)


def test_a_full_queue_is_refused_at_once_naming_its_limit(broker):
    links, (a, b) = _workers(broker, pool="puts", what="DoPut stream",
                             limit_name="max_open_puts")
    try:
        a.acquire("alice")
        t = threading.Thread(target=lambda: b.acquire("alice", time.monotonic() + 5))
        t.start()
        assert _settle(broker, "puts", (1, 1)) == (1, 1)
        with pytest.raises(ResourceLimit) as info:
            a.acquire("alice", time.monotonic() + 5)
        assert info.value.context["limit"] == "max_queued_queries"
        a.release("alice")
        t.join(5)
        assert b.count() == 1
    finally:
        _close(links)


def test_a_worker_that_goes_gives_its_slots_to_the_others(broker):
    links, (a, b) = _workers(broker)
    try:
        a.acquire("alice")
        a.acquire("alice")
        got = []
        t = threading.Thread(target=lambda: got.append(b.acquire("alice", time.monotonic() + 5)))
        t.start()
        assert _settle(broker, "queries", (2, 1)) == (2, 1)
        links[0].close()  # worker a exits (or is killed) holding both
        t.join(5)
        assert got, "the waiter on worker b never got the dead worker's slot"
        assert _settle(broker, "queries", (1, 0)) == (1, 0)
    finally:
        _close(links)


def test_giving_up_while_the_grant_is_on_the_way_loses_no_slot(broker):
    """A waiter that gives up (deadline) races the slot being handed to it; whichever wins,
    the broker ends with every slot free."""
    links, (a, b) = _workers(broker)
    try:
        for i in range(40):
            a.acquire("alice", time.monotonic() + 3)
            a.acquire("alice", time.monotonic() + 3)
            req = links[1].take("queries", "alice")
            assert req is not None
            assert _settle(broker, "queries", (2, 1)) == (2, 1), i
            a.release("alice")
            if i % 2:
                time.sleep(0.002 * (i % 5))
            if links[1].give_up(req):
                assert links[1].release("queries", "alice")
            a.release("alice")
        assert (a.count(), b.count()) == (0, 0)
        assert _all_free(broker)
    finally:
        _close(links)


def test_a_principals_next_statement_reuses_its_workers_lease(broker):
    """Without contention a worker keeps the slots its statements used: the next one takes
    one without a message (the broker's count stays), and another worker's request recalls
    the idle ones."""
    links, (a, b) = _workers(broker)
    try:
        a.acquire("alice")
        a.release("alice")
        assert _settle(broker, "queries", (1, 0)) == (1, 0)  # leased to a, idle there
        assert links[0].take("queries", "alice") is None  # taken locally
        assert a.count() == 1
        a.release("alice")
        b.acquire("alice", time.monotonic() + 3)
        b.acquire("alice", time.monotonic() + 3)  # the second recalls a's idle slot
        assert (a.count(), b.count()) == (0, 2)
        assert _settle(broker, "queries", (2, 0)) == (2, 0)
    finally:
        _close(links)


def test_a_worker_whose_broker_is_gone_counts_its_own(tmp_path):
    b = SlotBroker(str(tmp_path / "slots.sock"), {"queries": (1, 4)})
    b.start()
    link = BrokerLink(b.path)
    shared = SharedConcurrency(link, "queries", 1, 4, poll_s=0.02)
    shared.acquire("alice")
    b.stop()
    deadline = time.monotonic() + 5
    while not link.lost and time.monotonic() < deadline:
        time.sleep(0.01)
    assert link.lost
    shared.release("alice")  # held from the broker: nothing to give back to
    shared.acquire("alice")  # now this worker's own slots, with the same limit
    with pytest.raises(QueryCancelled):
        shared.acquire("alice", time.monotonic() + 0.1)
    shared.release("alice")
    assert shared.count() == 0
    link.close()


def test_a_malformed_message_drops_only_its_connection(broker):
    links, (a,) = _workers(broker, n=1)
    raw = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        raw.connect(broker.path)
        raw.sendall(b'{"r": "queries", "u": "alice"}\n')  # a release of nothing held
        raw.settimeout(5)
        assert raw.recv(10) == b""  # closed by the broker
        raw2 = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        raw2.connect(broker.path)
        raw2.sendall(b"x" * (70 << 10))  # no end of line within MAX_LINE
        raw2.settimeout(5)
        try:
            assert raw2.recv(10) == b""
        except ConnectionResetError:
            pass  # closed with our bytes unread
        raw2.close()
        a.acquire("alice", time.monotonic() + 2)  # the others are still served
        a.release("alice")
    finally:
        raw.close()
        _close(links)


class _Clock:
    def __init__(self):
        self.ms = 0

    def now_ms(self) -> int:
        return self.ms


def _registries(path, n=2, limit=2, ttl_s=60.0, gone=None):
    """``n`` workers' PerPrincipal registries sharing one count of holds (as prepared
    statements and sessions are under ``serve --workers N``)."""
    from flightsrv.server.broker import SharedHolds
    from flightsrv.server.limits import PerPrincipal

    clocks, links, regs = [], [], []
    for _ in range(n):
        link, clock = BrokerLink(path), _Clock()
        reg = PerPrincipal("prepared statements", "max_prepared_statements", limit, ttl_s,
                           clock, gone=gone, shared=SharedHolds(link, "prepared"))
        clocks.append(clock), links.append(link), regs.append(reg)
    return clocks, links, regs


@pytest.fixture
def holds(tmp_path):
    b = SlotBroker(str(tmp_path / "holds.sock"), {}, holds={"prepared": 2})
    b.start()
    yield b
    b.stop()


def test_entries_are_counted_over_every_worker_and_refused_naming_the_limit(holds):
    clocks, links, (a, b) = _registries(holds.path)
    try:
        a.add("alice", b"h1", 1)
        b.add("alice", b"h2", 2)
        a.add("alice", b"h1", 11)  # the same key again holds nothing more
        with pytest.raises(ResourceLimit, match="max_prepared_statements") as ei:
            b.add("alice", b"h3", 3)
        assert "value=2" in str(ei.value) or ei.value.context.get("value") == 2
        b.add("bob", b"h1", 1)  # another principal's count is its own
        assert a.pop("alice", b"h1") == 11  # closing one frees a place, on any worker
        b.add("alice", b"h3", 3)
        assert _settle(holds, "prepared", (3, 0)) == (3, 0)
        assert a.get("alice", b"h3") is None and b.get("alice", b"h3") == 3  # per worker
    finally:
        _close(links)
    # the workers went: their holds with them
    assert _settle(holds, "prepared", (0, 0)) == (0, 0)


def test_a_full_count_sweeps_the_other_workers_expired_and_dead_entries(holds):
    dead: set = set()
    clocks, links, (a, b) = _registries(holds.path, ttl_s=10.0, gone=lambda k: k in dead)
    try:
        a.add("alice", b"old", 1)
        a.add("alice", b"live", 2)
        with pytest.raises(ResourceLimit):
            b.add("alice", b"new", 3)
        clocks[0].ms = 11_000  # a's entries expired: nobody touched a since
        b.add("alice", b"new", 3)  # the broker asked a to sweep; one server would expire
        assert a.count("alice") == 0 and b.count("alice") == 1
        b.add("alice", b"conn", 4)
        dead.add(b"conn")  # b's entry of a closed connection: b drops it itself
        a.add("alice", b"x", 5)
        assert b.get("alice", b"conn") is None and a.get("alice", b"x") == 5
    finally:
        _close(links)


def test_a_notice_reaches_every_other_worker_before_notify_returns(broker):
    """``notify`` returns once every other worker ran its handler (a cancel or a close
    is then in force everywhere); without any other worker it returns at once; a worker
    whose handler is stuck delays it at most the broker's wait, and the sender hears it."""
    links = [BrokerLink(broker.path) for _ in range(3)]
    seen: list = []
    stuck = threading.Event()
    try:
        for i, link in enumerate(links[1:], 1):
            link.on_notice("cancel", lambda u, v, i=i: (time.sleep(0.2), seen.append((i, u, v))))
        assert links[0].notify("cancel", "alice", "n1") is True
        assert sorted(seen) == [(1, "alice", "n1"), (2, "alice", "n1")]  # both ran already
        assert links[1].notify("unknown kind", "alice", "x") is True  # nobody handles it
        links[2].on_notice("close", lambda u, v: stuck.wait(30))
        started = time.monotonic()
        assert links[0].notify("close", "alice", "h") is False
        assert time.monotonic() - started < 10
        stuck.set()
        assert links[0].notify("cancel", "bob", "n2", wait=False) is True
        deadline = time.monotonic() + 5
        while len(seen) < 4:
            assert time.monotonic() < deadline
            time.sleep(0.01)
    finally:
        stuck.set()
        _close(links)
    alone = BrokerLink(broker.path)
    try:
        started = time.monotonic()
        assert alone.notify("cancel", "alice", "n3") is True
        assert time.monotonic() - started < 1
    finally:
        alone.close()


def test_busy_boards_show_each_worker_the_others_running_statements(tmp_path):
    """``server/busy.py``: each worker's count, as it last wrote it, read by the others; a
    worker started again in the same place starts from 0."""
    from flightsrv.server.busy import BusyBoard

    zero, one, two = (BusyBoard(str(tmp_path), i) for i in range(3))
    one.add(2)
    two.add(1)
    assert zero.others() == 3 and one.others() == 1 and two.others() == 2
    one.add(-2)
    assert zero.others() == 1
    two.add(4)
    two.close()  # it died with 5 running: what it wrote stays until it starts again
    two.add(-5)  # a statement ending after the close writes nothing
    assert zero.others() == 5
    two = BusyBoard(str(tmp_path), 2)
    assert zero.others() == 0
    for board in (zero, one, two):
        board.close()
