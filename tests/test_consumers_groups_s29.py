"""The group record keeps since when each owner holds its partitions (zombie fencing:
docs/design.md, "Consumer groups")."""

from __future__ import annotations

import orjson

from tidings.codec.groups import GroupRecord, Member, decode_group, encode_group


def test_a_group_record_keeps_since_when_each_partition_is_held() -> None:
    record = GroupRecord(4, 5, {"a": Member(1000, (0, 1)), "b": Member(1000, (2, 3))},
                         "earliest", {0: 1, 1: 5, 2: 3, 3: 5})  # fmt: skip
    assert decode_group(encode_group(record)) == record


def test_a_group_record_written_before_it_kept_since_still_reads() -> None:
    # Nothing known of the owners' tenure: no commit is fenced by it until a rebalance.
    raw = orjson.dumps(
        {"partitions": 2, "generation": 3, "start": "latest",
         "members": {"a": {"timeoutMs": 1000, "partitions": [0, 1]}}}
    )  # fmt: skip
    record = decode_group(raw)
    assert record.since == {}
    assert record.members["a"].partitions == (0, 1)
