"""Magika, unmodified, under `npu-manager run`: a daemon (`npu-manager serve --driver
onnxruntime`) is started in a temporary folder, a program using Magika identifies a few
files under `npu-manager run` and then on its own, and the script shows both answers (the
same), and the warning line of a run with no daemon. `identify.py` is Magika's documented
Python usage; nothing in it knows of npu-manager.

    python examples/unmodified_app/run.py [FILE...]

Needs: pip install -e '.[onnxruntime,demo-apps]'. No NPU is used: the daemon runs the model
with ONNX Runtime on this machine's CPU.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from pathlib import Path

BIN = Path(sys.executable).parent
NPU_MANAGER = str(BIN / "npu-manager")
IDENTIFY = str(Path(__file__).with_name("identify.py"))


def identify(files: list[str], socket: Path | None) -> str:
    """Magika's answers for `files`, run under the manager when `socket` is given."""
    command = [sys.executable, IDENTIFY, *files]
    if socket is not None:  # refuse rather than fall back, so a daemon must have answered
        command = [
            NPU_MANAGER,
            "run",
            "--socket",
            str(socket),
            "--no-daemon",
            "refuse",
            "--",
            *command,
        ]
    done = subprocess.run(command, capture_output=True, text=True, check=True)
    for line in done.stderr.splitlines():
        print(f"  stderr: {line}")
    return done.stdout


def main() -> int:
    files = sys.argv[1:] or [__file__, str(Path(__file__).with_name("README.md"))]
    with tempfile.TemporaryDirectory() as folder:
        socket = Path(folder) / "npu.sock"
        daemon = subprocess.Popen(
            [
                NPU_MANAGER,
                "serve",
                "--driver",
                "onnxruntime",
                "--socket",
                str(socket),
                "--importance",
                "none",
                "--log-level",
                "warning",
            ]
        )
        try:
            while not socket.exists():
                if daemon.poll() is not None:
                    raise SystemExit("the daemon did not start")
                time.sleep(0.05)
            print("under npu-manager run:")
            managed = identify(files, socket)
            print(managed)
        finally:
            daemon.terminate()
            daemon.wait(60)
        print("on its own:")
        direct = identify(files, None)
        print(direct)
        print("identical answers:", managed == direct)
        print("with no daemon (the default fallback: in process, one warning line):")
        fallback = [NPU_MANAGER, "run", "--socket", str(socket), "--", sys.executable, IDENTIFY]
        subprocess.run([*fallback, *files], check=True)
    return 0 if managed == direct else 1


if __name__ == "__main__":
    sys.exit(main())
