"""What the tests share that is not a test: daemons, child processes, builders and fakes."""
