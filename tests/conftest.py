"""Shared fixtures: real throwaway plugin distributions, installed into temp folders; the
daemons a test starts and the directory their sockets go to."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

from helpers.daemon_support import SOCKET_GID, Child, DaemonProcess, Daemons, open_socket_dir

# No example may fail for being slow: hypothesis's default 200 ms deadline and its too-slow
# health check judge the machine's speed, and the suite runs beside other work (CI beside
# two CPU spinners). A test that sets its own settings keeps them.
settings.register_profile(
    "busy_machine", deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.load_profile("busy_machine")

# Each throwaway distribution: (distribution name, entry-point name, module source).
PLUGIN_SOURCES: dict[str, tuple[str, str, str]] = {
    "good": (
        "npu-good-plugin",
        "goodnpu",
        """
        from npumanager import hookimpl, DriverRecord, PolicyRecord, SinkRecord

        class GoodDriver:
            def __init__(self, **options):
                self.options = options

        @hookimpl
        def npumanager_register_drivers():
            return [DriverRecord(name="good", factory=GoodDriver,
                                 capabilities={"virtual_time", "preemption"},
                                 description="a throwaway driver")]

        @hookimpl
        def npumanager_register_policies():
            return {"name": "fair", "factory": dict, "version": "9.9"}

        @hookimpl
        def npumanager_register_sinks():
            yield SinkRecord(name="counter", factory=list)

        CONFIGURED = []

        @hookimpl
        def npumanager_configure(config):
            CONFIGURED.append(config)
        """,
    ),
    "broken": (
        "npu-broken-import",
        "brokennpu",
        """
        raise RuntimeError("this plugin cannot be imported")
        """,
    ),
    "invalid": (
        "npu-invalid-record",
        "invalidnpu",
        """
        from npumanager import hookimpl, SinkRecord

        @hookimpl
        def npumanager_register_drivers():
            return [
                {"name": "Bad Name!", "factory": object},
                {"name": "okay", "factory": object, "capabilities": ["teleportation"]},
                {"name": "fine", "factory": object},
            ]

        @hookimpl
        def npumanager_register_sinks():
            return 42
        """,
    ),
    "duplicate": (
        "npu-duplicate-name",
        "dupnpu",
        """
        from npumanager import hookimpl, SinkRecord

        @hookimpl
        def npumanager_register_sinks():
            return [SinkRecord(name="memory", factory=list), SinkRecord(name="extra", factory=list)]
        """,
    ),
    "thermometer": (
        "npu-thermometer-plugin",
        "thermometernpu",
        """
        from npumanager import hookimpl, HealthSample, HealthSourceRecord, ThermalReading

        class Thermometer:
            def __init__(self, temp_mc=40000):
                self.temp_mc = int(temp_mc)

            def read(self):
                if self.temp_mc < 0:
                    raise RuntimeError("probe unplugged")
                severity = 2 if self.temp_mc >= 80000 else 0
                return HealthSample(thermal=[ThermalReading(
                    name="probe", temperature_mc=self.temp_mc, severity=severity)])

        @hookimpl
        def npumanager_register_health_sources():
            return [
                HealthSourceRecord(name="thermometer", factory=Thermometer),
                {"name": "Not A Name", "factory": Thermometer},
                HealthSourceRecord(name="linux", factory=Thermometer),
            ]
        """,
    ),
    "kiosk": (
        "npu-kiosk-plugin",
        "kiosknpu",
        """
        from pydantic import BaseModel, ConfigDict

        from npumanager import Importance, ImportanceSourceRecord, hookimpl
        from npumanager.core.plugins.importance import ImportanceName

        class Kiosk:
            # Every app in front, but those named in `background`; a change is told.

            def __init__(self, background=""):
                self.background = set(filter(None, str(background).split("/")))
                self.changed = None

            def start(self, changed):
                self.changed = changed

            def importance(self, app):
                if app.app_id in self.background:
                    return Importance.CACHED
                return Importance.FOREGROUND

            def send_to_back(self, app_id):
                self.background.add(app_id)
                self.changed(app_id, Importance.CACHED)

            def close(self):
                self.changed = None

        class LampOptions(BaseModel):
            model_config = ConfigDict(extra="forbid")
            level: ImportanceName = Importance.VISIBLE

        class Lamp:
            def __init__(self, options):
                self.level = options.level

            def start(self, changed):
                pass

            def importance(self, app):
                return self.level

            def close(self):
                pass

        @hookimpl
        def npumanager_register_importance_sources():
            return [
                ImportanceSourceRecord(name="kiosk", factory=Kiosk, description="a kiosk"),
                {"name": "lamp", "factory": Lamp, "options_model": LampOptions},
                {"name": "Not A Name", "factory": Kiosk},
                ImportanceSourceRecord(name="desktop", factory=Kiosk),
            ]
        """,
    ),
    "wrapping": (
        "npu-wrapping-plugin",
        "wrapping",
        """
        from npumanager import hookimpl, PolicyRecord, SinkRecord

        SEEN = []

        @hookimpl(tryfirst=True)
        def npumanager_register_sinks():
            SEEN.append("tryfirst")
            return [SinkRecord(name="wrapped-first", factory=list)]

        @hookimpl(specname="npumanager_register_sinks")
        def second_sinks():
            SEEN.append("plain")
            return [SinkRecord(name="wrapped-second", factory=list)]

        @hookimpl(wrapper=True)
        def npumanager_register_policies():
            records = yield
            SEEN.append(("wrapper saw", len(records)))
            return [*records, [PolicyRecord(name="added-by-wrapper", factory=dict)]]

        @hookimpl(specname="npumanager_register_policies")
        def own_policies():
            return [PolicyRecord(name="wrapped-policy", factory=dict)]

        @hookimpl(wrapper=True)
        def npumanager_register_drivers():
            try:
                return (yield)
            except ValueError:
                SEEN.append("wrapper caught")
                return []

        @hookimpl(specname="npumanager_register_drivers")
        def failing_drivers():
            raise ValueError("rescued by the wrapper")
        """,
    ),
    "raising": (
        "npu-raising-hook",
        "raisingnpu",
        """
        from npumanager import hookimpl, SinkRecord

        @hookimpl
        def npumanager_register_sinks():
            return [SinkRecord(name="never-seen", factory=list)]

        @hookimpl
        def npumanager_register_drivers():
            raise ValueError("driver registry on fire")
        """,
    ),
}


def _write_distribution(root: Path, key: str) -> Path:
    dist, entry_point, source = PLUGIN_SOURCES[key]
    module = dist.replace("-", "_")
    project = root / "src" / dist
    project.mkdir(parents=True)
    (project / f"{module}.py").write_text(textwrap.dedent(source))
    (project / "pyproject.toml").write_text(
        textwrap.dedent(
            f"""
            [build-system]
            requires = ["setuptools"]
            build-backend = "setuptools.build_meta"

            [project]
            name = "{dist}"
            version = "1.2.3"

            [project.entry-points.npumanager]
            {entry_point} = "{module}"

            [tool.setuptools]
            py-modules = ["{module}"]
            """
        )
    )
    return project


class InstalledPlugins:
    """Folders, each holding a set of really installed throwaway distributions."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._sites: dict[frozenset[str], Path] = {}
        self._projects: dict[str, Path] = {}

    def site(self, *keys: str) -> Path:
        """A folder where exactly these distributions are installed (pip --target)."""
        wanted = frozenset(keys)
        if wanted not in self._sites:
            for key in wanted - self._projects.keys():
                self._projects[key] = _write_distribution(self.root / key, key)
            target = self.root / ("site-" + "-".join(sorted(wanted)))
            subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "pip",
                    "install",
                    "--quiet",
                    "--no-deps",
                    "--no-build-isolation",
                    "--no-index",
                    "--target",
                    str(target),
                    *(str(self._projects[k]) for k in sorted(wanted)),
                ],
                check=True,
                capture_output=True,
            )
            self._sites[wanted] = target
        return self._sites[wanted]


@pytest.fixture(scope="session")
def installed_plugins(tmp_path_factory: pytest.TempPathFactory) -> InstalledPlugins:
    """Build and install throwaway plugin distributions once per session."""
    return InstalledPlugins(tmp_path_factory.mktemp("plugins"))


@pytest.fixture
def plugin_site(
    installed_plugins: InstalledPlugins, monkeypatch: pytest.MonkeyPatch
) -> Iterator[object]:
    """Call with distribution keys to put just those on sys.path for this test."""

    def use(*keys: str) -> Path:
        site = installed_plugins.site(*keys)
        monkeypatch.syspath_prepend(str(site))
        return site

    yield use
    for name in list(sys.modules):
        if name.startswith("npu_") and name.endswith(
            ("_plugin", "_import", "_record", "_name", "_hook")
        ):
            del sys.modules[name]


@pytest.fixture(autouse=True)
def _clean_plugin_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No test sees the developer's own config file or plugin variables."""
    for var in (
        "NPUMANAGER_STRICT_PLUGINS",
        "NPUMANAGER_DISABLE_PLUGINS",
        "NPUMANAGER_LOAD_PLUGINS",
    ):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg-config"))
    monkeypatch.delenv("NPUMANAGER_CONFIG", raising=False)


# Daemons ---------------------------------------------------------------------------------


@pytest.fixture
def socket_dir() -> Iterator[Path]:
    """A fresh directory under /tmp that every test uid may enter, removed afterwards."""
    directory = open_socket_dir()
    yield directory
    shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture
def daemon(socket_dir: Path) -> Iterator[Daemons]:
    """Start daemons in `socket_dir`: `daemon(*serve_args)` a subprocess, `daemon.on_a_thread(
    service)` one in this process. At the end of the test the ones still running are stopped,
    and each subprocess must exit 0."""
    daemons = Daemons(socket_dir)
    yield daemons
    daemons.stop_all()


@pytest.fixture
def model_file(socket_dir: Path) -> Path:
    """The chain model (`realexec.chain`) in `socket_dir`, readable by every test uid."""
    from npumanager.vendor_drivers.realexec.chain import chain_model

    path = socket_dir / "chain.onnx"
    path.write_bytes(chain_model())
    path.chmod(0o644)
    return path


@pytest.fixture
def start_onnxruntime(daemon: Daemons) -> Iterator[Callable[..., DaemonProcess]]:
    """Start `serve --driver onnxruntime` daemons whose socket group lets the test uids in,
    their driver's background workers at the normal OS priority (under `SCHED_IDLE`, beside
    busy programs, a worker holding the daemon's GIL can stall every thread of it for
    minutes; no test of these checks the OS priority).

    The apps of `helpers.real_daemon.app` are closed first; no daemon may log a traceback.
    """
    started: list[DaemonProcess] = []
    children: list[Child] = []

    def start(*args: str) -> DaemonProcess:
        normal = ("--driver-option", "background_idle=false")
        process = daemon(
            "--socket-group", str(SOCKET_GID), "--driver", "onnxruntime", *normal, *args
        )
        process.children = children  # type: ignore[attr-defined]
        started.append(process)
        return process

    yield start
    for child in children:
        child.close()
    for process in started:
        if process.alive:
            assert process.stop() == 0, process.log()
        assert "Traceback" not in process.log(), process.log()


# The quick subset ------------------------------------------------------------------------

SLOW_MODULES = frozenset(
    {
        "test_arbiter_stateful",
        "test_benchmarks_report",
        "test_channel_hog",
        "test_cli",
        "test_conformance",
        "test_conformance_acme",
        "test_conformance_vts",
        "test_daemon",
        "test_daemon_apps",
        "test_daemon_attacks",
        "test_daemon_fuzz",
        "test_daemon_inference",
        "test_daemon_lanes",
        "test_daemon_load",
        "test_daemon_loader",
        "test_demo",
        "test_device_users_counted",
        "test_differential",
        "test_docs_edges",
        "test_docs_first_hour",
        "test_docs_site",
        "test_example_focus",
        "test_first_hour_console",
        "test_health_cli",
        "test_health_daemon",
        "test_host_memory",
        "test_model_hosts",
        "test_onnxruntime_driver",
        "test_openvino_driver",
        "test_plugin_unavailable",
        "test_policies_differential",
        "test_real_demo",
        "test_real_inference_client",
        "test_realexec_inline",
        "test_realexec_races",
        "test_restart_preemption",
        "test_rough_edges",
        "test_rough_edges_cli",
        "test_rough_edges_tools",
        "test_run_cli",
        "test_run_differential",
        "test_run_magika",
        "test_run_programs",
        "test_run_threads",
        "test_run_uncarried",
        "test_runtime_options",
        "test_shared_cores",
        "test_simulate",
        "test_systemd",
        "test_units_hardening",
        "test_vnpu",
    }
)
"""Modules whose tests start daemons, console scripts, real inference, benchmarks or long
hypothesis runs: every test in them is `slow`, and `-m "not slow"` leaves them out."""


def pytest_configure(config: pytest.Config) -> None:
    """Give Ctrl-C back to the commands tests start and interrupt: a shell that ran the
    suite in the background handed it SIGINT ignored, and children inherit an ignored
    signal (a handled one is reset to the default on exec). Then cache bytecode."""
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    write_bytecode()


def write_bytecode() -> None:
    """Let this process and every one it starts cache compiled modules, whatever the
    machine's `PYTHONDONTWRITEBYTECODE` says: the suite starts about 700 Python processes
    (daemons, apps, hosts, nested pytest runs), and without a cache each one compiled every
    module it imports from source, and pytest rewrote its test modules and plugins again."""
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    sys.dont_write_bytecode = False


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """One worker more than this process may use CPUs (`-n auto`): a worker spends much of
    its time waiting on the daemons, apps and commands its tests start, and an idle CPU
    beside two waiting workers is time lost (`--maxprocesses` still caps the count)."""
    return len(os.sched_getaffinity(0)) + 1


FIRST_MODULES = ("test_daemon_load",)
"""Modules whose tests run first: the 200-client load test takes a minute or more, and a
worker that began it near the end would run on alone while the others sat idle (pytest-xdist
hands each worker a contiguous share of the collection, the first share starting here)."""


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark `slow` every test of a module in `SLOW_MODULES`; `FIRST_MODULES`' tests first."""
    for item in items:
        if item.path.stem in SLOW_MODULES:
            item.add_marker(pytest.mark.slow)
    items.sort(key=lambda item: item.path.stem not in FIRST_MODULES)  # a stable sort
