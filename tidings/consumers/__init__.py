"""Consumer groups and queues: transport-free, over the store and the transaction
manager, beside the messaging core (docs/design.md, "Where things live")."""

from tidings.codec.groups import partition_of
from tidings.consumers.groups import GroupCoordinator
from tidings.consumers.queues import QueueCoordinator

__all__ = ["GroupCoordinator", "QueueCoordinator", "partition_of"]
