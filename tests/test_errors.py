"""errors.py is the one registry: the drawn tree is the real hierarchy, and every error the
server can send comes back to the client as the same class."""

from __future__ import annotations

import inspect
import re

import pytest

import tidings
from tidings import errors
from tidings.errors import ClientError, TidingsError, error_for

_TREE_LINE = re.compile(r"^(?P<indent>[ │]*)(?:[├└]── )?(?P<name>[A-Z]\w+)\s*(?P<status>\d{3})?")


def _classes() -> dict[str, type[TidingsError]]:
    return {
        name: cls
        for name, cls in vars(errors).items()
        if inspect.isclass(cls) and issubclass(cls, TidingsError)
    }


def _drawn_tree() -> dict[str, tuple[str | None, int | None]]:
    """name -> (parent name, status) as the module docstring draws them."""
    doc = errors.__doc__ or ""
    block = doc.split("::", 1)[1].split("\n\n")[1]
    drawn: dict[str, tuple[str | None, int | None]] = {}
    stack: list[tuple[int, str]] = []
    for line in block.splitlines():
        match = _TREE_LINE.match(line.strip("\n")[4:] if line.startswith("    ") else line)
        assert match, f"cannot read the tree line {line!r}"
        depth = len(match["indent"]) // 4 + (1 if "──" in line else 0)
        while stack and stack[-1][0] >= depth:
            stack.pop()
        parent = stack[-1][1] if stack else None
        status = int(match["status"]) if match["status"] else None
        drawn[match["name"]] = (parent, status)
        stack.append((depth, match["name"]))
    return drawn


def test_the_drawn_tree_is_the_class_hierarchy() -> None:
    classes = _classes()
    drawn = _drawn_tree()
    assert set(drawn) == set(classes)
    for name, (parent, status) in drawn.items():
        cls = classes[name]
        if parent is None:
            assert cls is TidingsError
        else:
            assert cls.__bases__ == (classes[parent],), name
        if status is not None:
            assert cls.status == status, name


def test_every_class_is_exported() -> None:
    assert set(_classes()) <= set(errors.__all__)
    assert set(_classes()) <= set(tidings.__all__)


@pytest.mark.parametrize(
    "cls",
    [c for c in _classes().values() if not issubclass(c, ClientError)],
    ids=lambda c: c.__name__,
)
def test_every_wire_error_maps_back_to_its_class(cls: type[TidingsError]) -> None:
    sent = cls("what went wrong")
    body = sent.to_json()
    back = error_for(cls.status, body)
    assert type(back) is cls
    assert back.message == "what went wrong"
    assert back.retriable == cls.retriable


def test_an_unknown_type_falls_back_to_the_status() -> None:
    back = error_for(404, {"error": "gone", "type": "SomethingNew"})
    assert type(back) is errors.NotFound
    assert type(error_for(502, {"error": "proxy"})) is errors.ServerError
