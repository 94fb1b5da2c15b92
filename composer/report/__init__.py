"""Reports of a plan: the HTML picture, latency tables."""
