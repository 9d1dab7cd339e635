"""The daemon's clients: `connect()`, the remote backend, shared memory and
lanes."""
