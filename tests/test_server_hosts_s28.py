"""Which ``Host`` values a server answers (tidings/server/origin.py, DNS rebinding):
the rule for each kind of listening address, which the end-to-end tests (on 127.0.0.1
only) cannot all reach."""

from __future__ import annotations

import pytest

from tidings.errors import BadRequest
from tidings.server.origin import check_request, host_allowlist


def answers(listen: str, allowed: list[str], host: str, advertise: str | None = None) -> bool:
    hosts = host_allowlist(listen, allowed, advertise)
    return hosts is None or hosts.allows(host.encode("latin-1"))


@pytest.mark.parametrize("listen", ["127.0.0.1", "localhost", "::1", "127.0.0.5"])
@pytest.mark.parametrize(
    ("host", "answered"),
    [
        ("127.0.0.1:8470", True),
        ("localhost:8470", True),
        ("LocalHost.", True),
        ("[::1]:8470", True),
        ("[0:0:0:0:0:0:0:1]", True),
        ("127.9.8.7:1", True),
        ("localhost:", True),  # an empty port is the default one (RFC 3986)
        ("evil.example:8470", False),
        ("localhost.evil.example", False),
        ("localhost:84x0", False),
        ("localhost@evil.example", False),
        ("[::1", False),
        ("[::1]x", False),
        ("10.0.0.5:8470", False),
        ("", False),
    ],
)
def test_a_loopback_server_answers_loopback_names(listen: str, host: str, answered: bool) -> None:
    assert answers(listen, [], host) is answered


@pytest.mark.parametrize("listen", ["0.0.0.0", "::", "10.0.0.5"])
def test_another_address_answers_any_host_unless_allowed_hosts_is_set(listen: str) -> None:
    assert host_allowlist(listen, []) is None  # nothing checked, nothing spent
    assert answers(listen, ["tidings.example"], "tidings.example:8470")
    assert answers(listen, ["tidings.example"], "TIDINGS.EXAMPLE")
    assert not answers(listen, ["tidings.example"], "evil.example")
    assert not answers(listen, ["tidings.example"], "localhost:8470")  # only those listed
    assert not answers(listen, ["tidings.example"], "www.tidings.example")


def test_star_answers_any_host() -> None:
    assert host_allowlist("127.0.0.1", ["a.example", "*"]) is None


def test_the_servers_own_addresses_are_always_answered() -> None:
    """The other instances forward to the leader by its advertised URL: with
    ``allowed_hosts`` set to the name clients use, that hop must still be answered."""
    advertise = "http://node-a.internal:8470"
    assert answers("0.0.0.0", ["tidings.example"], "node-a.internal:8470", advertise)
    assert answers("10.0.0.5", ["tidings.example"], "10.0.0.5:8470")
    assert answers("0.0.0.0", ["tidings.example"], "[fd00::5]:8470", "http://[FD00::5]:8470")
    assert not answers("0.0.0.0", ["tidings.example"], "node-b.internal:8470", advertise)


def test_a_refused_host_is_a_bad_request_before_the_origin_check() -> None:
    hosts = host_allowlist("127.0.0.1", [])
    headers = [(b"host", b"evil.example:8470"), (b"origin", b"http://evil.example:8470")]
    for method in ("GET", "POST"):
        with pytest.raises(BadRequest, match="allowed_hosts"):
            check_request(method, headers, frozenset(), hosts)
    # Clients that send no Host (HTTP/1.0) are not browsers: answered.
    check_request("POST", [(b"content-type", b"application/json")], frozenset(), hosts)


def test_verdicts_are_remembered_for_a_bounded_number_of_hosts() -> None:
    hosts = host_allowlist("127.0.0.1", [])
    assert hosts is not None
    for n in range(3000):
        assert not hosts.allows(b"n%d.evil.example" % n)
    assert hosts.allows(b"127.0.0.1:8470")
    assert len(hosts._seen) <= 1024
