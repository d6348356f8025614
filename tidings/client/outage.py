"""A following consumer's outage: how long to wait before the next try, and what the
application hears of it.

A following consumer (plain or a group member) outlives a server restart by polling
again until the server answers. Without a word, a server that is down when the
consumer starts, or a wrong URL, looks like a topic where nothing happens; so the
first failure of an outage is a warning on the ``tidings.client.consumer`` logger, a
reminder follows every :data:`REMIND_EVERY` seconds while it lasts, and its end is
logged (at INFO) with how long it took.
"""

from __future__ import annotations

import logging
import time

from tidings.errors import TidingsError

__all__ = ["REMIND_EVERY", "Outage", "log"]

log = logging.getLogger("tidings.client.consumer")

#: Seconds between the warnings of one outage, after its first.
REMIND_EVERY = 60.0


class Outage:
    """The retriable failures in a row of one consumer (``what`` names it in the log):
    waits of 0.1 s, doubling to 5 s."""

    def __init__(self, what: str) -> None:
        self._what = what
        #: Failures in a row; 0: none (no outage).
        self.failures = 0
        self._since = 0.0
        self._warned = 0.0

    def failed(self, error: TidingsError) -> float:
        """One more failure: logs as the module says; the seconds to wait."""
        now = time.monotonic()
        if not self.failures:
            self._since = self._warned = now
            log.warning(
                "%s: %s: %s; polling again until the server answers",
                self._what,
                type(error).__name__,
                error,
            )
        elif now - self._warned >= REMIND_EVERY:
            self._warned = now
            log.warning(
                "%s: still failing after %.0f s (%d tries): %s: %s",
                self._what,
                now - self._since,
                self.failures + 1,
                type(error).__name__,
                error,
            )
        delay = min(5.0, 0.1 * 2.0**self.failures)
        self.failures += 1
        return delay

    def ended(self) -> None:
        """An answer came: the outage, if any, is over."""
        if self.failures:
            log.info(
                "%s: the server answers again after %.1f s",
                self._what,
                time.monotonic() - self._since,
            )
            self.failures = 0
