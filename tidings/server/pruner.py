"""Pruning the transaction manager's invalid list once no data refers to a pointer.

A timed-out or invalidated transaction's pointer stays on the invalid list so that every
transactional reader skips what it wrote. Once no Message Table entry names it any more
(its client rolled the entries back, or retention dropped them), it can go, as in
Tephra, which keeps every snapshot small.

That is safe only if nothing can name the pointer later: the server guards every
publish with :meth:`~tidings.tx.TransactionManager.check_writable` (a transaction
that has ended is refused inside the write function), and a pass waits for a store
barrier before it scans, so a publish that passed the guard just before its
transaction ended has committed and is seen. It runs only where one process holds
both services (role ``all``): elsewhere nothing guards the publishes.
"""

from __future__ import annotations

import logging
import threading

from tidings.consumers.groups import GroupCoordinator
from tidings.consumers.queues import QueueCoordinator
from tidings.messaging import MessagingService
from tidings.tx import TransactionManager

__all__ = ["InvalidListPruner"]

log = logging.getLogger("tidings.server")


class InvalidListPruner:
    """Every ``interval`` seconds, prunes the invalid pointers no entry names.

    A pass scans the whole Message Table (``chunk`` entries per read snapshot, ``pause``
    seconds between chunks) and only when the invalid list is not empty. A chunk of
    1,000 entries takes ~0.3 ms here, so the defaults hold the interpreter ~13 % of the
    time (~440,000 entries/s) and keep requests' latency undisturbed.
    """

    def __init__(
        self,
        messaging: MessagingService,
        tx: TransactionManager,
        interval: float,
        *,
        chunk: int = 1_000,
        pause: float = 0.002,
        groups: GroupCoordinator | None = None,
        queues: QueueCoordinator | None = None,
    ) -> None:
        self.messaging = messaging
        self.groups = groups
        self.queues = queues
        self.tx = tx
        self.interval = interval
        self.chunk = chunk
        self.pause = pause
        self.pruned_total = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def run_once(self) -> list[int]:
        """One pass: the pointers it pruned (ascending)."""
        candidates = set(self.tx.state().invalid)
        if not candidates:
            return []
        # Publishes that passed the guard before these pointers ended commit first.
        self.messaging.barrier()
        referenced = self.messaging.referenced_pointers(
            candidates, chunk=self.chunk, pause=self.pause, cancelled=self._stop.is_set
        )
        if self.groups is not None:  # consumer-group positions name pointers too
            referenced |= self.groups.referenced_pointers(candidates - referenced)
        if self.queues is not None:  # so do acks held in transactions
            referenced |= self.queues.referenced_pointers(candidates - referenced)
        prunable = sorted(candidates - referenced)
        if not prunable:
            return []
        pruned = sorted(self.tx.prune(ids=prunable))
        self.pruned_total += len(pruned)
        return pruned

    def start(self) -> None:
        """Run passes in a daemon thread until :meth:`stop`."""
        self._thread = threading.Thread(target=self._loop, name="tidings-pruner", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop the thread (a pass under way stops after its current chunk, pruning
        nothing)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                pruned = self.run_once()
            except Exception as exc:  # the next pass tries again; the list only grows
                log.error(f"pruning the invalid list failed: {exc}", extra={"event": "error"})
                continue
            if pruned:
                log.info(
                    f"pruned {len(pruned)} invalid transaction pointer(s)",
                    extra={"event": "prune", "pruned": len(pruned)},
                )
