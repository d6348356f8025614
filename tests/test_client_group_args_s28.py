"""A group consumer refuses the plain consumer's arguments instead of ignoring them."""

from __future__ import annotations

import asyncio

import pytest

import tidings


@pytest.mark.parametrize("kwargs", [{"transactional": False}, {"inclusive": False}])
def test_a_group_refuses_what_only_a_plain_consumer_does(kwargs: dict[str, bool]) -> None:
    with tidings.Client("http://127.0.0.1:9") as client:
        with pytest.raises(ValueError, match="group"):
            client.consume("t", group="g", **kwargs)  # type: ignore[call-overload]
        # The plain consumer takes them.
        client.consume("t", **kwargs).close()


@pytest.mark.parametrize("kwargs", [{"transactional": False}, {"inclusive": False}])
def test_an_async_group_refuses_them_too(kwargs: dict[str, bool]) -> None:
    async def main() -> None:
        async with tidings.AsyncClient("http://127.0.0.1:9") as client:
            with pytest.raises(ValueError, match="group"):
                client.consume("t", group="g", **kwargs)  # type: ignore[call-overload]

    asyncio.run(main())
