"""Whether another uid can enter this checkout and the environment the tests run in.

A test whose processes drop to another uid (an example's apps, a console script run as
nobody, a model host of the app's uid) reads the checkout (scripts, examples) and the
virtualenv's packages (numpy's and openvino's lazy imports) as that uid. In a checkout
under a folder other uids cannot enter (under /root, in a `mktemp -d` folder of mode 0700)
they fail for that alone; `needs_checkout_other_uids_can_enter` skips them there, saying
why in one line.
"""

from __future__ import annotations

import functools
import os
import stat
import subprocess
import sysconfig
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
"""The checkout's root."""
PACKAGES = Path(sysconfig.get_paths()["purelib"]).resolve()
"""Where the environment the tests run in keeps its packages (a virtualenv's site-packages)."""
NOBODY = 65534
"""The uid (and gid) asked about when a test does not say which it drops to."""


def _closed(path: Path) -> str | None:
    """Which folder from `/` down to `path` lacks the search bit for others (or, for `path`
    itself, the read bit), read as root; None if none does."""
    for folder in [*reversed(path.parents), path]:
        mode = os.stat(folder).st_mode
        if not mode & stat.S_IXOTH:
            return f"{folder} has no x for others"
        if folder == path and not mode & stat.S_IROTH:
            return f"{folder} has no r for others"
    return None


@functools.cache
def refusal(path: Path, uid: int = NOBODY) -> str | None:
    """Why `uid` cannot list and enter the folder `path`, tried as that uid (a shell that
    dropped to it); None if it can, or if this process cannot drop to another uid."""
    if os.geteuid() != 0:
        return None
    probe = 'test -r "$1" && test -x "$1"'
    try:
        tried = subprocess.run(
            ["/bin/sh", "-c", probe, "sh", str(path)],
            user=uid,
            group=uid,
            extra_groups=[],
            cwd="/",
            env={},
            capture_output=True,
            timeout=60,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        entered = _closed(path) is None  # no shell to try with: the mode bits say
    else:
        entered = tried.returncode == 0
    if entered:
        return None
    return f"{path} cannot be entered by uid {uid} ({_closed(path) or 'an ACL refuses it'})"


def needs_checkout_other_uids_can_enter(uid: int = NOBODY) -> None:
    """Skip the calling test unless `uid` can enter the checkout and the environment's
    packages, as the processes it drops to that uid must."""
    for what, path in (
        ("the checkout", ROOT),
        ("the virtualenv's packages", PACKAGES),
    ):
        why = refusal(path, uid)
        if why is not None:
            pytest.skip(
                f"{what} at {why}: clone it, with its virtualenv, where other uids can "
                "read it (e.g. under /srv, or in /tmp with mode 755) to run this test"
            )
