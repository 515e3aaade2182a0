"""Table URIs (``<warehouse uri>/<table>``) and per-process warehouse handles.

Spark runs our code in many Python worker processes (planning, tasks, commit). Each opens the
warehouse by URI; handles are cached per process so manifests and Parquet footers are read
once per worker, not once per task (Spark reuses Python workers).
"""

from __future__ import annotations

import threading

from flightsrv.errors import ConfigurationError
from flightsrv.warehouse import Table, Warehouse, check_name

_lock = threading.Lock()
_warehouses: dict[str, Warehouse] = {}
_tables: dict[tuple[str, str], Table] = {}


def split_uri(uri: str) -> tuple[str, str]:
    """``/wh/events`` → (``/wh``, ``events``); ``s3://b/p/events`` → (``s3://b/p``, ``events``)."""
    if not uri or not isinstance(uri, str):
        raise ConfigurationError("a table URI is required: <warehouse uri>/<table>", uri=uri)
    u = uri.rstrip("/")
    wh, sep, name = u.rpartition("/")
    if not sep or not name or not wh or wh.endswith((":/", ":")):
        raise ConfigurationError("table URI must be <warehouse uri>/<table>", uri=uri)
    return wh, check_name(name)


def warehouse(uri: str) -> Warehouse:
    with _lock:
        wh = _warehouses.get(uri)
        if wh is None:
            wh = _warehouses[uri] = Warehouse.open(uri)
        return wh


def table_handle(wh_uri: str, name: str) -> Table:
    """A cached ``Table`` object (no I/O; the table may not exist yet)."""
    with _lock:
        t = _tables.get((wh_uri, name))
    if t is None:
        t = Table(warehouse(wh_uri), name)
        with _lock:
            t = _tables.setdefault((wh_uri, name), t)
    return t
