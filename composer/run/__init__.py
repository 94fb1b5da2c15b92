"""Running programs: the pip runtime, the torch-free runtime, the libtorch host, verification."""
