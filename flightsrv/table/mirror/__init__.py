"""Mirrors: every flightsrv version readable as Delta Lake and as Iceberg v3, deletion
vectors included, without copying data (docs/INTEROP.md).

- ``publisher.py`` bring the mirrors up to the head; the after-commit hook; expiry; references
- ``delta.py``    ``_delta_log/`` commits and checkpoints
- ``iceberg.py``  ``metadata/``: table metadata, manifest lists, manifests (Avro), Puffin DVs
- ``types.py``    schema, field ids and statistics mapping
- ``dvs.py``      the deletion vector each mirror publishes for a file
"""

from flightsrv.table.mirror.publisher import (  # noqa: F401
    MIRROR_PREFIXES,
    PROPERTY,
    PublishResult,
    expire,
    is_mirror_key,
    object_refs,
    parse_formats,
    publish,
    referenced,
    wait_idle,
)
