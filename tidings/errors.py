"""Every error Tidings raises, server side and client side, in one hierarchy.

::

    TidingsError                      base; .status (HTTP), .retriable
    ├── BadRequest                    400  the caller's mistake; nothing was changed
    │   ├── InvalidName               400  namespace/topic name not [A-Za-z0-9_-]{1,128}
    │   ├── InvalidProperties         400  topic properties (e.g. ttl) not valid
    │   ├── InvalidMessageId          400  not a 20-byte id / 40-char hex id
    │   ├── InvalidTransaction        400  encoded transaction snapshot cannot be decoded
    │   ├── TimeoutTooLarge           400  begin() asked for more than the maximum timeout
    │   ├── InvalidProducer           400  bad transactional id / epoch, or not its transaction
    │   └── EmptyPublish              400  publish with neither messages nor a write pointer
    ├── Unauthorized                  401  no bearer token, or one nobody has
    ├── Forbidden                     403  the principal may not do this
    │   ├── ProducerFenced            403  a newer epoch of this transactional id exists
    │   └── PartitionFenced           403  a group member commits a partition it does not own
    ├── NotFound                      404
    │   ├── TopicNotFound             404
    │   ├── TransactionNotFound       404  write pointer unknown to the transaction service
    │   ├── ProducerNotFound          404  transactional id never registered
    │   ├── GroupNotFound             404  no such consumer group on the topic
    │   ├── QueueNotFound             404  no such queue on the topic
    │   └── MemberNotFound            404  not (or no longer) a member of the group: join again
    ├── Conflict                      409
    │   ├── TopicAlreadyExists        409
    │   ├── PayloadsAlreadyPublished  409  store/publish under a write pointer already published
    │   ├── TransactionConflict       409  write conflict detected at commit
    │   ├── OutOfOrderSequence        409  an idempotent publish skipped sequence numbers
    │   ├── UnknownProducerEpoch      409  an epoch of the transactional id never handed out
    │   ├── AckConflict               409  ack of a message whose lease passed to another worker
    │   ├── NotDelivered              409  ack of messages never delivered to the caller
    │   └── BeginIdConflict           409  a begin id sent again with other begin parameters
    ├── TransactionNotInProgress      410  the transaction already ended; subclasses say how
    │   ├── TransactionCommitted      410
    │   ├── TransactionAborted        410
    │   ├── TransactionInvalid        410  invalidated (explicitly or by timeout)
    │   └── TransactionTimedOut       410  its timeout passed before commit
    ├── PayloadTooLarge               413
    ├── UnsupportedMediaType          415
    ├── ServerError                   500  a bug or a storage failure (retriable)
    │   ├── LogFailed                 500  the transaction log could not be written
    │   ├── CorruptSnapshot           500  a transaction snapshot file is damaged
    │   └── OutcomeUnknown            500  a write's commit went unanswered: it may have happened
    ├── ServiceUnavailable            503  not available here now (retriable)
    │   ├── LeaseLost                 503  this instance no longer leads the cluster (retry)
    │   ├── StoreFull                 503  the store has no room for the write (retry later)
    │   ├── StoreUnavailable          503  PostgreSQL unreachable, busy or refusing (retry)
    │   ├── TooManyTransactions       503  the server's cap on open transactions is reached (retry)
    │   └── RoleUnavailable           503  this process's role does not run that service (final)
    ├── ConfigError                        a server setting is wrong; never sent on the wire
    ├── BackupFailed                       ``tidings backup`` could not make a whole copy
    └── ClientError                        raised only by the client, never sent on the wire
        ├── TidingsConnectionError         cannot reach the server (retriable)
        ├── RequestTimeout                 no answer in time (retriable)
        └── TransactionFailure             a client transaction failed and was rolled back

The server answers every error as ``{"error": message, "type": ClassName}`` with the
class's status; the client maps ``type`` back to the same class (falling back to the
status when ``type`` is unknown), so both sides raise the same exception.
"""

from __future__ import annotations

from typing import ClassVar

__all__ = [
    "AckConflict",
    "BackupFailed",
    "BadRequest",
    "BeginIdConflict",
    "ClientError",
    "ConfigError",
    "Conflict",
    "CorruptSnapshot",
    "EmptyPublish",
    "Forbidden",
    "GroupNotFound",
    "InvalidMessageId",
    "InvalidName",
    "InvalidProducer",
    "InvalidProperties",
    "InvalidTransaction",
    "LeaseLost",
    "LogFailed",
    "MemberNotFound",
    "NotDelivered",
    "NotFound",
    "OutOfOrderSequence",
    "OutcomeUnknown",
    "PartitionFenced",
    "PayloadTooLarge",
    "PayloadsAlreadyPublished",
    "QueueNotFound",
    "ProducerFenced",
    "ProducerNotFound",
    "RequestTimeout",
    "RoleUnavailable",
    "ServerError",
    "ServiceUnavailable",
    "StoreFull",
    "StoreUnavailable",
    "TidingsConnectionError",
    "TidingsError",
    "TimeoutTooLarge",
    "TooManyTransactions",
    "TopicAlreadyExists",
    "TopicNotFound",
    "TransactionAborted",
    "TransactionCommitted",
    "TransactionConflict",
    "TransactionFailure",
    "TransactionInvalid",
    "TransactionNotFound",
    "TransactionNotInProgress",
    "TransactionTimedOut",
    "Unauthorized",
    "UnknownProducerEpoch",
    "UnsupportedMediaType",
    "error_for",
]


class TidingsError(Exception):
    """Base of every Tidings error.

    ``status`` is the HTTP status the server answers with; ``retriable`` says whether
    sending the same request again can succeed without the caller changing anything.
    """

    status: ClassVar[int] = 500
    retriable: ClassVar[bool] = False

    def __init__(self, message: str = "") -> None:
        super().__init__(message or self.__class__.__name__)
        self.message = message or self.__class__.__name__

    def to_json(self) -> dict[str, str]:
        """The JSON error body the server sends for this error."""
        return {"error": self.message, "type": type(self).__name__}


class BadRequest(TidingsError):
    """The request is malformed or invalid; nothing was changed."""

    status = 400


class InvalidName(BadRequest):
    """A namespace or topic name is not 1-128 characters of ``[A-Za-z0-9_-]``."""


class InvalidProperties(BadRequest):
    """Topic properties are not valid (unknown keys, ttl not a positive integer...)."""


class InvalidMessageId(BadRequest):
    """A message id is not 20 bytes (or 40 hex characters)."""


class InvalidTransaction(BadRequest):
    """An encoded transaction snapshot cannot be decoded."""


class TimeoutTooLarge(BadRequest):
    """A transaction asked for a timeout above the configured maximum (or not positive)."""


class InvalidProducer(BadRequest):
    """A transactional id or epoch is malformed or missing, or the transaction is not its own."""


class EmptyPublish(BadRequest):
    """A publish carried neither messages nor a transaction write pointer."""


class Unauthorized(TidingsError):
    """The server needs a bearer token and got none, or one it does not know (answered
    with ``WWW-Authenticate: Bearer``)."""

    status = 401


class Forbidden(TidingsError):
    """The caller may not do this."""

    status = 403


class ProducerFenced(Forbidden):
    """A newer epoch of this transactional id was registered; this producer is a zombie."""


class PartitionFenced(Forbidden):
    """A consumer-group member committed a position of a partition it does not own:
    a rebalance moved it (or the member was dropped). Its transaction cannot commit."""


class NotFound(TidingsError):
    """The named thing does not exist."""

    status = 404


class TopicNotFound(NotFound):
    """The topic does not exist in the namespace."""


class TransactionNotFound(NotFound):
    """The transaction service does not know this write pointer."""


class ProducerNotFound(NotFound):
    """The transactional id was never registered (``register_producer`` comes first)."""


class GroupNotFound(NotFound):
    """The topic has no consumer group of that name."""


class MemberNotFound(NotFound):
    """The caller is not (or no longer) a member of the group; it joins again."""


class QueueNotFound(NotFound):
    """The topic has no queue of that name."""


class Conflict(TidingsError):
    """The request conflicts with the current state."""

    status = 409


class TopicAlreadyExists(Conflict):
    """A topic of that name exists already."""


class PayloadsAlreadyPublished(Conflict):
    """The write pointer's stored payloads were already published on this topic.

    Storing more under it, or publishing it again, would change messages consumers
    may already have read (invariant 1); a zombie writer gets this error.
    """


class TransactionConflict(Conflict):
    """A transaction that committed after this one began wrote one of the same change keys."""


class OutOfOrderSequence(Conflict):
    """An idempotent producer's publish skipped sequence numbers on the topic: a batch
    before it never arrived, or the server lost it (a store restored from an earlier
    copy). Nothing was written; the producer starts a new sequence (a new producer id).
    The Python clients do that themselves and send the publish again, so they do not
    raise it."""


class UnknownProducerEpoch(Conflict):
    """The call names an epoch of its transactional id above the current one: an epoch
    no registration handed out (a producer's state out of step with the server's)."""


class AckConflict(Conflict):
    """An ack of a message whose lease passed to another worker (its lease timed out
    and the queue redelivered it), that another worker or transaction acked, or that
    was moved to the dead-letter topic: the caller's work on it lost the race. In a
    transaction, that transaction is invalidated, so its output never joins the other
    worker's. (A nack or an extend skips such messages instead, and lists them.)"""


class NotDelivered(Conflict):
    """An ack named messages the queue never delivered to the caller (never popped,
    popped from a server that restarted before the lease was written, or messages of
    another group); the message names them. Nothing was changed. A 409 rather than a
    400: the same request is right for the worker that popped them."""


class BeginIdConflict(Conflict):
    """A begin carries the ``beginId`` of a transaction still open that was begun with
    another ``transactionalId``, ``epoch`` or ``timeout``: the id was used for another
    begin, so answering that transaction would hand it to a stranger. Nothing was begun."""


class TransactionNotInProgress(TidingsError):
    """The transaction is no longer in progress; the subclass says how it ended."""

    status = 410


class TransactionCommitted(TransactionNotInProgress):
    """The transaction has already committed."""


class TransactionAborted(TransactionNotInProgress):
    """The transaction has already been aborted."""


class TransactionInvalid(TransactionNotInProgress):
    """The transaction was invalidated; its writes are never visible."""


class TransactionTimedOut(TransactionNotInProgress):
    """The transaction's timeout passed before it committed; it is now invalid."""


class PayloadTooLarge(TidingsError):
    """The request body is larger than the server accepts."""

    status = 413


class UnsupportedMediaType(TidingsError):
    """The request's Content-Type is neither application/json nor avro/binary."""

    status = 415


class ServerError(TidingsError):
    """The server failed (a bug or a storage failure); the request may be retried."""

    status = 500
    retriable = True


class LogFailed(ServerError):
    """The transaction log could not be written; the service must be restarted."""


class CorruptSnapshot(ServerError):
    """A snapshot file is damaged (it was written whole, so this is not a crash artifact)."""


class OutcomeUnknown(ServerError):
    """A write's ``COMMIT`` went to PostgreSQL and its answer never came back (the
    connection was lost), and the server could not find out afterwards, within its
    connect timeout, whether that transaction committed: the request may or may not
    have been carried out. Not a 503, which says "not done": an idempotent request (an
    idempotent publish, an ack) may be sent again, and the Python clients do so; any
    other (a plain publish, a pop) must be checked before it is sent again, or it may
    be carried out twice. Also an instance standing by's answer (502) when the leader's
    answer to a request it forwarded was lost."""


class ServiceUnavailable(TidingsError):
    """The service (or the part asked for, e.g. transactions) is not available here now."""

    status = 503
    retriable = True


class RoleUnavailable(ServiceUnavailable):
    """This process does not run the service asked for (its ``role``, or groups and
    queues on a process without both services). Final: asking this process again
    cannot succeed, so clients do not retry it or wait it out."""

    retriable = False


class LeaseLost(ServiceUnavailable):
    """This instance no longer holds the leader lease of its shared store: another
    instance took over, and the store refused this one's write. Retry the request (a
    load balancer sends it to the new leader)."""


class StoreFull(ServiceUnavailable):
    """The store has no room for the write (LMDB's ``map_size`` is reached); nothing of
    it was stored. Retriable: room comes back as the cleaner deletes expired messages
    (or once the server runs with a larger ``map_size``)."""


class StoreUnavailable(ServiceUnavailable):
    """The store could not do the work now, and nothing of it was done: PostgreSQL could
    not be reached or cut the connection before the write was sent whole, every
    connection of the read pool stayed busy, or PostgreSQL refused (a read-only
    standby, a cancelled statement), or a write whose ``COMMIT`` got no answer was found
    not to have committed. Retriable. A write whose ``COMMIT`` got no answer and whose
    outcome the server could not learn is an :class:`OutcomeUnknown` instead."""


class TooManyTransactions(ServiceUnavailable):
    """A begin (or a transaction in one request) found as many transactions open as the
    server allows (``tx_max_open``); nothing was begun. Retriable: a slot comes free as
    soon as an open transaction commits, aborts, is invalidated or times out."""


class ConfigError(TidingsError):
    """A setting of ``tidings serve`` has a wrong type or value: it exits 2 without
    starting. Never sent on the wire."""

    status = 0


class BackupFailed(TidingsError):
    """``tidings backup`` could not make a whole copy (the data directory kept changing,
    or holds nothing to copy); it removed what it wrote. Never sent on the wire."""

    status = 0


class ClientError(TidingsError):
    """Raised by the client itself; never sent on the wire."""

    status = 0


class TidingsConnectionError(ClientError):
    """The server could not be reached."""

    retriable = True


class RequestTimeout(ClientError):
    """The server did not answer in time."""

    retriable = True


class TransactionFailure(ClientError):
    """A client-side transaction failed; its messages were rolled back and it was aborted."""


def _all_wire_errors() -> dict[str, type[TidingsError]]:
    found: dict[str, type[TidingsError]] = {}
    stack: list[type[TidingsError]] = [TidingsError]
    while stack:
        cls = stack.pop()
        if not issubclass(cls, ClientError):
            found[cls.__name__] = cls
        stack.extend(cls.__subclasses__())
    return found


#: Statuses besides its own that an error type is believed with: a standby's 502 (Bad
#: Gateway) when the leader's answer to a forwarded request was lost.
_ALSO: dict[type[TidingsError], tuple[int, ...]] = {OutcomeUnknown: (502,)}

_BY_STATUS: dict[int, type[TidingsError]] = {
    400: BadRequest,
    401: Unauthorized,
    403: Forbidden,
    404: NotFound,
    409: Conflict,
    410: TransactionNotInProgress,
    413: PayloadTooLarge,
    415: UnsupportedMediaType,
    503: ServiceUnavailable,
}


def error_for(status: int, body: object) -> TidingsError:
    """Rebuild the exception a server error response stands for (used by the client)."""
    message = ""
    type_name = None
    if isinstance(body, dict):
        raw_message = body.get("error")
        message = raw_message if isinstance(raw_message, str) else ""
        raw_type = body.get("type")
        type_name = raw_type if isinstance(raw_type, str) else None
    cls = _all_wire_errors().get(type_name or "")
    if cls is None or (cls.status != status and status not in _ALSO.get(cls, ())):
        cls = _BY_STATUS.get(status, ServerError if status >= 500 else BadRequest)
    return cls(message or f"HTTP {status}")
