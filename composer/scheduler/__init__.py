"""The scheduler: guarded, convex partitioning per backend, stacked in priority order."""

from composer.scheduler.convex import partition_convex
from composer.scheduler.partitioner import ComposerPartitioner
from composer.scheduler.validate import find_tag_cycle

__all__ = ["ComposerPartitioner", "find_tag_cycle", "partition_convex"]
