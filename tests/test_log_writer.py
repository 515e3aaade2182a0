"""The server's log handler (server/logs.py ``LineWriter``): INFO lines are held and written
by its own thread in one write, a WARNING at once after the lines held before it, nothing is
dropped or reordered, and a line says what was true when it was logged."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import threading
import time

from flightsrv.server.logs import JsonFormatter, LineWriter


class _Stream:
    """A stream that records each write call (the handler's system calls)."""

    def __init__(self):
        self.writes: list[str] = []
        self.lock = threading.Lock()

    def write(self, text: str) -> None:
        with self.lock:
            self.writes.append(text)

    def flush(self) -> None:
        pass

    def lines(self) -> list[dict]:
        with self.lock:
            return [json.loads(ln) for w in self.writes for ln in w.splitlines()]


def _logger(handler: logging.Handler, name: str) -> logging.Logger:
    lg = logging.getLogger(f"flightsrv.test_log_writer.{name}")
    lg.handlers[:] = [handler]
    lg.setLevel(logging.DEBUG)
    lg.propagate = False
    return lg


def test_info_lines_are_held_and_written_together_by_the_writer_thread():
    stream = _Stream()
    h = LineWriter(stream, interval_s=0.2)
    h.setFormatter(JsonFormatter())
    lg = _logger(h, "held")
    try:
        writer = []
        stream.write = (lambda orig: lambda text: (writer.append(threading.current_thread()),
                                                   orig(text)))(stream.write)
        for i in range(5):
            lg.info("line %d", i, extra={"fields": {"i": i}})
        assert stream.writes == []  # held: the logging thread wrote nothing
        deadline = time.monotonic() + 10
        while not stream.writes and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(stream.writes) == 1  # the five lines in one write
        assert writer[0] is not threading.current_thread()
        assert [(r["msg"], r["i"]) for r in stream.lines()] == [
            (f"line {i}", i) for i in range(5)]
    finally:
        h.close()


def test_a_warning_is_written_at_once_after_the_lines_held_before_it():
    stream = _Stream()
    h = LineWriter(stream, interval_s=60)
    h.setFormatter(JsonFormatter())
    lg = _logger(h, "warn")
    try:
        lg.info("first")
        lg.debug("second")
        lg.warning("third")
        assert [r["msg"] for r in stream.lines()] == ["first", "second", "third"]
        lg.info("fourth")
        h.flush()
        assert [r["msg"] for r in stream.lines()][-1] == "fourth"
    finally:
        h.close()


def test_a_line_says_what_was_true_when_logged_and_keeps_its_exception():
    stream = _Stream()
    h = LineWriter(stream, interval_s=60)
    h.setFormatter(JsonFormatter())
    lg = _logger(h, "args")
    try:
        value = ["before"]
        lg.info("value %s", value)
        value[0] = "after"  # changed before the line is written
        try:
            raise ZeroDivisionError("boom")
        except ZeroDivisionError:
            lg.info("failed", exc_info=True)
        h.flush()
        first, second = stream.lines()
        assert first["msg"] == "value ['before']"
        assert "ZeroDivisionError: boom" in second["exc"]
    finally:
        h.close()


def test_at_most_max_records_are_held_and_none_is_lost_from_many_threads():
    stream = _Stream()
    h = LineWriter(stream, interval_s=60, max_records=50)
    h.setFormatter(JsonFormatter())
    lg = _logger(h, "many")
    try:
        def log(t):
            for i in range(400):
                lg.info("x", extra={"fields": {"t": t, "i": i}})

        threads = [threading.Thread(target=log, args=(t,)) for t in range(4)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        assert len(stream.lines()) >= 1600 - 50  # at most max_records held
        h.flush()
        lines = stream.lines()
        assert len(lines) == 1600
        for t in range(4):  # each thread's lines in its order
            assert [r["i"] for r in lines if r["t"] == t] == list(range(400))
    finally:
        h.close()


def test_a_process_writes_its_held_lines_when_it_exits():
    code = ("import logging\n"
            "from flightsrv.server.logs import configure_json_logging\n"
            "configure_json_logging(logging.INFO)\n"
            "for i in range(3): logging.getLogger('flightsrv.x').info('bye %d', i)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    assert [json.loads(ln)["msg"] for ln in out.stderr.splitlines()] == [
        "bye 0", "bye 1", "bye 2"]


def test_after_close_a_line_is_written_where_it_is_logged():
    stream = _Stream()
    h = LineWriter(stream, interval_s=60)
    h.setFormatter(JsonFormatter())
    lg = _logger(h, "closed")
    lg.info("held")
    h.close()
    assert [r["msg"] for r in stream.lines()] == ["held"]
    lg.info("late")
    assert [r["msg"] for r in stream.lines()] == ["held", "late"]
