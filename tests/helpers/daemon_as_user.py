"""`npu-manager serve` that binds its socket and builds its driver as root, then runs as
another uid: a daemon that cannot read the apps' private files, for the descriptor tests.

The interpreter lives where only root may look (this machine's Python is under /root), so
the program starts as root, as the children do, and drops to UID:GID just before its loop
serves anyone. Usage: daemon_as_user.py UID GID SERVE-ARGS...
"""

from __future__ import annotations

import os
import sys

import npumanager.cli.program
from npumanager.daemon.server import server


def main() -> None:
    uid, gid, args = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3:]
    serve_forever = server.Daemon.serve_forever

    def drop_then_serve(self: server.Daemon) -> None:
        if self._binding is None:
            self.bind()
        os.setgroups([gid])
        os.setgid(gid)
        os.setuid(uid)
        serve_forever(self)

    server.Daemon.serve_forever = drop_then_serve  # type: ignore[method-assign]
    sys.exit(npumanager.cli.program.main(["serve", *args]))


if __name__ == "__main__":
    main()
