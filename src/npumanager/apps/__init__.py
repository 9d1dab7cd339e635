"""Apps as the kernel names them: a client's process (a pidfd), its cgroup v2 path, and the app
id that systemd's desktop conventions, Flatpak, Snap or a service's unit name put in that path,
never what a client claims; `npumanager.apps.identity` reads and parses them, importing only the
standard library, the errors and the schemas, so the daemon, the CLI and the importance sources
can all build on it.
"""
