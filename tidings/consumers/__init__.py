"""Consumer groups (and, next, queues): transport-free, over the store and the
transaction manager, beside the messaging core (DESIGN.md, "Components")."""

from tidings.codec.groups import partition_of
from tidings.consumers.groups import GroupCoordinator

__all__ = ["GroupCoordinator", "partition_of"]
