"""The splice engine's one refusal: this file cannot be spliced faithfully."""

from __future__ import annotations

from flightsrv.errors import ConfigurationError


class SpliceUnsupported(ConfigurationError):
    """The file cannot be spliced faithfully (pyarrow cannot reproduce its physical schema,
    unusual layout, encryption). The caller should fall back to a copy-on-write rewrite."""
