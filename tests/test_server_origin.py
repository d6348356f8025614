"""The rule that tells a browser's cross-site write apart (tidings/server/origin.py)."""

from __future__ import annotations

import pytest

from tidings.server.origin import allowed_set, normalize_origin, refused_origin

ALLOWED = allowed_set(["https://Console.Example/"])


@pytest.mark.parametrize(
    ("origin", "host"),
    [
        ("http://127.0.0.1:8470", "127.0.0.1:8470"),
        ("http://LOCALHOST:8470", "localhost:8470"),
        ("https://tidings.example", "tidings.example:443"),  # Host names the default port
        ("http://[::1]:8470", "[::1]:8470"),
        ("https://console.example", "127.0.0.1:8470"),  # allowed
        ("HTTPS://console.example", None),  # allowed, whatever the Host
    ],
)
def test_accepted(origin: str, host: str | None) -> None:
    assert not refused_origin(origin, host, ALLOWED)


@pytest.mark.parametrize(
    ("origin", "host"),
    [
        ("http://evil.example", "127.0.0.1:8470"),
        ("http://127.0.0.1", "127.0.0.1:8470"),  # another port is another origin
        ("http://127.0.0.1:8470", "127.0.0.1:8471"),
        ("https://tidings.example", "tidings.example:80"),  # not https's default port
        ("null", "127.0.0.1:8470"),
        ("null", None),
        ("http://127.0.0.1:8470", None),  # no Host: nothing is its own origin
        ("https://console.example.evil", "127.0.0.1:8470"),
    ],
)
def test_refused(origin: str, host: str | None) -> None:
    assert refused_origin(origin, host, ALLOWED)


@pytest.mark.parametrize("text", ["*", "null", "console.example", "https://a.example/app", ""])
def test_what_is_not_an_origin(text: str) -> None:
    with pytest.raises(ValueError):
        normalize_origin(text)
