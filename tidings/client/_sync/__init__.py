"""The sync client, generated from :mod:`tidings.client._async` by
``python scripts/unasync.py``; only :mod:`.concurrency` is written by hand."""
