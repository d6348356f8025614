"""Encodings: row keys and message ids (:mod:`.keys`), stored values (:mod:`.values`),
the REST request/response bodies (:mod:`.wire`) and a transaction snapshot's wire form
(:mod:`.transaction`). All pure functions."""
