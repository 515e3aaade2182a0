"""flightsrv: a lakehouse table on object storage with constant-time deletes, served over
Arrow Flight SQL by DuckDB.

Layers (dependencies point down): server → engine → sql/table → store; the public
``Warehouse``/``Table`` (``flightsrv.warehouse``) sit on top of the engine.
"""

from flightsrv.errors import (  # noqa: F401
    CommitConflict,
    ConfigurationError,
    CorruptObject,
    FlightsrvError,
    SchemaMismatch,
    StoreUnsupported,
    TableExists,
    TableNotFound,
    VersionNotFound,
)

__version__ = "0.1.0"

__all__ = ["CommitConflict", "ConfigurationError", "CorruptObject", "FlightsrvError",
           "SchemaMismatch", "StoreUnsupported", "TableExists", "TableNotFound",
           "VersionNotFound", "Runtime", "Table", "Warehouse"]

_LAZY = {"Runtime": "flightsrv.runtime", "Table": "flightsrv.warehouse",
         "Warehouse": "flightsrv.warehouse"}


def __getattr__(name: str):
    # ``Warehouse``/``Table`` import pyarrow and the table format: loaded on first use, so
    # ``import flightsrv.errors`` (every CLI command, the Flight client) stays light
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'flightsrv' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_LAZY))
