"""A model of who may do what, checked call by call against one real server started
with an auth file (hypothesis' stateful testing, docs/security.md).

Principals get random grants (admin, ``publish``, ``consume`` and ``transactional_ids``
patterns over a handful of topics in two namespaces, and ``groups`` and ``queues``
patterns or none, which is every group and queue); rules rewrite the auth file and
reload it (``SIGHUP``, also with a file that does not load), and make random calls as
a random principal, with no token or with a token nobody has: publish, poll, stats,
the topic list, topic create, delete and properties, consumer groups (join, commit,
describe, list, reset, delete), queues (pop, with a dead-letter topic or not, ack,
describe, purge, the namespace's list), transactions (begin, commit, abort and
invalidate, with or without the transactional id, producers, the one-request
transaction), the admin endpoints, ``/metrics``, ``/v1/whoami`` and the console's
message pages; through the real client or raw HTTP.

Each call must be allowed exactly when the table says: a refusal is 401 (no token, or
an unknown one) or 403 ``Forbidden``, with a JSON ``{"error"}`` body that echoes no
token, and changes nothing (checked with an admin principal); nothing answers 500;
and no answer names a topic of the model that the caller may neither publish to nor
consume and did not name itself (``/metrics`` aside: documented as showing every
topic to whoever may read it).

``TIDINGS_SECURITY_MODEL_EXAMPLES`` and ``TIDINGS_SECURITY_MODEL_STEPS`` run more (to
hunt for bugs locally).
"""

from __future__ import annotations

import base64
import fnmatch
import hashlib
import json
import os
import re
import signal
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    precondition,
    rule,
    run_state_machine_as_test,
)

from tests.e2e.serverproc import ServerProcess
from tidings import Client
from tidings.errors import Forbidden, TidingsError, Unauthorized

pytestmark = pytest.mark.e2e

NAMESPACES = ("default", "n2")
#: Topic names are the run's prefix plus one of these: none is a part of another.
SUFFIXES = ("xa", "xb", "ya")
#: Pattern tails (after the run's prefix), and patterns of their own.
PATTERN_TAILS = ("x*", "xa", "ya", "y*", "*")
TID_TAILS = ("ta", "tb")
TID_PATTERN_TAILS = ("t*", "ta", "tb")
#: Group and queue name patterns (the names are g1, g2 and q1, q2).
NAME_PATTERNS = ("g1", "g*", "q1", "q*", "*")
NAMES = ("p0", "p1", "p2")
#: Callers: a principal of the model, a token no principal has, no token at all.
GHOST, ANONYMOUS = "ghost", "anonymous"
CALLERS = (*NAMES, GHOST, ANONYMOUS)

OK, UNAUTHORIZED, FORBIDDEN = "ok", "unauthorized", "forbidden"
#: The admin every auth file of the module keeps, which checks what calls changed.
ADMIN_NAME = "root"
ROOT_TOKEN = "root-" + uuid.uuid4().hex
#: The calls of ``other_calls`` that name a transaction's write pointer.
WRITE_POINTER_CALLS = ("rollback", "queue-rollback")


@dataclass(frozen=True)
class Grants:
    """One principal as the auth file has it."""

    token: str
    admin: bool = False
    publish: tuple[str, ...] = ()
    consume: tuple[str, ...] = ()
    tids: tuple[str, ...] = ()
    #: None: the field left out (every group or queue of a topic it may consume).
    groups: tuple[str, ...] | None = None
    queues: tuple[str, ...] | None = None

    def may_publish(self, topic: str) -> bool:
        return self.admin or any(fnmatch.fnmatchcase(topic, p) for p in self.publish)

    def may_consume(self, topic: str) -> bool:
        return self.admin or any(fnmatch.fnmatchcase(topic, p) for p in self.consume)

    def may_use(self, tid: str) -> bool:
        return self.admin or any(fnmatch.fnmatchcase(tid, p) for p in self.tids)

    def may_group(self, topic: str, group: str) -> bool:
        return self.may_consume(topic) and (
            self.admin
            or self.groups is None
            or any(fnmatch.fnmatchcase(group, p) for p in self.groups)
        )

    def may_queue(self, topic: str, queue: str) -> bool:
        return self.may_consume(topic) and (
            self.admin
            or self.queues is None
            or any(fnmatch.fnmatchcase(queue, p) for p in self.queues)
        )


def _lines(name: str, grants: Grants) -> str:
    digest = hashlib.sha256(grants.token.encode()).hexdigest()

    def listed(values: tuple[str, ...]) -> str:
        return "[" + ", ".join(f'"{v}"' for v in values) + "]"

    optional = "".join(
        f"{key} = {listed(values)}\n"
        for key, values in (("groups", grants.groups), ("queues", grants.queues))
        if values is not None
    )
    return (
        f'[[principal]]\nname = "{name}"\ntoken_sha256 = "{digest}"\n'
        f"admin = {'true' if grants.admin else 'false'}\n"
        f"publish = {listed(grants.publish)}\nconsume = {listed(grants.consume)}\n"
        f"transactional_ids = {listed(grants.tids)}\n{optional}"
    )


#: What the grants strategy draws: admin, publish, consume, transactional ids, groups
#: and queues (None: left out of the file).
RawGrants = tuple[bool, list[str], list[str], list[str], list[str] | None, list[str] | None]


@dataclass
class OpenTx:
    """A transaction the model began: under which transactional id, if any."""

    tid: str | None
    epoch: int | None
    #: Its producer registered again since (fenced): how it ended is the server's.
    fenced: bool = False


@dataclass
class QueueModel:
    """What the model knows of a queue: ids leased per consumer."""

    leased: dict[str, list[str]] = field(default_factory=dict)


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServerProcess, Path]]:
    """One server for every example, with an auth file the examples rewrite and
    ``metrics_auth`` (so ``/metrics`` takes any principal)."""
    where = tmp_path_factory.mktemp("secmodel")
    path = where / "auth.toml"
    path.write_text(_lines(ADMIN_NAME, Grants(ROOT_TOKEN, admin=True)))
    proc = ServerProcess(where / "data", ["--auth-file", str(path)], {"TIDINGS_METRICS_AUTH": "1"})
    proc.start()
    try:
        yield proc, path
    finally:
        proc.kill()


class SecurityModel(RuleBasedStateMachine):
    """Principals, topics, groups, queues and transactions of one example (its topics
    and transactional ids under a prefix of its own), and the calls against them."""

    server: ServerProcess
    auth_path: Path

    def __init__(self) -> None:
        super().__init__()
        self.run = "s" + uuid.uuid4().hex[:8] + "-"
        self.principals: dict[str, Grants] = {}
        self.topics: set[tuple[str, str]] = set()
        self.counts: dict[tuple[str, str], int] = {}
        #: (ns, topic, group) -> member ids joined.
        self.groups: dict[tuple[str, str, str], list[str]] = {}
        self.queues: dict[tuple[str, str, str], QueueModel] = {}
        self.open: dict[int, OpenTx] = {}
        self.epochs: dict[str, int] = {}
        self.reloads = 0
        #: A principal of each version of the auth file: in force once it is known.
        self.marker, self.marker_token = "", ""
        self.http = httpx.Client(base_url=self.server.url, timeout=20)
        self.clients: dict[str, Client] = {}

    def teardown(self) -> None:
        # Its transactions would stay open until they time out, holding back
        # read-committed readers of every later example.
        for wp in list(self.open):
            self.http.post(f"/v1/transactions/{wp}/invalidate", json={}, headers=self._root())
        for client in self.clients.values():
            client.close()
        self.http.close()

    # --- helpers -------------------------------------------------------------------

    def topic(self, suffix: str) -> str:
        return self.run + suffix

    def tid(self, tail: str) -> str:
        return self.run + tail

    def _root(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {ROOT_TOKEN}"}

    def headers(self, caller: str) -> dict[str, str]:
        if caller == ANONYMOUS:
            return {}
        if caller == GHOST:
            return {"Authorization": "Bearer ghost-" + self.run}
        if caller not in self.principals:  # removed by a reload: its old token
            return {"Authorization": "Bearer gone-" + self.run + caller}
        return {"Authorization": f"Bearer {self.principals[caller].token}"}

    def token_of(self, caller: str) -> str | None:
        found = self.headers(caller).get("Authorization")
        return None if found is None else found.removeprefix("Bearer ")

    def client(self, caller: str, ns: str) -> Client:
        key = f"{caller}:{self.token_of(caller)}:{ns}"
        if key not in self.clients:
            self.clients[key] = Client(self.server.url, ns, token=self.token_of(caller))
        return self.clients[key]

    def grants(self, caller: str) -> Grants | None:
        return self.principals.get(caller)

    def expect(self, caller: str, allowed: bool) -> str:
        if self.grants(caller) is None:
            return UNAUTHORIZED
        return OK if allowed else FORBIDDEN

    def visible(self, caller: str, topic: str) -> bool:
        g = self.grants(caller)
        return g is not None and (g.may_publish(topic) or g.may_consume(topic))

    def may(self, caller: str, what: str, topic: str = "", name: str = "") -> bool:
        g = self.grants(caller)
        if g is None:
            return False
        if what == "group":
            return g.may_group(topic, name)
        if what == "queue":
            return g.may_queue(topic, name)
        if what == "admin":
            return g.admin
        if what == "publish":
            return g.may_publish(topic)
        if what == "consume":
            return g.may_consume(topic)
        if what == "topic":
            return g.may_publish(topic) or g.may_consume(topic)
        if what == "any":
            return True
        raise AssertionError(what)

    def raw(
        self, caller: str, method: str, path: str, body: Any = None, named: tuple[str, ...] = ()
    ) -> httpx.Response:
        answer = self.http.request(
            method, path, json=body, headers=self.headers(caller)
        )  # fmt: skip
        self.check_answer(caller, answer.status_code, answer.text, named, path)
        return answer

    def check_answer(
        self, caller: str, status: int, text: str, named: tuple[str, ...], what: str
    ) -> None:
        assert status < 500 or status == 503, f"{what} as {caller}: {status} {text[:500]}"
        if status >= 400:
            body = _json(text)
            assert isinstance(body, dict) and isinstance(body.get("error"), str), (what, text)
        token = self.token_of(caller)
        if token is not None:
            assert token not in text, f"{what} echoes the token"
        self.check_no_leak(caller, text, named, what)

    def check_no_leak(self, caller: str, text: str, named: tuple[str, ...], what: str) -> None:
        g = self.grants(caller)
        if g is not None and g.admin:
            return
        for suffix in SUFFIXES:
            name = self.topic(suffix)
            if name in named or self.visible(caller, name):
                continue
            assert not _mentions(text, name), f"{what} as {caller} shows {name}: {text[:500]}"

    def outcome(self, caller: str, expected: str, status: int, kind: str | None, what: str) -> None:
        """The answer's status against what the table says."""
        if expected == UNAUTHORIZED:
            assert status == 401 and kind == "Unauthorized", f"{what} as {caller}: {status}"
        elif expected == FORBIDDEN:
            assert status == 403 and kind == "Forbidden", f"{what} as {caller}: {status} {kind}"
        else:
            assert status not in (401,) and kind != "Forbidden", (
                f"{what} as {caller}: {status} {kind}, the table allows it"
            )

    def checked(
        self,
        caller: str,
        expected: str,
        method: str,
        path: str,
        body: Any = None,
        named: tuple[str, ...] = (),
    ) -> httpx.Response:
        answer = self.raw(caller, method, path, body, named)
        kind = _json(answer.text).get("type") if answer.status_code >= 400 else None
        self.outcome(caller, expected, answer.status_code, kind, f"{method} {path}")
        return answer

    def via_client(
        self, caller: str, expected: str, ns: str, call: Any, what: str, named: tuple[str, ...]
    ) -> tuple[Any, TidingsError | None]:
        """``call(client)`` through the real client: the typed exception it raises."""
        try:
            result = call(self.client(caller, ns))
        except TidingsError as exc:
            self.check_answer(caller, exc.status, _error_json(exc), named, what)
            if expected == UNAUTHORIZED:
                assert type(exc) is Unauthorized, f"{what} as {caller}: {exc!r}"
            elif expected == FORBIDDEN:
                assert type(exc) is Forbidden, f"{what} as {caller}: {exc!r}"
            else:
                assert not isinstance(exc, Unauthorized) and type(exc) is not Forbidden, (
                    f"{what} as {caller}: {exc!r}, the table allows it"
                )
            return None, exc
        assert expected == OK, f"{what} as {caller} went through: {result!r}"
        self.check_no_leak(caller, repr(result), named, what)
        return result, None

    def root_get(self, path: str) -> httpx.Response:
        return self.http.get(path, headers=self._root())

    def count(self, ns: str, topic: str) -> int:
        answer = self.root_get(f"/v1/namespaces/{ns}/topics/{topic}/stats")
        if answer.status_code == 404:
            return -1
        assert answer.status_code == 200, answer.text
        return int(answer.json()["messageCount"])

    def model_count(self, ns: str, topic: str) -> int:
        return self.counts.get((ns, topic), 0) if (ns, topic) in self.topics else -1

    def in_progress(self) -> set[int]:
        answer = self.root_get("/v1/transactions")
        assert answer.status_code == 200, answer.text
        return {t["writePointer"] for t in answer.json()["inProgress"]}

    def write_auth(self) -> None:
        text = _lines(ADMIN_NAME, Grants(ROOT_TOKEN, admin=True))
        text += "".join(_lines(name, g) for name, g in sorted(self.principals.items()))
        self.marker = f"marker-{self.run}{self.reloads}"
        self.marker_token = uuid.uuid4().hex
        text += _lines(self.marker, Grants(self.marker_token))
        tmp = self.auth_path.with_suffix(".tmp")
        tmp.write_text(text)
        tmp.replace(self.auth_path)

    def reload(self) -> None:
        """Rewrite the auth file from the model and SIGHUP; return once it is in force."""
        self.reloads += 1
        self.write_auth()
        assert self.server.proc is not None
        os.kill(self.server.proc.pid, signal.SIGHUP)
        deadline = time.monotonic() + 10
        while True:
            who = self.http.get(
                "/v1/whoami", headers={"Authorization": f"Bearer {self.marker_token}"}
            ).json()
            if who["name"] == self.marker:
                return
            assert time.monotonic() < deadline, "the auth file was not reloaded"
            time.sleep(0.02)

    # --- principals ---------------------------------------------------------------

    names_strategy = st.none() | st.lists(st.sampled_from(NAME_PATTERNS), max_size=2, unique=True)
    grants_strategy = st.builds(
        lambda admin, pub, con, tids, groups, queues: (admin, pub, con, tids, groups, queues),
        st.integers(0, 6).map(lambda n: n == 0),
        st.lists(st.sampled_from(PATTERN_TAILS), max_size=3, unique=True),
        st.lists(st.sampled_from(PATTERN_TAILS), max_size=3, unique=True),
        st.lists(st.sampled_from(TID_PATTERN_TAILS), max_size=2, unique=True),
        names_strategy,
        names_strategy,
    )

    def make_grants(self, raw: RawGrants) -> Grants:
        admin, pub, con, tids, groups, queues = raw
        return Grants(
            token="tok-" + uuid.uuid4().hex,
            admin=admin,
            publish=tuple(self.run + p for p in pub),
            consume=tuple(self.run + p for p in con),
            tids=tuple(self.run + p for p in tids),
            groups=None if groups is None else tuple(groups),
            queues=None if queues is None else tuple(queues),
        )

    @initialize(every=st.lists(grants_strategy, min_size=3, max_size=3))
    def start(self, every: list[RawGrants]) -> None:
        for name, raw in zip(NAMES, every, strict=True):
            self.principals[name] = self.make_grants(raw)
        self.reload()
        # A topic or two to begin with, so that most calls find one.
        for ns in NAMESPACES:
            for suffix in SUFFIXES[:2]:
                answer = self.http.put(
                    f"/v1/namespaces/{ns}/topics/{self.topic(suffix)}", json={},
                    headers=self._root(),
                )  # fmt: skip
                assert answer.status_code == 200, answer.text
                self.topics.add((ns, self.topic(suffix)))

    @rule(
        name=st.sampled_from(NAMES),
        raw=grants_strategy,
        how=st.sampled_from(["set", "rotate", "remove"]),
    )
    def change_principal(self, name: str, raw: RawGrants, how: str) -> None:
        if how == "remove":
            self.principals.pop(name, None)
        elif how == "rotate" and name in self.principals:
            self.principals[name] = replace(self.principals[name], token="tok-" + uuid.uuid4().hex)
        else:
            self.principals[name] = self.make_grants(raw)
        self.reload()

    @rule()
    def broken_reload(self) -> None:
        # A file that does not load is refused, and the principals stay as they were.
        before = self.server.log().count("auth file not reloaded")
        self.auth_path.write_text('[[principal]]\nname = "x"\ntoken_sha256 = "00"\n')
        assert self.server.proc is not None
        os.kill(self.server.proc.pid, signal.SIGHUP)
        deadline = time.monotonic() + 10
        while self.server.log().count("auth file not reloaded") == before:
            assert time.monotonic() < deadline, "the broken auth file was not refused"
            time.sleep(0.02)
        self.write_auth()  # back on disk as the server still has it
        for name, g in self.principals.items():
            who = self.http.get("/v1/whoami", headers=self.headers(name)).json()
            assert who["name"] == name and who["admin"] == g.admin, who

    # --- topics ---------------------------------------------------------------------

    callers = st.sampled_from(CALLERS)
    namespaces = st.sampled_from(NAMESPACES)
    suffixes = st.sampled_from(SUFFIXES)

    @rule(caller=callers)
    def whoami(self, caller: str) -> None:
        who = self.raw(caller, "GET", "/v1/whoami").json()
        g = self.grants(caller)
        if g is None:
            assert who["name"] is None and not who["admin"], who
        else:
            assert who["name"] == caller and who["admin"] == g.admin
            assert tuple(who["publish"]) == g.publish and tuple(who["consume"]) == g.consume

    @rule(caller=callers, ns=namespaces, suffix=suffixes, client=st.booleans())
    def create_topic(self, caller: str, ns: str, suffix: str, client: bool) -> None:
        topic = self.topic(suffix)
        expected = self.expect(caller, self.may(caller, "admin"))
        existed = (ns, topic) in self.topics
        if client:
            _, error = self.via_client(
                caller, expected, ns, lambda c: c.create_topic(topic), "create", (topic,)
            )
            status = 200 if error is None else error.status
        else:
            status = self.checked(
                caller, expected, "PUT", f"/v1/namespaces/{ns}/topics/{topic}", {}, (topic,)
            ).status_code
        if expected == OK:
            assert status == (409 if existed else 200), status
            self.topics.add((ns, topic))
        assert self.count(ns, topic) == self.model_count(ns, topic)

    @rule(caller=callers, ns=namespaces, suffix=suffixes)
    def delete_topic(self, caller: str, ns: str, suffix: str) -> None:
        topic = self.topic(suffix)
        expected = self.expect(caller, self.may(caller, "admin"))
        answer = self.checked(
            caller, expected, "DELETE", f"/v1/namespaces/{ns}/topics/{topic}", None, (topic,)
        )
        if expected == OK:
            assert answer.status_code == (200 if (ns, topic) in self.topics else 404)
            self.topics.discard((ns, topic))
            self.counts.pop((ns, topic), None)
            for key in [k for k in self.groups if k[:2] == (ns, topic)]:
                del self.groups[key]
            for key in [k for k in self.queues if k[:2] == (ns, topic)]:
                del self.queues[key]
        assert self.count(ns, topic) == self.model_count(ns, topic)

    @rule(caller=callers, ns=namespaces, suffix=suffixes)
    def update_properties(self, caller: str, ns: str, suffix: str) -> None:
        topic = self.topic(suffix)
        expected = self.expect(caller, self.may(caller, "admin"))
        path = f"/v1/namespaces/{ns}/topics/{topic}"
        before = self.root_get(path).text
        answer = self.checked(caller, expected, "PUT", path + "/properties", {}, (topic,))
        if expected != OK:
            assert self.root_get(path).text == before
        elif (ns, topic) not in self.topics:
            assert answer.status_code == 404

    @rule(caller=callers, ns=namespaces, suffix=suffixes, client=st.booleans())
    def publish(self, caller: str, ns: str, suffix: str, client: bool) -> None:
        topic = self.topic(suffix)
        expected = self.expect(caller, self.may(caller, "publish", topic))
        if client:
            _, error = self.via_client(
                caller, expected, ns, lambda c: c.publish(topic, [b"m"]), "publish", (topic,)
            )
            status = 200 if error is None else error.status
        else:
            body = {"messages": [base64.b64encode(b"m").decode()]}
            path = f"/v1/namespaces/{ns}/topics/{topic}/publish"
            status = self.checked(caller, expected, "POST", path, body, (topic,)).status_code
        if expected == OK:
            exists = (ns, topic) in self.topics
            assert status == (200 if exists else 404), status
            if exists:
                self.counts[(ns, topic)] = self.counts.get((ns, topic), 0) + 1
        assert self.count(ns, topic) == self.model_count(ns, topic)

    @rule(caller=callers, ns=namespaces, suffix=suffixes, client=st.booleans())
    def poll(self, caller: str, ns: str, suffix: str, client: bool) -> None:
        topic = self.topic(suffix)
        expected = self.expect(caller, self.may(caller, "consume", topic))
        if client:
            found, error = self.via_client(
                caller, expected, ns, lambda c: c.poll(topic, limit=1000), "poll", (topic,)
            )
            status = 200 if error is None else error.status
            got = None if found is None else len(found)
        else:
            path = f"/v1/namespaces/{ns}/topics/{topic}/poll"
            answer = self.checked(caller, expected, "POST", path, {"limit": 1000}, (topic,))
            status = answer.status_code
            got = len(answer.json()) if status == 200 else None
        if expected == OK:
            if (ns, topic) in self.topics:
                assert status == 200 and got == self.model_count(ns, topic)
            else:
                assert status == 404

    @rule(
        caller=callers,
        ns=namespaces,
        suffix=suffixes,
        what=st.sampled_from(["stats", "meta", "end", "messages"]),
    )
    def topic_reads(self, caller: str, ns: str, suffix: str, what: str) -> None:
        topic = self.topic(suffix)
        need = {"stats": "topic", "meta": "topic", "end": "consume", "messages": "consume"}[what]
        expected = self.expect(caller, self.may(caller, need, topic))
        path = f"/v1/namespaces/{ns}/topics/{topic}" + {
            "stats": "/stats", "meta": "", "end": "/end", "messages": "/messages?limit=1000",
        }[what]  # fmt: skip
        answer = self.checked(caller, expected, "GET", path, None, (topic,))
        if expected != OK:
            return
        if (ns, topic) not in self.topics:
            assert answer.status_code == 404, answer.text
            return
        assert answer.status_code == 200, answer.text
        if what == "stats":
            stats = answer.json()
            assert stats["messageCount"] == self.model_count(ns, topic)
            groups = {
                k[2]
                for k in self.groups
                if k[:2] == (ns, topic) and self.may(caller, "group", topic, k[2])
            }
            if self.may(caller, "consume", topic):
                assert set(stats["groupLag"]) <= groups, stats
            else:
                assert stats["groupLag"] == {}, stats
        elif what == "messages":
            assert len(answer.json()) == self.model_count(ns, topic)

    @rule(caller=callers, ns=namespaces, client=st.booleans())
    def list_topics(self, caller: str, ns: str, client: bool) -> None:
        expected = self.expect(caller, True)
        if client:
            listed, _ = self.via_client(caller, expected, ns, lambda c: c.list_topics(), "list", ())
        else:
            answer = self.checked(caller, expected, "GET", f"/v1/namespaces/{ns}/topics")
            listed = answer.json() if answer.status_code == 200 else None
        if listed is None:
            return
        mine = {t for t in listed if t.startswith(self.run)}
        assert mine == {t for n, t in self.topics if n == ns and self.visible(caller, t)}, mine

    # --- consumer groups ------------------------------------------------------------

    groups_ = st.sampled_from(("g1", "g2"))

    @rule(caller=callers, ns=namespaces, suffix=suffixes, group=groups_)
    def join(self, caller: str, ns: str, suffix: str, group: str) -> None:
        topic = self.topic(suffix)
        expected = self.expect(caller, self.may(caller, "group", topic, group))
        path = f"/v1/namespaces/{ns}/topics/{topic}/groups/{group}"
        before = self.root_get(path).status_code
        answer = self.checked(
            caller, expected, "POST", path + "/join", {"sessionTimeoutMs": 300000}, (topic,)
        )
        if expected == OK:
            if (ns, topic) in self.topics:
                assert answer.status_code == 200, answer.text
                self.groups.setdefault((ns, topic, group), []).append(answer.json()["memberId"])
            else:
                assert answer.status_code == 404
        else:
            assert self.root_get(path).status_code == before

    @rule(
        caller=callers,
        ns=namespaces,
        suffix=suffixes,
        group=groups_,
        what=st.sampled_from(["describe", "list", "commit", "leave", "reset", "delete"]),
    )
    def group_call(self, caller: str, ns: str, suffix: str, group: str, what: str) -> None:
        topic = self.topic(suffix)
        key = (ns, topic, group)
        members = self.groups.get(key, [])
        member = members[-1] if members else "m-none"
        need = {"reset": "admin", "delete": "admin", "list": "consume"}.get(what, "group")
        expected = self.expect(caller, self.may(caller, need, topic, group))
        base = f"/v1/namespaces/{ns}/topics/{topic}/groups"
        path = f"{base}/{group}"
        before = self.root_get(path).json()
        method, url, body = {
            "describe": ("GET", path, None),
            "list": ("GET", base, None),
            "commit": ("POST", path + "/commit", {"memberId": member, "positions": []}),
            "leave": ("POST", path + "/leave", {"memberId": member}),
            "reset": ("POST", path + "/reset", {"to": "earliest"}),
            "delete": ("DELETE", path, None),
        }[what]
        answer = self.checked(caller, expected, method, url, body, (topic,))
        if expected != OK:
            assert self.root_get(path).json() == before
            return
        if what == "list" and answer.status_code == 200:
            assert set(answer.json()) == {
                k[2]
                for k in self.groups
                if k[:2] == (ns, topic) and self.may(caller, "group", topic, k[2])
            }
        if answer.status_code == 200 and what == "leave":
            members.remove(member)
        if answer.status_code == 200 and what == "delete":
            self.groups.pop(key, None)

    # --- queues ---------------------------------------------------------------------

    queues_ = st.sampled_from(("q1", "q2"))

    @rule(
        caller=callers,
        ns=namespaces,
        suffix=suffixes,
        queue=queues_,
        dead=st.none() | suffixes,
        worker=st.sampled_from(("w1", "w2")),
    )
    def pop(
        self, caller: str, ns: str, suffix: str, queue: str, dead: str | None, worker: str
    ) -> None:
        topic = self.topic(suffix)
        if dead == suffix:  # refused as bad input (400), not what this checks
            dead = None
        allowed = self.may(caller, "queue", topic, queue)
        body: dict[str, Any] = {"consumerId": worker, "maxMessages": 2, "ackTimeoutMs": 600000}
        named = (topic,)
        if dead is not None:
            body["deadLetterTopic"] = self.topic(dead)
            named = (topic, self.topic(dead))
            allowed = allowed and self.may(caller, "publish", self.topic(dead))
        expected = self.expect(caller, allowed)
        listing = f"/v1/namespaces/{ns}/topics/{topic}/queues"
        path = f"{listing}/{queue}"
        before = (self.root_get(listing).text, self.root_get(path).text)
        answer = self.checked(caller, expected, "POST", path + "/pop", body, named)
        if expected != OK:
            assert (self.root_get(listing).text, _stable(self.root_get(path))) == (
                before[0],
                _stable_text(before[1]),
            )
            return
        if (ns, topic) not in self.topics:
            assert answer.status_code == 404, answer.text
            return
        assert answer.status_code == 200, answer.text
        ids = [m["id"] for m in answer.json()]
        model = self.queues.setdefault((ns, topic, queue), QueueModel())
        model.leased.setdefault(worker, []).extend(ids)

    @rule(
        caller=callers,
        ns=namespaces,
        suffix=suffixes,
        queue=queues_,
        what=st.sampled_from(["ack", "describe", "list", "purge", "delete", "release"]),
    )
    def queue_call(self, caller: str, ns: str, suffix: str, queue: str, what: str) -> None:
        topic = self.topic(suffix)
        key = (ns, topic, queue)
        model = self.queues.get(key)
        worker, ids = "w1", []
        if model is not None:
            for w, leased in model.leased.items():
                if leased:
                    worker, ids = w, leased[:1]
                    break
        need = {"purge": "admin", "delete": "admin", "list": "consume"}.get(what, "queue")
        expected = self.expect(caller, self.may(caller, need, topic, queue))
        listing = f"/v1/namespaces/{ns}/topics/{topic}/queues"
        path = f"{listing}/{queue}"
        before = _stable(self.root_get(path))
        method, url, body = {
            "ack": ("POST", path + "/ack", {"consumerId": worker, "ids": ids}),
            "describe": ("GET", path, None),
            "list": ("GET", listing, None),
            "purge": ("POST", path + "/purge", None),
            "delete": ("DELETE", path, None),
            "release": ("POST", path + "/release", {"consumerId": worker}),
        }[what]
        named: tuple[str, ...] = (topic,)
        dead = _json(self.root_get(path).text).get("deadLetterTopic")
        if what == "describe" and isinstance(dead, str):
            # A queue's description names its dead-letter topic to whoever may consume
            # the queue's topic, as SQS's redrive policy does (docs/security.md).
            named = (topic, dead)
        answer = self.checked(caller, expected, method, url, body, named)
        if expected != OK:
            assert _stable(self.root_get(path)) == before
            return
        if answer.status_code != 200:
            return
        if what == "list":
            assert set(answer.json()) == {
                k[2]
                for k in self.queues
                if k[:2] == (ns, topic) and self.may(caller, "queue", topic, k[2])
            }
        elif what == "ack" and model is not None and ids:
            model.leased[worker].remove(ids[0])
        elif what in ("purge", "release") and model is not None:
            model.leased.clear() if what == "purge" else model.leased.pop(worker, None)
        elif what == "delete":
            self.queues.pop(key, None)

    @rule(caller=callers, ns=namespaces, client=st.booleans())
    def namespace_queues(self, caller: str, ns: str, client: bool) -> None:
        expected = self.expect(caller, True)
        if client:
            found, _ = self.via_client(caller, expected, ns, lambda c: c.queues(), "queues", ())
            listed = None if found is None else [{"topic": t, "queue": q} for t, q in found]
        else:
            answer = self.checked(caller, expected, "GET", f"/v1/namespaces/{ns}/queues")
            listed = answer.json() if answer.status_code == 200 else None
        if listed is None:
            return
        mine = {(e["topic"], e["queue"]) for e in listed if e["topic"].startswith(self.run)}
        want = {(t, q) for n, t, q in self.queues if n == ns and self.may(caller, "queue", t, q)}
        assert mine == want, (mine, want)

    # --- transactions ---------------------------------------------------------------

    tids = st.none() | st.sampled_from(TID_TAILS)

    @rule(caller=callers, tail=st.sampled_from(TID_TAILS))
    def register(self, caller: str, tail: str) -> None:
        tid = self.tid(tail)
        g = self.grants(caller)
        expected = self.expect(caller, g is not None and g.may_use(tid))
        answer = self.checked(caller, expected, "POST", "/v1/transactions/producers", {
            "transactionalId": tid
        })  # fmt: skip
        if expected == OK:
            assert answer.status_code == 200, answer.text
            self.epochs[tid] = answer.json()["epoch"]
            for tx in self.open.values():
                if tx.tid == tid:
                    tx.fenced = True

    @rule(caller=callers, tail=tids)
    def begin(self, caller: str, tail: str | None) -> None:
        body: dict[str, Any] = {"timeout": 600}
        tid = None if tail is None else self.tid(tail)
        g = self.grants(caller)
        allowed = g is not None and (tid is None or g.may_use(tid))
        if tid is not None:
            body["transactionalId"] = tid
            if tid in self.epochs:
                body["epoch"] = self.epochs[tid]
        expected = self.expect(caller, allowed)
        before = self.in_progress()
        answer = self.checked(caller, expected, "POST", "/v1/transactions", body)
        if expected != OK:
            assert self.in_progress() == before
            return
        if tid is not None and tid not in self.epochs:
            assert answer.status_code in (400, 404), answer.text
            return
        assert answer.status_code == 200, answer.text
        self.open[answer.json()["writePointer"]] = OpenTx(tid, self.epochs.get(tid or ""))

    @precondition(lambda self: bool(self.open))
    @rule(
        caller=callers,
        data=st.data(),
        op=st.sampled_from(["commit", "abort", "invalidate"]),
        naming=st.sampled_from(["none", "own", "other"]),
    )
    def end_transaction(self, caller: str, data: st.DataObject, op: str, naming: str) -> None:
        wp = data.draw(st.sampled_from(sorted(self.open)))
        tx = self.open[wp]
        g = self.grants(caller)
        body: dict[str, Any] = {}
        named: str | None = None
        if op != "invalidate" and naming == "own" and tx.tid is not None:
            named = tx.tid
        elif op != "invalidate" and naming == "other":
            others = [t for t in self.epochs if t != tx.tid]
            named = others[0] if others else None
        if named is not None:
            body = {"transactionalId": named, "epoch": self.epochs.get(named, 0)}
            allowed = g is not None and g.may_use(named)
        else:
            allowed = g is not None and (tx.tid is None or g.may_use(tx.tid))
        expected = self.expect(caller, allowed)
        answer = self.checked(caller, expected, "POST", f"/v1/transactions/{wp}/{op}", body)
        open_now = self.in_progress()
        if expected != OK:
            if not tx.fenced:
                assert wp in open_now, f"a refused {op} ended transaction {wp}"
            return
        if named is not None and named != tx.tid:
            # Someone else's transaction, named under another id: refused, not ended
            # (a fenced one is answered as ended, 410).
            if not tx.fenced:
                assert answer.status_code == 400, answer.text
                assert wp in open_now
            return
        if not tx.fenced:
            assert answer.status_code == 200, answer.text
        assert wp not in open_now
        del self.open[wp]

    @rule(
        caller=callers,
        ns=namespaces,
        picked=st.lists(suffixes, max_size=2, unique=True),
        tail=tids,
        ack=st.none() | st.tuples(suffixes, queues_),
        positions=st.none() | st.tuples(suffixes, groups_),
    )
    def publish_transaction(
        self,
        caller: str,
        ns: str,
        picked: list[str],
        tail: str | None,
        ack: tuple[str, str] | None,
        positions: tuple[str, str] | None = None,
    ) -> None:
        topics = [self.topic(s) for s in picked]
        g = self.grants(caller)
        allowed = g is not None and all(g.may_publish(t) for t in topics)
        body: dict[str, Any] = {
            "topics": [{"topic": t, "messages": [base64.b64encode(b"tx").decode()]} for t in topics]
        }
        tid = None if tail is None else self.tid(tail)
        if tid is not None:
            body["transactionalId"] = tid
            body["epoch"] = self.epochs.get(tid, 0)
            allowed = allowed and g is not None and g.may_use(tid)
        acked: tuple[QueueModel, str, str] | None = None
        named = tuple(topics)
        if ack is not None:
            topic = self.topic(ack[0])
            model = self.queues.get((ns, topic, ack[1]))
            worker, ids = "w1", [base64.b64encode(b"\0" * 20).decode()]
            if model is not None:
                for w, leased in model.leased.items():
                    if leased:
                        worker, ids = w, leased[:1]
                        acked = (model, w, leased[0])
                        break
            body["acks"] = [{"topic": topic, "queue": ack[1], "consumerId": worker, "ids": ids}]
            allowed = allowed and g is not None and g.may_queue(topic, ack[1])
            named = (*named, topic)
        if positions is not None:
            # A position no member was delivered: refused (or let in and failed) as
            # the grants say, and in no case does it move the group.
            topic = self.topic(positions[0])
            members = self.groups.get((ns, topic, positions[1]), [])
            zero = base64.b64encode(b"\0" * 20).decode()
            body["groupCommits"] = [{
                "topic": topic, "group": positions[1],
                "memberId": members[-1] if members else "m-none",
                "positions": [{"partition": 0, "id": zero}],
            }]  # fmt: skip
            allowed = allowed and g is not None and g.may_group(topic, positions[1])
            named = (*named, topic)
        if not topics and ack is None and positions is None:
            return  # nothing to do: 400, not what this checks
        expected = self.expect(caller, allowed)
        before = self.in_progress()
        answer = self.checked(
            caller, expected, "POST", f"/v1/namespaces/{ns}/transactions/publish", body, named
        )
        if expected == OK and answer.status_code == 200:
            assert all((ns, t) in self.topics for t in topics)
            for t in topics:
                self.counts[(ns, t)] = self.counts.get((ns, t), 0) + 1
            if acked is not None:
                acked[0].leased[acked[1]].remove(acked[2])
        elif expected == OK:
            assert 400 <= answer.status_code < 500, answer.text
        assert self.in_progress() == before
        for t in topics:
            assert self.count(ns, t) == self.model_count(ns, t)

    @rule(
        caller=callers,
        ns=namespaces,
        suffix=suffixes,
        name=st.sampled_from(("g1", "q1")),
        what=st.sampled_from(
            ["rollback", "nack", "extend", "queue-rollback", "heartbeat", "group-poll"]
        ),
    )
    def other_calls(self, caller: str, ns: str, suffix: str, name: str, what: str) -> None:
        # Calls whose effect the model does not follow: only who may make them.
        topic = self.topic(suffix)
        base = f"/v1/namespaces/{ns}/topics/{topic}"
        zero = base64.b64encode(b"\0" * 20).decode()
        wp = max(self.open, default=1)
        members = self.groups.get((ns, topic, name), [])
        member = members[-1] if members else "m-none"
        method, path, body, need = {
            "rollback": (
                "POST", "/rollback",
                {"transactionWritePointer": wp, "startTimestamp": 0, "startSequenceId": 0,
                 "endTimestamp": 0, "endSequenceId": 0}, "publish",
            ),
            "nack": (
                "POST", f"/queues/{name}/nack", {"consumerId": "w1", "ids": [zero]}, "queue",
            ),
            "extend": (
                "POST", f"/queues/{name}/extend", {"consumerId": "w1", "ids": [zero]}, "queue",
            ),
            "queue-rollback": (
                "POST", f"/queues/{name}/rollback", {"transactionWritePointer": wp}, "queue",
            ),
            "heartbeat": ("POST", f"/groups/{name}/heartbeat", {"memberId": member}, "group"),
            "group-poll": ("POST", f"/groups/{name}/poll", {"memberId": member}, "group"),
        }[what]  # fmt: skip
        allowed = self.may(caller, need, topic, name)
        g = self.grants(caller)
        tx = self.open.get(wp)
        if what in WRITE_POINTER_CALLS and tx is not None and tx.tid is not None and g:
            # Under a producer's open transaction: its transactional id too.
            if tx.fenced:
                return  # whether its registration ended it is the server's business
            allowed = allowed and g.may_use(tx.tid)
        expected = self.expect(caller, allowed)
        before = self.count(ns, topic)
        self.checked(caller, expected, method, base + path, body, (topic,))
        if expected != OK:
            assert self.count(ns, topic) == before

    # --- the rest -------------------------------------------------------------------

    @rule(
        caller=callers,
        ns=namespaces,
        suffix=suffixes,
        what=st.sampled_from(["meta", "stats", "end", "groups", "queue", "list", "state"]),
    )
    def head(self, caller: str, ns: str, suffix: str, what: str) -> None:
        # HEAD is checked as GET: no body, but the same status.
        topic = self.topic(suffix)
        base = f"/v1/namespaces/{ns}/topics/{topic}"
        path, need = {
            "meta": (base, "topic"),
            "stats": (base + "/stats", "topic"),
            "end": (base + "/end", "consume"),
            "groups": (base + "/groups", "consume"),
            "queue": (base + "/queues/q1", "queue"),
            "list": (f"/v1/namespaces/{ns}/topics", "any"),
            "state": ("/v1/transactions", "any"),
        }[what]
        expected = self.expect(caller, self.may(caller, need, topic, "q1"))
        status = self.http.head(path, headers=self.headers(caller)).status_code
        want = {UNAUTHORIZED: {401}, FORBIDDEN: {403}}.get(expected)
        if want is None:
            assert status in (200, 404), f"HEAD {path} as {caller}: {status}"
        else:
            assert status in want, f"HEAD {path} as {caller}: {status}"

    @rule(caller=callers, ns=namespaces, suffix=suffixes, how=st.sampled_from(["origin", "host"]))
    def from_another_site(self, caller: str, ns: str, suffix: str, how: str) -> None:
        # A browser's write from another site, or a request for another Host (DNS
        # rebinding): refused before the token is looked at, whoever's it is.
        topic = self.topic(suffix)
        headers = dict(self.headers(caller))
        if how == "origin":
            headers["Origin"] = "http://evil.example"
        else:
            headers["Host"] = "evil.example:8470"
        before = self.count(ns, topic)
        answer = self.http.post(
            f"/v1/namespaces/{ns}/topics/{topic}/publish",
            json={"messages": [base64.b64encode(b"m").decode()]},
            headers=headers,
        )
        want = (403, "Forbidden") if how == "origin" else (400, "BadRequest")
        assert (answer.status_code, answer.json()["type"]) == want, answer.text
        assert self.count(ns, topic) == before

    @rule(
        caller=callers,
        ns=namespaces,
        suffix=suffixes,
        what=st.sampled_from(
            ["meta", "stats", "end", "groups", "group", "queue", "snapshot", "prune", "begin"]
        ),
    )
    def client_call(self, caller: str, ns: str, suffix: str, what: str) -> None:
        # The real client's typed exceptions for the same table.
        topic = self.topic(suffix)
        need, call = {
            "meta": ("topic", lambda c: c.get_topic(topic)),
            "stats": ("topic", lambda c: c.stats(topic)),
            "end": ("consume", lambda c: c.end(topic)),
            "groups": ("consume", lambda c: c.groups(topic)),
            "group": ("group", lambda c: c.describe_group(topic, "g1")),
            "queue": ("queue", lambda c: c.describe_queue(topic, "q1")),
            "snapshot": ("any", lambda c: c.snapshot()),
            "prune": ("admin", lambda c: c.prune(ids=[])),
            "begin": ("any", lambda c: c.begin(600)),
        }[what]
        name = {"group": "g1", "queue": "q1"}.get(what, "")
        expected = self.expect(caller, self.may(caller, need, topic, name))
        found, error = self.via_client(caller, expected, ns, call, what, (topic,))
        if what == "begin" and error is None:
            self.open[found.write_pointer] = OpenTx(None, None)
        if what == "stats" and error is None and not self.may(caller, "consume", topic):
            assert found.group_lags == {}

    @rule(
        caller=callers,
        what=st.sampled_from(["state", "details", "prune", "cluster", "metrics", "health"]),
    )
    def service_call(self, caller: str, what: str) -> None:
        method, path, body, need = {
            "state": ("GET", "/v1/transactions", None, "any"),
            "details": ("GET", "/v1/transactions/details", None, "admin"),
            "prune": ("POST", "/v1/transactions/prune", {"ids": []}, "admin"),
            "cluster": ("GET", "/v1/cluster", None, "any"),
            "metrics": ("GET", "/metrics", None, "any"),  # metrics_auth: any principal
            "health": ("GET", "/healthz", None, "open"),
        }[what]
        expected = OK if need == "open" else self.expect(caller, self.may(caller, need))
        if what == "metrics":
            # Documented: every topic's name to whoever may read the metrics.
            answer = self.http.get(path, headers=self.headers(caller))
            kind = answer.json().get("type") if answer.status_code >= 400 else None
            self.outcome(caller, expected, answer.status_code, kind, path)
            return
        answer = self.checked(caller, expected, method, path, body)
        if expected == OK:
            assert answer.status_code == 200, answer.text


def _json(text: str) -> dict[str, Any]:
    try:
        found = json.loads(text)
    except ValueError:
        return {}
    return found if isinstance(found, dict) else {}


def _error_json(exc: TidingsError) -> str:
    return json.dumps({"error": str(exc), "type": type(exc).__name__})


def _mentions(text: str, name: str) -> bool:
    return re.search(rf"(?<![A-Za-z0-9._-]){re.escape(name)}(?![A-Za-z0-9._-])", text) is not None


#: Queue counters that move with time rather than with calls.
_MOVING = ("popRate", "ackRate", "waiting", "waitingExact", "cursor", "read")


def _stable_text(text: str) -> str:
    body = _json(text)
    return repr(sorted((k, v) for k, v in body.items() if k not in _MOVING))


def _stable(answer: httpx.Response) -> str:
    return _stable_text(answer.text)


def test_who_may_do_what_follows_the_table(secured: tuple[ServerProcess, Path]) -> None:
    SecurityModel.server, SecurityModel.auth_path = secured
    run_state_machine_as_test(
        SecurityModel,
        settings=settings(
            max_examples=int(os.environ.get("TIDINGS_SECURITY_MODEL_EXAMPLES", "12")),
            stateful_step_count=int(os.environ.get("TIDINGS_SECURITY_MODEL_STEPS", "30")),
            deadline=None,
            suppress_health_check=list(HealthCheck),
        ),
    )


def _install(secured: tuple[ServerProcess, Path], principals: dict[str, Grants]) -> None:
    """The module's server with these principals (and its admin) in force."""
    proc, path = secured
    marker = "marker-" + uuid.uuid4().hex
    text = _lines(ADMIN_NAME, Grants(ROOT_TOKEN, admin=True))
    text += "".join(_lines(name, g) for name, g in principals.items())
    path.write_text(text + _lines(marker, Grants(marker)))
    assert proc.proc is not None
    os.kill(proc.proc.pid, signal.SIGHUP)
    deadline = time.monotonic() + 10
    while (
        httpx.get(proc.url + "/v1/whoami", headers={"Authorization": f"Bearer {marker}"}).json()[
            "name"
        ]
        != marker
    ):
        assert time.monotonic() < deadline, "the auth file was not reloaded"
        time.sleep(0.02)


def test_the_topic_list_names_only_topics_the_principal_may_use(
    secured: tuple[ServerProcess, Path],
) -> None:
    # Kafka lists only the topics a principal may describe; here those it may publish
    # to or consume. A name is its producers' and consumers' business: "payroll-cuts"
    # tells a stranger more than it should.
    run = "l" + uuid.uuid4().hex[:8] + "-"
    reader = Grants("reader-" + run, consume=(run + "orders",))
    writer = Grants("writer-" + run, publish=(run + "ord*",))
    nobody = Grants("nobody-" + run)
    _install(secured, {"reader": reader, "writer": writer, "nobody": nobody})
    proc, _ = secured
    with Client(proc.url, token=ROOT_TOKEN) as admin:
        for name in ("orders", "payroll-cuts"):
            admin.create_topic(run + name)
        assert {run + "orders", run + "payroll-cuts"} <= set(admin.list_topics())
    for who, want in ((reader, [run + "orders"]), (writer, [run + "orders"]), (nobody, [])):
        with Client(proc.url, token=who.token) as client:
            assert [t for t in client.list_topics() if t.startswith(run)] == want
        raw = httpx.get(
            proc.url + "/v1/namespaces/default/topics",
            headers={"Authorization": f"Bearer {who.token}"},
        )
        assert raw.status_code == 200 and "payroll-cuts" not in raw.text


def test_writing_under_a_producers_transaction_takes_its_transactional_id(
    secured: tuple[ServerProcess, Path],
) -> None:
    # Ending a producer's transaction takes its transactional id; so does writing into
    # it or taking its writes back while it is open (Kafka: only the holder of a
    # transactional id produces in its transactions). Else whoever may publish to or
    # consume a topic could undo a producer's exactly-once step: give its queue acks or
    # group positions back (the input is processed again after the commit), roll back
    # its messages, or slip messages of its own into its commit.
    run = "w" + uuid.uuid4().hex[:8] + "-"
    topic = run + "orders"
    producer = Grants("producer-" + run, publish=(topic,), consume=(topic,), tids=(run + "*",))
    other = Grants("other-" + run, publish=(topic,), consume=(topic,))
    _install(secured, {"producer": producer, "other": other})
    proc, _ = secured
    ns = f"{proc.url}/v1/namespaces/default/topics/{topic}"
    with Client(proc.url, token=ROOT_TOKEN) as admin:
        admin.create_topic(topic)
        admin.publish(topic, [b"job"])
    with (
        Client(proc.url, token=producer.token) as mine,
        Client(proc.url, token=other.token) as theirs,
    ):
        job = httpx.post(
            ns + "/queues/work/pop",
            json={"consumerId": "w1"},
            headers={"Authorization": f"Bearer {producer.token}"},
        ).json()[0]["id"]
        member = mine.consume(topic, group="billing", follow=False)
        member.poll()
        epoch = mine.register_producer(run + "1").epoch
        tx = mine.begin(transactional_id=run + "1", epoch=epoch)
        wp = tx.write_pointer
        info = mine.publish(topic, [b"output"], write_pointer=wp)
        acked = httpx.post(
            ns + "/queues/work/ack",
            json={"consumerId": "w1", "ids": [job], "transactionWritePointer": wp},
            headers={"Authorization": f"Bearer {producer.token}"},
        )
        assert acked.status_code == 200, acked.text
        with pytest.raises(Forbidden, match="transaction"):
            theirs.publish(topic, [b"slipped in"], write_pointer=wp)
        with pytest.raises(Forbidden, match="transaction"):
            theirs.rollback(topic, info)
        as_other = {"Authorization": f"Bearer {other.token}"}
        for path, body in (
            ("/store", {"transactionWritePointer": wp, "messages": []}),
            ("/queues/work/rollback", {"transactionWritePointer": wp}),
            ("/queues/work/ack", {"consumerId": "w1", "ids": [job], "transactionWritePointer": wp}),
            ("/groups/billing/rollback", {"transactionWritePointer": wp}),
            (
                "/groups/billing/commit",
                {
                    "memberId": "m",
                    "positions": [{"partition": 0, "id": job}],
                    "transactionWritePointer": wp,
                },
            ),
        ):
            refused = httpx.post(ns + path, json=body, headers=as_other)
            assert refused.status_code == 403, (path, refused.text)
            assert refused.json()["type"] == "Forbidden" and run + "1" not in refused.text
        mine.commit(tx, transactional_id=run + "1", epoch=epoch)
        member.close()
    with Client(proc.url, token=ROOT_TOKEN) as admin:
        committed = admin.poll(topic, isolation="read_committed")
        assert [m.payload for m in committed] == [b"job", b"output"]
        assert admin.describe_queue(topic, "work").acked == 1  # the ack stayed


def test_a_principal_that_is_no_admin_takes_read_committed_snapshots(
    secured: tuple[ServerProcess, Path],
) -> None:
    # Client.snapshot() (read-committed reads where the server takes no snapshots, a
    # Spark read-committed scan, the Spark sink's markers) reads the transaction
    # service's state, which was for admins only: with an auth file, every other
    # principal's read-committed read was refused. The state is pointers only, as any
    # principal's begin answers them.
    run = "r" + uuid.uuid4().hex[:8] + "-"
    topic = run + "orders"
    reader = Grants("reader-" + run, consume=(topic,))
    nobody = Grants("nobody-" + run)
    _install(secured, {"reader": reader, "nobody": nobody})
    proc, _ = secured
    with Client(proc.url, token=ROOT_TOKEN) as admin:
        admin.create_topic(topic)
        admin.publish(topic, [b"first"])
        with admin.transaction() as tx:
            tx.publish(topic, [b"committed"])
        held = admin.begin()
        admin.publish(topic, [b"open"], write_pointer=held.write_pointer)
    try:
        with Client(proc.url, token=reader.token) as client:
            snapshot = client.snapshot()
            assert held.write_pointer in snapshot.in_progress
            seen = client.poll(topic, transaction=snapshot)
            assert [m.payload for m in seen] == [b"first", b"committed"]
        for who in (reader, nobody):
            answer = httpx.get(
                proc.url + "/v1/transactions", headers={"Authorization": f"Bearer {who.token}"}
            )
            assert answer.status_code == 200, answer.text
        assert httpx.get(proc.url + "/v1/transactions").status_code == 401
        details = httpx.get(
            proc.url + "/v1/transactions/details",
            headers={"Authorization": f"Bearer {reader.token}"},
        )
        assert details.status_code == 403  # who holds what stays the admins'
    finally:
        with Client(proc.url, token=ROOT_TOKEN) as admin:
            admin.abort(held)


def test_a_streaming_sink_that_is_no_admin_uses_a_control_topic_made_for_it(
    secured: tuple[ServerProcess, Path],
) -> None:
    # The Spark streaming sink created its control topic at every micro-batch, a
    # TopicAlreadyExists taken for "there already": a principal that is no admin was
    # refused the create (403, before the server looks whether the topic exists), so
    # such a sink failed every batch even with the topic made for it by an admin.
    from tidings.spark import sink

    sink_id = "s" + uuid.uuid4().hex[:8]
    control = sink.control_topic(sink_id)
    writer = Grants(
        "sink-" + sink_id,
        publish=(control,),
        consume=(control,),
        tids=(sink.transactional_id(sink_id),),
    )
    _install(secured, {"sink": writer})
    proc, _ = secured
    with Client(proc.url, token=writer.token) as client:
        with pytest.raises(Forbidden, match="not an admin"):  # none made for it yet
            sink.begin_write(client, 30, sink_id)
        with Client(proc.url, token=ROOT_TOKEN) as admin:
            admin.create_topic(control, ttl=sink.MARKER_TTL)
        began = sink.begin_write(client, 30, sink_id)
        assert began.transactional_id == sink.transactional_id(sink_id)
        assert sink.last_committed_batch(client, sink_id) is None
        client.abort(
            began.write_pointer, transactional_id=began.transactional_id, epoch=began.epoch
        )
