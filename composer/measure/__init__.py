"""Timing programs: interleaved latency, traces, whole-program and per-region placement."""
