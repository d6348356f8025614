"""How many examples a property test tries.

The suite runs on two shared cores within CI's limit, so a property's everyday budget
is what finds its bugs within a few seconds (the codec round-trips fail within tens of
examples when they fail at all). ``TIDINGS_HYPOTHESIS_PROFILE=long`` multiplies every
budget for a deep local run, and raises the default of the properties that name none.
"""

from __future__ import annotations

import os

PROFILE = os.environ.get("TIDINGS_HYPOTHESIS_PROFILE", "tidings")
LONG_FACTOR = 10


def examples(n: int) -> int:
    """``n`` examples, or ``LONG_FACTOR`` times as many under the ``long`` profile."""
    return n * LONG_FACTOR if PROFILE == "long" else n
