"""Scenarios as data, and a runner that plays one with and without the arbiter."""
