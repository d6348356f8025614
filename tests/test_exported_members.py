"""``tidings.__all__`` lists exactly the public names of the package (httpx's check)."""

from __future__ import annotations

import types

import tidings


def test_all_is_exactly_the_public_names() -> None:
    import tidings.client

    # The client's names load on first use: they are the client module's own.
    assert sorted(tidings._client_names) == sorted(tidings.client.__all__)
    public = {
        name
        for name in dir(tidings)
        if not name.startswith("_") and not isinstance(getattr(tidings, name), types.ModuleType)
    }
    assert len(tidings.__all__) == len(set(tidings.__all__)), "duplicates in __all__"
    assert set(tidings.__all__) == public


def test_every_exported_name_resolves() -> None:
    for name in tidings.__all__:
        assert getattr(tidings, name) is not None, name


def test_exported_errors_are_the_errors_module() -> None:
    import tidings.errors

    assert set(tidings.errors.__all__) <= set(tidings.__all__)
