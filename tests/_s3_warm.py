"""Preloaded by the fork server of ``support.worker_processes``: botocore's models parsed
there once, not in every forked worker that opens an S3 store (``_s3_models``)."""

from tests._s3_models import warm

warm()
