"""What the asyncio client waits on; :mod:`tidings.client._sync.concurrency` is its
threaded twin, with the same names less the ``Async`` prefix (written by hand, not
generated: this is where the two sides really differ)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, Generic, ParamSpec, Self, TypeVar

from tidings.client.api import Call

__all__ = [
    "SEND_TURNS",
    "AsyncCondition",
    "AsyncFuture",
    "AsyncPending",
    "AsyncSender",
    "AsyncWorker",
    "claim",
    "new_future",
    "settle",
    "sleep",
    "yield_turns",
]

T = TypeVar("T")
P = ParamSpec("P")

#: The future a publisher's ``send`` returns.
AsyncFuture = asyncio.Future


async def sleep(seconds: float) -> None:
    """Wait ``seconds`` without holding up the event loop."""
    await asyncio.sleep(seconds)


#: Loop turns a request sent in the background needs to be written: the default
#: transport writes it in one, aiohttp's needs two (measured; one left it unsent until
#: after the caller's decoding).
SEND_TURNS = 2


async def yield_turns(turns: int = SEND_TURNS) -> None:
    """Give tasks just started ``turns`` loop turns, e.g. to write their request
    before the caller holds the loop decoding (the sync twin does nothing)."""
    for _ in range(turns):
        await asyncio.sleep(0)


def new_future() -> AsyncFuture[None]:
    """A future of the running loop."""
    return asyncio.get_running_loop().create_future()


def claim(future: AsyncFuture[None]) -> bool:
    """True if ``future`` still wants a result (the caller did not cancel it)."""
    return not future.done()


def settle(future: AsyncFuture[None], error: BaseException | None) -> None:
    """Resolve ``future`` (to None, or failed with ``error``) unless it is done."""
    if future.done():
        return
    if error is None:
        future.set_result(None)
    else:
        future.set_exception(error)


class AsyncCondition:
    """An :class:`asyncio.Condition` made on first use, so that an object holding one
    can be created outside the event loop it is later used on."""

    def __init__(self) -> None:
        self._cond: asyncio.Condition | None = None

    def _get(self) -> asyncio.Condition:
        if self._cond is None:
            self._cond = asyncio.Condition()
        return self._cond

    async def __aenter__(self) -> Self:
        await self._get().acquire()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        self._get().release()

    def notify_all(self) -> None:
        """Wake every waiter (the lock must be held)."""
        self._get().notify_all()

    async def wait(self, timeout: float | None) -> None:
        """Wait for a notification, at most ``timeout`` seconds (None: no limit)."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._get().wait(), timeout)

    async def wait_for(self, predicate: Callable[[], bool], timeout: float | None) -> bool:
        """Wait until ``predicate()`` holds; False if ``timeout`` seconds pass first."""
        try:
            async with asyncio.timeout(timeout):
                await self._get().wait_for(predicate)
        except TimeoutError:
            return False
        return True


class AsyncPending(Generic[T]):
    """A call running in the background (see :class:`AsyncWorker`)."""

    def __init__(self, task: asyncio.Task[T]) -> None:
        self._task = task

    async def result(self) -> T:
        """Its result, once it is done (its exception, if it failed)."""
        return await self._task

    def cancel(self) -> None:
        """Stop it (an answer on its way is dropped)."""
        self._task.cancel()


class AsyncWorker:
    """Runs calls in the background: tasks on the event loop."""

    def __init__(self, name: str) -> None:
        self.name = name

    def start(
        self, fn: Callable[P, Awaitable[T]], *args: P.args, **kwargs: P.kwargs
    ) -> AsyncPending[T]:
        """Start ``fn(*args, **kwargs)`` in the background."""

        async def run() -> T:
            return await fn(*args, **kwargs)

        task = asyncio.ensure_future(run())
        task.add_done_callback(_retrieve)
        return AsyncPending(task)

    def begin(
        self, transport: object, send: Callable[[Call[T]], Awaitable[T]], call: Call[T]
    ) -> AsyncPending[T]:
        """Send ``call`` with ``send`` in the background (a task; the sync twin reads
        the answer on the caller's thread where its transport can)."""
        return self.start(send, call)

    def close(self) -> None:
        """Release what the worker holds (tasks need nothing released)."""


def _retrieve(task: asyncio.Task[T]) -> None:
    """Mark a background call's failure as seen: whoever needs its result sees it then."""
    if not task.cancelled():
        with contextlib.suppress(Exception):
            task.exception()


class AsyncSender:
    """A long-running background loop (a publisher's sender): a task."""

    def __init__(self, fn: Callable[[], Coroutine[Any, Any, None]], name: str) -> None:
        self._task: asyncio.Task[None] = asyncio.create_task(fn(), name=name)

    async def join(self, timeout: float | None) -> None:
        """Wait for the loop to end, at most ``timeout`` seconds."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(self._task), timeout)

    def is_current(self) -> bool:
        """True when called from the loop itself (a callback it runs)."""
        return asyncio.current_task() is self._task
