"""Built-in policies and telemetry sinks, registered through entry points like any plugin."""
