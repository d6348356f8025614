"""Instances sharing one PostgreSQL store: the leader lease, its epoch, and the fence
every write of the leader carries (see :mod:`tidings.cluster.lease`).

Nothing here is imported unless the store is PostgreSQL, so the embedded set-up does
not need psycopg.
"""
