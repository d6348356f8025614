"""The transaction service (Tephra's transaction manager plus KIP-98 transactional ids).

Transport-free: the HTTP server exposes it, the messaging core uses its visibility rule.
See docs/transactions.md for the model and the durability design.
"""

from tidings.tx.config import TxConfig
from tidings.tx.manager import TransactionManager
from tidings.tx.visibility import Visibility, classify, is_visible

__all__ = [
    # the service
    "TransactionManager",
    "TxConfig",
    # the visibility rule shared with the messaging core
    "Visibility",
    "classify",
    "is_visible",
]
