"""Which backend takes which node: support, assignment, convex partitions, guards, the Plan."""
