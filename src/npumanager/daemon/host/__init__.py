"""Model hosts: each client's models parsed, opened and run in a process of its own.

The daemon arbitrates and schedules; a host only executes. `process` is the host itself,
`sandbox` how it confines itself, `messages` what crosses between them, and `client` the
daemon's side: a `ModelHost` per connection and the `HostedSession`s the driver's
channels run as they run any session.
"""
