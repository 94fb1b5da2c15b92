"""Lowering a stack with ExecuTorch: export, to_backend per partition, caches, atomic writes."""
