"""What each endpoint needs of a principal: the one table the routes are checked
against (docs/security.md has the same table for people).

:meth:`tidings.server.handlers.Api.endpoint` looks every request up here before the
endpoint runs, and :func:`tidings.server.app.create_app` refuses to start if a mounted
route has no entry, so a route added later cannot forget its permission.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping

from tidings.server.auth import Principal

__all__ = ["PERMISSIONS", "Need", "check", "need_of"]

_NS = "/v1/namespaces/{ns}"
_TOPIC = _NS + "/topics/{topic}"
_GROUP = _TOPIC + "/groups/{group}"
_QUEUE = _TOPIC + "/queues/{queue}"
_TX = "/v1/transactions"


class Need(enum.Enum):
    """What a principal must have for an endpoint."""

    #: Nobody needs a token (health, readiness, the API document).
    OPEN = "open"
    #: ``/metrics``: open, or any principal with ``metrics_auth``.
    METRICS = "metrics"
    #: Any principal.
    ANY = "any principal"
    #: ``publish`` on the path's topic.
    PUBLISH = "publish on the topic"
    #: ``consume`` on the path's topic.
    CONSUME = "consume on the topic"
    #: ``consume`` on the path's topic and the path's group granted (``groups``).
    GROUP = "consume on the topic, and the group"
    #: ``consume`` on the path's topic and the path's queue granted (``queues``).
    QUEUE = "consume on the topic, and the queue"
    #: ``publish`` or ``consume`` on the path's topic.
    TOPIC = "publish or consume on the topic"
    #: ``admin = true``.
    ADMIN = "admin"
    #: Any principal; the endpoint checks what its body names (transactional ids,
    #: the topics of a one-request transaction) against the principal's patterns.
    BODY = "any principal, and what the body names"


#: ``(method, route) -> Need`` for every route the server mounts.
PERMISSIONS: Mapping[tuple[str, str], Need] = {
    # operations
    ("GET", "/healthz"): Need.OPEN,
    ("GET", "/readyz"): Need.OPEN,
    ("GET", "/openapi.json"): Need.OPEN,
    ("GET", "/metrics"): Need.METRICS,
    ("GET", "/v1/cluster"): Need.ANY,
    # topics and messages
    ("GET", _NS + "/topics"): Need.ANY,
    ("GET", _TOPIC): Need.TOPIC,
    ("PUT", _TOPIC): Need.ADMIN,
    ("DELETE", _TOPIC): Need.ADMIN,
    ("PUT", _TOPIC + "/properties"): Need.ADMIN,
    ("GET", _TOPIC + "/stats"): Need.TOPIC,
    ("GET", _TOPIC + "/end"): Need.CONSUME,
    ("POST", _TOPIC + "/publish"): Need.PUBLISH,
    ("POST", _TOPIC + "/store"): Need.PUBLISH,
    ("POST", _TOPIC + "/rollback"): Need.PUBLISH,
    ("POST", _TOPIC + "/poll"): Need.CONSUME,
    # transactions
    # Pointers only (what any principal's begin answers too): every read-committed
    # reader whose server takes no snapshots of its own reads it (Client.snapshot()).
    ("GET", _TX): Need.ANY,
    ("POST", _TX): Need.BODY,
    ("POST", _TX + "/{wp}/commit"): Need.BODY,
    ("POST", _TX + "/{wp}/abort"): Need.BODY,
    ("POST", _TX + "/{wp}/invalidate"): Need.BODY,
    ("POST", _TX + "/producers"): Need.BODY,
    ("POST", _TX + "/prune"): Need.ADMIN,
    ("POST", _NS + "/transactions/publish"): Need.BODY,
    # consumer groups
    ("GET", _TOPIC + "/groups"): Need.CONSUME,
    ("GET", _GROUP): Need.GROUP,
    ("DELETE", _GROUP): Need.ADMIN,
    ("POST", _GROUP + "/join"): Need.GROUP,
    ("POST", _GROUP + "/heartbeat"): Need.GROUP,
    ("POST", _GROUP + "/leave"): Need.GROUP,
    ("POST", _GROUP + "/poll"): Need.GROUP,
    ("POST", _GROUP + "/commit"): Need.GROUP,
    ("POST", _GROUP + "/rollback"): Need.GROUP,
    ("POST", _GROUP + "/reset"): Need.ADMIN,
    # queues
    ("GET", _NS + "/queues"): Need.ANY,
    ("GET", _TOPIC + "/queues"): Need.CONSUME,
    ("GET", _QUEUE): Need.QUEUE,
    ("DELETE", _QUEUE): Need.ADMIN,
    ("POST", _QUEUE + "/pop"): Need.QUEUE,
    ("POST", _QUEUE + "/ack"): Need.QUEUE,
    ("POST", _QUEUE + "/nack"): Need.QUEUE,
    ("POST", _QUEUE + "/extend"): Need.QUEUE,
    ("POST", _QUEUE + "/rollback"): Need.QUEUE,
    ("POST", _QUEUE + "/release"): Need.QUEUE,
    ("POST", _QUEUE + "/purge"): Need.ADMIN,
    # the web console: its files are open, the data it shows comes through the API
    ("GET", "/console/"): Need.OPEN,
    ("GET", "/console/console.js"): Need.OPEN,
    ("GET", "/console/console.css"): Need.OPEN,
    ("GET", "/v1/whoami"): Need.OPEN,
    ("GET", _TX + "/details"): Need.ADMIN,
    ("GET", _TOPIC + "/messages"): Need.CONSUME,
}


def need_of(method: str, route: str) -> Need:
    """The need of a request (HEAD as GET); KeyError for a route not in the table."""
    return PERMISSIONS[("GET" if method == "HEAD" else method, route)]


def check(need: Need, principal: Principal, path_params: Mapping[str, str]) -> None:
    """:class:`~tidings.errors.Forbidden` unless ``principal`` has what ``need`` asks."""
    if need is Need.ADMIN:
        principal.require_admin()
    elif need is Need.PUBLISH:
        principal.require_publish(path_params["topic"])
    elif need is Need.CONSUME:
        principal.require_consume(path_params["topic"])
    elif need is Need.GROUP:
        principal.require_group(path_params["topic"], path_params["group"])
    elif need is Need.QUEUE:
        principal.require_queue(path_params["topic"], path_params["queue"])
    elif need is Need.TOPIC:
        topic = path_params["topic"]
        if not (principal.may_publish(topic) or principal.may_consume(topic)):
            principal.require_consume(topic)  # raises, naming the topic
