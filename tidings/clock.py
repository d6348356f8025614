"""Wall clocks, injectable so tests can step time (including backwards)."""

from __future__ import annotations

import threading
import time
from typing import Protocol

__all__ = ["Clock", "FakeClock", "SystemClock"]


class Clock(Protocol):
    """A source of wall-clock time in milliseconds since the epoch."""

    def now_ms(self) -> int:
        """Current time in ms; may go backwards (callers guard with max(now, last))."""
        ...


class SystemClock:
    """The machine's wall clock."""

    def now_ms(self) -> int:
        return time.time_ns() // 1_000_000


class FakeClock:
    """A clock tests move by hand; thread-safe."""

    def __init__(self, start_ms: int = 1_700_000_000_000) -> None:
        self._now = start_ms
        self._lock = threading.Lock()

    def now_ms(self) -> int:
        with self._lock:
            return self._now

    def set(self, ms: int) -> None:
        """Jump to ``ms`` (backwards too)."""
        with self._lock:
            self._now = ms

    def advance(self, ms: int) -> None:
        """Move forward (or back, if negative) by ``ms``."""
        with self._lock:
            self._now += ms
