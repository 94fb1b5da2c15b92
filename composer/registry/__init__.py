"""Finding backends: entry-point discovery, the options plugins declare, the Stack."""
