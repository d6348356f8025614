"""The asyncio client: the one source of the client's I/O code.

Every module here except :mod:`.concurrency` is also written, with the awaits taken
out, to :mod:`tidings.client._sync` by ``python scripts/unasync.py`` (a test checks
that regenerating changes nothing). Edit these files, never the generated ones. What
the two sides wait on differently (tasks or threads, asyncio or threading conditions)
is in each side's own ``concurrency`` module, with the same names; the rare lines
that differ otherwise sit between ``# ---- async only`` / ``# ---- sync only`` /
``# ---- end`` markers, the sync lines written as comments.
"""
