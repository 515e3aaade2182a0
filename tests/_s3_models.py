"""botocore's service models, parsed once per process that makes many S3 clients.

botocore gives every new session its own loader, and a loader parses the S3 model and the
endpoint rules again on the first client it builds: about 0.1-0.3 s of CPU per client. A
process that opens one store (a CLI command, a server) pays that once; the test suite opens
hundreds of stores per process, and forks dozens of workers that each open one. So:

- ``share_loader()`` (the test process, ``tests/conftest.py``): every session of the process
  reads the models through one loader. The loader caches immutable JSON only, as one
  session's clients share it already; sessions, credentials and configuration stay per
  client, read from the environment as before.
- ``warm()`` (the fork server of ``support.worker_processes``, through ``_s3_warm``) also
  builds one client there, so the parsed models are in memory before any worker is forked.
"""

from __future__ import annotations

import functools

import botocore.loaders
import botocore.session


def share_loader() -> None:
    if not hasattr(botocore.session.create_loader, "cache_info"):
        botocore.session.create_loader = functools.lru_cache(maxsize=None)(
            botocore.loaders.create_loader)


def warm() -> None:
    """Build (and drop) one S3 client: it sends no request, it only parses the models. Any
    failure (an AWS_PROFILE the config lacks) leaves the process as it was: its workers then
    parse the models themselves."""
    share_loader()
    try:
        botocore.session.Session().create_client(
            "s3", region_name="us-east-1", endpoint_url="http://127.0.0.1:9",
            aws_access_key_id="x", aws_secret_access_key="x")
    except Exception:  # noqa: BLE001 - only a cost saving
        pass
