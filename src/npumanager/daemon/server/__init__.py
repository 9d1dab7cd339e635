"""The daemon: sockets, admission and quotas, connections, calls, lanes and
real inference over the service."""
