"""LoopInbox and LongPolls: hand-over from other threads, parking, waking, timeouts."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from concurrent.futures import Future

import pytest

from tidings.server.alone import LoneRequest
from tidings.server.inbox import LoopInbox
from tidings.server.longpoll import LongPolls


async def in_thread(fn: Callable[..., object], *args: object) -> None:
    """Run ``fn(*args)`` on another thread and wait for it (without blocking the loop)."""
    thread = threading.Thread(target=fn, args=args)
    thread.start()
    await asyncio.get_running_loop().run_in_executor(None, thread.join)


async def test_inbox_runs_a_burst_in_order_with_one_wake_up(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    loop = asyncio.get_running_loop()
    inbox = LoopInbox(loop)
    wake_ups = 0
    original = loop.call_soon_threadsafe

    def counting(*args: object) -> asyncio.Handle:
        nonlocal wake_ups
        wake_ups += 1
        return original(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(loop, "call_soon_threadsafe", counting)
    ran: list[int] = []
    done = loop.create_future()

    def burst() -> None:
        for i in range(100):
            inbox.post(ran.append, i)
        inbox.post(done.set_result, None)

    # Joined without yielding to the loop, which cannot drain meanwhile: as when the
    # store's writer ends a commit holding the GIL, the burst shares one wake-up.
    thread = threading.Thread(target=burst)
    thread.start()
    thread.join()
    await done
    assert ran == list(range(100))
    assert wake_ups == 1


async def test_inbox_wait_passes_results_errors_and_cancellation() -> None:
    inbox = LoopInbox(asyncio.get_running_loop())
    ok: Future[int] = Future()
    await in_thread(ok.set_result, 7)
    assert await inbox.wait(ok) == 7

    failed: Future[int] = Future()
    task = asyncio.ensure_future(inbox.wait(failed))
    await in_thread(failed.set_exception, KeyError("k"))
    with pytest.raises(KeyError):
        await task

    pending: Future[int] = Future()
    task = asyncio.ensure_future(inbox.wait(pending))
    await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert pending.cancelled()  # not started yet: the write it stands for is dropped


async def test_inbox_item_failure_does_not_strand_the_rest(
    caplog: pytest.LogCaptureFixture,
) -> None:
    loop = asyncio.get_running_loop()
    inbox = LoopInbox(loop)
    done = loop.create_future()

    def boom() -> None:
        raise RuntimeError("boom")

    def post() -> None:
        inbox.post(boom)
        inbox.post(done.set_result, "after")

    await in_thread(post)
    assert await done == "after"
    assert "boom" in caplog.text


def long_polls() -> LongPolls:
    polls = LongPolls()
    polls.bind(LoopInbox(asyncio.get_running_loop()))
    return polls


async def test_commit_wakes_the_polls_parked_on_its_topic() -> None:
    polls = long_polls()
    a = polls.park("ns", "t")
    b = polls.park("ns", "t")
    other = polls.park("ns", "u")
    waits = asyncio.gather(polls.wait(a, 10), polls.wait(b, 10))
    await in_thread(polls.on_commit, "ns", "t")
    await asyncio.wait_for(waits, 5)
    assert not other.done()
    polls.unpark(other, "ns", "u")
    polls.unpark(a, "ns", "t")  # harmless after the wake-up


async def test_unparked_polls_are_forgotten(monkeypatch: pytest.MonkeyPatch) -> None:
    loop = asyncio.get_running_loop()
    polls = long_polls()
    woken = polls.park("ns", "t", transactions=True)
    polls.unpark(woken, "ns", "t")
    posted: list[object] = []
    monkeypatch.setattr(loop, "call_soon_threadsafe", lambda *args: posted.append(args))
    polls.on_commit("ns", "t")
    polls.on_transaction()
    assert posted == []  # nobody parked: no hop to the loop at all


async def test_wait_times_out_and_transactions_wake_read_committed_polls() -> None:
    polls = long_polls()
    plain = polls.park("ns", "t")
    loop = asyncio.get_running_loop()
    started = loop.time()
    await polls.wait(plain, 0.05)
    assert loop.time() - started >= 0.04
    polls.unpark(plain, "ns", "t")

    committed = polls.park("ns", "t", transactions=True)
    unmoved = polls.park("ns", "t")
    await in_thread(polls.on_transaction)
    await asyncio.wait_for(polls.wait(committed, 10), 5)
    assert not unmoved.done()  # only read-committed polls care about transactions
    polls.unpark(committed, "ns", "t")
    polls.unpark(unmoved, "ns", "t")


async def test_close_releases_every_poll_now_and_later() -> None:
    polls = long_polls()
    parked = polls.park("ns", "t", transactions=True)
    polls.close()
    assert parked.done() and polls.closed
    assert polls.park("ns", "t").done()


async def test_inbox_posts_from_the_loop_without_a_wake_up(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    loop = asyncio.get_running_loop()
    inbox = LoopInbox(loop)
    first = loop.create_future()
    await in_thread(inbox.post, first.set_result, None)  # from a thread: a wake-up
    await first
    wake_ups: list[object] = []
    original = loop.call_soon_threadsafe

    def counting(*args: object) -> asyncio.Handle:
        if getattr(args[0], "__name__", None) == "_drain":  # not the executor's own
            wake_ups.append(args)
        return original(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(loop, "call_soon_threadsafe", counting)
    ran: list[int] = []
    done = loop.create_future()
    inbox.post(ran.append, 1)  # on the loop (a write committed there): none
    inbox.post(done.set_result, None)
    assert ran == []  # still runs later, not inside post()
    await done
    assert ran == [1] and wake_ups == []
    again = loop.create_future()
    await in_thread(inbox.post, again.set_result, None)
    await again
    assert len(wake_ups) == 1


async def test_parked_counts_the_requests_waiting() -> None:
    polls = long_polls()
    a = polls.park("ns", "t")
    b = polls.park("ns", "t")
    assert polls.parked == 0  # parked before the fetch, waiting only in wait()
    waits = [asyncio.ensure_future(polls.wait(f, 10)) for f in (a, b)]
    await asyncio.sleep(0)
    assert polls.parked == 2
    await in_thread(polls.on_commit, "ns", "t")
    await asyncio.wait_for(asyncio.gather(*waits), 5)
    assert polls.parked == 0
    timed_out = polls.park("ns", "t")
    await polls.wait(timed_out, 0.01)
    polls.unpark(timed_out, "ns", "t")
    assert polls.parked == 0


async def test_lone_request_counts_tasks_but_not_parked_polls() -> None:
    polls = long_polls()
    tasks: set[object] = {"this request"}
    alone = LoneRequest(tasks, polls)
    assert alone()
    tasks.add("a poll")
    assert not alone()  # another request at work
    parked = polls.park("ns", "t")
    waiting = asyncio.ensure_future(polls.wait(parked, 10))
    await asyncio.sleep(0)
    assert alone()  # the other one waits in a long-poll: it needs nothing now
    seen: list[bool] = []
    await in_thread(lambda: seen.append(alone()))
    assert seen == [False]  # never off the loop's thread
    await in_thread(polls.on_commit, "ns", "t")
    await asyncio.wait_for(waiting, 5)
    assert not alone()
