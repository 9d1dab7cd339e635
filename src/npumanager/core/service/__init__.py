"""The service: the one owner of its state (the lock, the arbiter, the request
records, the driver), and the facades over it (`Service`, the in-process backend)."""
