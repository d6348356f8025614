"""What the sync client waits on: the threaded twin of
:mod:`tidings.client._async.concurrency`, with the same names less ``Async``."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Generic, NoReturn, ParamSpec, Self, TypeVar

from tidings.client.api import Call
from tidings.client.transports import StartingTransport

__all__ = [
    "Condition",
    "Future",
    "Pending",
    "Sender",
    "Worker",
    "claim",
    "new_future",
    "settle",
    "sleep",
    "yield_turns",
]

T = TypeVar("T")
P = ParamSpec("P")


def sleep(seconds: float) -> None:
    """Block the calling thread ``seconds``."""
    time.sleep(seconds)


def yield_turns(turns: int = 0) -> None:
    """Nothing to do: a thread started runs on its own."""


def new_future() -> Future[None]:
    """A future a thread resolves."""
    return Future()


def claim(future: Future[None]) -> bool:
    """True if ``future`` still wants a result; marks it running (no more cancelling)."""
    return future.set_running_or_notify_cancel()


def settle(future: Future[None], error: BaseException | None) -> None:
    """Resolve a claimed ``future`` (to None, or failed with ``error``)."""
    if error is None:
        future.set_result(None)
    else:
        future.set_exception(error)


class Condition:
    """A :class:`threading.Condition` with the async twin's methods."""

    def __init__(self) -> None:
        self._cond = threading.Condition()

    def __enter__(self) -> Self:
        self._cond.acquire()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._cond.release()

    def notify_all(self) -> None:
        """Wake every waiter (the lock must be held)."""
        self._cond.notify_all()

    def wait(self, timeout: float | None) -> None:
        """Wait for a notification, at most ``timeout`` seconds (None: no limit)."""
        self._cond.wait(timeout)

    def wait_for(self, predicate: Callable[[], bool], timeout: float | None) -> bool:
        """Wait until ``predicate()`` holds; False if ``timeout`` seconds pass first."""
        return bool(self._cond.wait_for(predicate, timeout))


class Pending(Generic[T]):
    """A call running in the background (see :class:`Worker`)."""

    def __init__(self, result: Callable[[], T], cancel: Callable[[], object]) -> None:
        self._result = result
        self._cancel = cancel

    def result(self) -> T:
        """Its result, once it is done (its exception, if it failed)."""
        return self._result()

    def cancel(self) -> None:
        """Stop it if it has not started; an answer on its way is dropped."""
        self._cancel()


class Worker:
    """Runs calls in the background: one thread, started on first use."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._executor: ThreadPoolExecutor | None = None

    def start(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> Pending[T]:
        """Start ``fn(*args, **kwargs)`` in the background."""
        if self._executor is None:
            self._executor = ThreadPoolExecutor(1, thread_name_prefix=self.name)
        future = self._executor.submit(fn, *args, **kwargs)
        return Pending(future.result, future.cancel)

    def begin(self, transport: object, send: Callable[[Call[T]], T], call: Call[T]) -> Pending[T]:
        """Send ``call`` in the background, at most once (no retries: its caller sends
        again if it fails). A transport that can send now and read the answer later
        does so on this thread, with no thread between; any other sends ``call`` with
        ``send`` on the worker's thread."""
        if not isinstance(transport, StartingTransport):
            return self.start(send, call)
        try:
            exchange = transport.start(call.request)
        except Exception as exc:
            return Pending(_raiser(exc), _nothing)
        return Pending(lambda: call.result(exchange.result()), exchange.cancel)

    def close(self) -> None:
        """Let the thread end once its call returns."""
        executor, self._executor = self._executor, None
        if executor is not None:
            executor.shutdown(wait=False)


def _raiser(error: Exception) -> Callable[[], NoReturn]:
    def fail() -> NoReturn:
        raise error

    return fail


def _nothing() -> None:
    pass


class Sender:
    """A long-running background loop (a publisher's sender): a daemon thread."""

    def __init__(self, fn: Callable[[], None], name: str) -> None:
        self._thread = threading.Thread(target=fn, name=name, daemon=True)
        self._thread.start()

    def join(self, timeout: float | None) -> None:
        """Wait for the loop to end, at most ``timeout`` seconds."""
        self._thread.join(timeout)

    def is_current(self) -> bool:
        """True when called from the loop itself (a callback it runs)."""
        return threading.current_thread() is self._thread
