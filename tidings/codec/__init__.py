"""Encodings: row keys and message ids (:mod:`.keys`), stored values (:mod:`.values`),
and the REST request/response bodies (:mod:`.wire`). All pure functions."""
