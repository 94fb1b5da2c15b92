"""The plugin contract: hookspecs, the option schema, backend specs, errors, op names."""
