"""Table maintenance: compaction, snapshot expiry, vacuum of orphans, health stats
(docs/MAINTENANCE.md; the spec text lives in docs/PROTOCOL.md §Maintenance).

``compact``  rewrites data files whose deleted fraction is over ``compact.min_deleted_fraction``
             and bin-packs small files up to the target file size (optionally sorted by
             columns); coalesces the deletion vectors of files it keeps into one tombstone
             object. One commit swaps inputs for outputs. A delete that commits between the
             compaction's read and its commit is *carried over*: the commit maps the newly
             deleted input positions to output positions (output row = rank of the input row
             in the write order) and gives the outputs a DV. A group whose input file vanished
             (rewritten or wholly deleted concurrently) is dropped from the commit (its outputs
             become orphans for vacuum). Files appended concurrently are kept: the commit only
             removes its own inputs from the head it is given.
``expire_snapshots``  deletes manifests of versions below a cutoff, oldest first, so retained
             versions stay a contiguous suffix ending at the head; the pointer is moved to the
             head first and the cutoff never passes it, so pointer roll-forward keeps working.
``vacuum``   deletes objects under ``data/`` and ``tombstone/`` that no retained version
             references and that are older than the grace period, and aborts multipart
             uploads older than it; likewise mirror objects (``_delta_log/``, ``_delta_dv/``,
             ``metadata/``, see ``flightsrv.table.mirror``) that no retained mirror version
             references. ``expire_snapshots`` also removes expired versions from the mirrors.
             It lists objects *before* reading the retained versions
             (and re-reads the head before deleting), so anything committed meanwhile is seen.
``table_stats``  files, row groups, rows, deleted fraction, DVs, orphan bytes, versions, and
             a recommendation.

Time comes from the table's injected ``Runtime`` clock; object ages compare the store's
``last_modified_ms`` with it (an object from "the future" counts as young and is kept).

The package: ``common`` (defaults, DV placement for rewritten files, durations, progress),
``results`` (what each operation returns), ``compact``, ``expire``, ``vacuum``, ``stats``.
"""

from __future__ import annotations

from flightsrv.table.maintenance.common import (  # noqa: F401
    DEFAULT_GRACE,
    DEFAULT_MAX_VERSIONS,
    DEFAULT_MIN_DELETED_FRACTION,
    DEFAULT_SMALL_FILE_FRACTION,
    DEFAULT_SORT_GROUP_BYTES,
    VACUUM_PREFIXES,
)
from flightsrv.table.maintenance.compact import (  # noqa: F401
    commit_groups,
    compact,
    compaction_options,
)
from flightsrv.table.maintenance.expire import (  # noqa: F401
    expire_snapshots,
)
from flightsrv.table.maintenance.results import (  # noqa: F401
    CompactResult,
    ExpireResult,
    OrphanVacuumResult,
    TableStats,
    VacuumResult,
)
from flightsrv.table.maintenance.stats import (  # noqa: F401
    table_stats,
)
from flightsrv.table.maintenance.vacuum import (  # noqa: F401
    incarnation,
    vacuum,
    vacuum_orphan_prefixes,
)

__all__ = ["CompactResult", "ExpireResult", "TableStats", "VacuumResult", "compact",
           "expire_snapshots", "table_stats", "vacuum"]
