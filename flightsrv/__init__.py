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
from flightsrv.runtime import Runtime  # noqa: F401
from flightsrv.warehouse import Table, Warehouse  # noqa: F401

__version__ = "0.1.0"
