"""Settings of the transaction manager."""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["MAX_TIMEOUT_LIMIT", "TxConfig"]

#: The largest ``max_timeout`` (seconds; 100 years): a transaction's expiry is a time in
#: ms stored as a signed 64-bit integer (log records, snapshots), which a timeout of
#: about 292,000 years would overflow, leaving a begin applied in memory that the log
#: cannot hold.
MAX_TIMEOUT_LIMIT = 100 * 365 * 24 * 3600.0


@dataclass(frozen=True)
class TxConfig:
    """How the transaction manager behaves; times are in seconds.

    ``snapshot_every`` counts log records: after that many, a background snapshot
    truncates the log (recovery then replays at most about that many records).
    ``sync=False`` skips the fsync of each group commit: acknowledged changes then
    survive a crash of the process (the data is in the OS page cache) but not a crash
    of the machine. ``history_size`` bounds how many ended transactions are remembered
    to answer "already committed/aborted" rather than "not found". ``max_open`` bounds
    the transactions open at once (each holds memory and holds back what readers see):
    a begin beyond it is refused with :class:`~tidings.errors.TooManyTransactions`.
    """

    default_timeout: float = 30.0
    max_timeout: float = 3600.0
    sweep_interval: float = 1.0
    snapshot_every: int = 10_000
    sync: bool = True
    history_size: int = 100_000
    #: Seconds a transactional id may go unused before it is forgotten.
    producer_expiry: float = 7 * 24 * 3600.0
    max_open: int = 10_000

    def __post_init__(self) -> None:
        for name in ("default_timeout", "max_timeout", "sweep_interval", "producer_expiry"):
            value = getattr(self, name)
            if not (isinstance(value, int | float) and math.isfinite(value) and value > 0):
                raise ValueError(f"TxConfig.{name} must be a positive number, got {value!r}")
        if self.default_timeout > self.max_timeout:
            raise ValueError("TxConfig.default_timeout is above max_timeout")
        if self.max_timeout > MAX_TIMEOUT_LIMIT:
            raise ValueError(
                f"TxConfig.max_timeout must be at most {MAX_TIMEOUT_LIMIT:.0f} s (100 years)"
            )
        if self.snapshot_every < 1:
            raise ValueError("TxConfig.snapshot_every must be at least 1")
        if isinstance(self.max_open, bool) or not isinstance(self.max_open, int):
            raise ValueError(f"TxConfig.max_open must be an integer, got {self.max_open!r}")
        if self.max_open < 1:
            raise ValueError("TxConfig.max_open must be at least 1")
        if self.history_size < 0:
            raise ValueError("TxConfig.history_size must not be negative")
