"""The model of test_groups_model_s29.py where random runs seldom go: a partition moves
away and comes back while its member, holding positions of it, hears nothing (or the
server tells it, in an answer its application has not seen), and the member then
commits by each way there is. Every example gets there; the machine checks each step
as in a random run."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.e2e.serverproc import ServerProcess
from tests.e2e.test_groups_model_s29 import GroupsMachine
from tidings.client.base import DEFAULT_MEDIA
from tidings.codec.media import JSON

pytestmark = pytest.mark.e2e


class _Drawn:
    """Stands in for hypothesis' ``data`` in steps chosen here."""

    def __init__(self, *values: object) -> None:
        self.values = list(values)

    def draw(self, strategy: object) -> object:
        return self.values.pop(0)


@settings(max_examples=12, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    start=st.sampled_from(["earliest", "latest"]),
    members=st.integers(1, 2),
    tell=st.booleans(),
    how=st.sampled_from(["plain", "one request", "begun at once", "aborted"]),
    json=st.booleans(),
)
def test_a_partition_that_moved_away_and_back_fences_what_its_member_held(
    server: ServerProcess, start: str, members: int, tell: bool, how: str, json: bool
) -> None:
    GroupsMachine.url = server.url
    GroupsMachine.media = JSON if json else DEFAULT_MEDIA
    machine = GroupsMachine()
    try:
        machine.choose_start(start)
        for _ in range(members):
            machine.add_member(100)
        # A message of each of the 4 partitions, so each member holds a position of
        # every partition it owns, the one that moves among them.
        machine.publish(8, 8)
        names = sorted(machine.members)
        for name in names:
            machine.poll(_Drawn(name))  # type: ignore[arg-type]
        owner = dict(machine.owner)
        machine.move_away_and_back(100, tell)
        assert machine.owner == owner  # back where they were...
        back = [n for n in names if machine._fenced(machine.members[n])]
        assert back  # ...held since a generation their members did not hear of
        for name in names:
            data = _Drawn(name)
            if how == "plain":
                machine.commit(data)  # type: ignore[arg-type]
            else:
                outcome = "abort" if how == "aborted" else "commit"
                defer = how != "begun at once"
                machine.commit_in_transaction(data, outcome, defer)  # type: ignore[arg-type]
            machine.check_describe()
        # Having heard (or been rewound), each member commits what comes since.
        for name in names:
            machine.drain(_Drawn(name))  # type: ignore[arg-type]
            machine.commit(_Drawn(name))  # type: ignore[arg-type]
            assert not machine._fenced(machine.members[name])
        machine.check_describe()
    finally:
        GroupsMachine.media = DEFAULT_MEDIA
        machine.teardown()
