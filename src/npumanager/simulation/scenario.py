"""The scenario file: devices, apps, their models and work, and timed events, validated.

A scenario is TOML. Times are in milliseconds of virtual time, costs in microseconds of
compute at the device's full clock, sizes in bytes. Names of enums are the platform's
(`FOREGROUND`, `GREATER_THAN_2G`, `OPPORTUNISTIC`, ...).
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import Annotated, Any, Literal, Self, get_args

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from npumanager.core.plugins.tomlfile import read_toml
from npumanager.errors import ConfigError
from npumanager.schemas import Importance, ModelPriority, ModelSize
from npumanager.schemas.device import DeviceSpec
from npumanager.schemas.limits import (
    INT64_MAX,
    MAX_BURST,
    MAX_COST_CYCLES,
    MAX_DEVICES,
    MAX_HEAT_STEP_MC,
    MAX_SCENARIO_APP_MS,
    MAX_SCENARIO_APPS,
    MAX_SCENARIO_JOBS,
)

_GIB = 1 << 30

Positive = Annotated[int, Field(gt=0)]
NonNegative = Annotated[int, Field(ge=0)]


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)


def _enum_by_name(enum: Any, value: Any) -> Any:
    if isinstance(value, str):
        try:
            return enum[value.upper()]
        except KeyError:
            allowed = ", ".join(m.name for m in enum)
            raise ValueError(f"must be one of {allowed}; got {value!r}") from None
    return enum(value)


class ScenarioRunError(ConfigError):
    """A scenario that validated but failed while it ran; the message starts with the key or
    app at fault (`app 'camera': ...`), and the command puts the file in front."""

    @classmethod
    def at(cls, where: str, error: Exception) -> ScenarioRunError:
        """`error`, said of `where` (kept as it is if it already names its place)."""
        if isinstance(error, ScenarioRunError):
            return error
        return cls(f"{where}: {error}" if where else str(error))


class Work(_Model):
    """How an app uses its model once loaded.

    periodic: one job every `period_ms` (a camera frame); loop: jobs back to back, the next
    submitted when the last ends; burst: `burst` jobs every `period_ms`.
    """

    kind: Literal["periodic", "loop", "burst"]
    cost_us: Positive
    period_ms: Positive = 1000
    burst: Annotated[int, Field(gt=0, le=MAX_BURST)] = 1
    job_priority: Annotated[int, Field(ge=0, le=1000)] = 0
    deadline_ms: Positive | None = None
    """A job that takes longer than this from arrival to completion misses its deadline."""


class App(_Model):
    """One app: who it is, its model, when it starts, what work it runs."""

    name: Annotated[str, Field(min_length=1, max_length=40)]
    uid: Annotated[int, Field(ge=0, lt=2**31)]
    importance: Importance = Importance.FOREGROUND
    model_bytes: Annotated[int, Field(gt=0, le=INT64_MAX)]
    size: ModelSize | None = None
    priority: ModelPriority = ModelPriority.NORMAL
    start_ms: NonNegative = 0
    stop_ms: Positive | None = None
    """When the app gives its model up for good (default: it keeps going to the end)."""
    device: NonNegative = 0
    """The device the app loads onto in the direct run (the policy places managed loads)."""
    retry_ms: Positive = 250
    """After a refusal or an unload, how long the app waits before asking again."""
    work: Work
    role: Literal["camera", "assistant", "background", "indexer", "other"] = "other"
    """What the demo's table calls the app; metrics are reported by role."""

    @field_validator("importance", mode="before")
    @classmethod
    def _importance(cls, value: Any) -> Any:
        return _enum_by_name(Importance, value)

    @field_validator("size", mode="before")
    @classmethod
    def _size(cls, value: Any) -> Any:
        return None if value is None else _enum_by_name(ModelSize, value)

    @field_validator("priority", mode="before")
    @classmethod
    def _priority(cls, value: Any) -> Any:
        return _enum_by_name(ModelPriority, value)

    @property
    def size_class(self) -> ModelSize:
        """The declared size class, or the one the model's bytes fall in."""
        if self.size is not None:
            return self.size
        if self.model_bytes < _GIB:
            return ModelSize.LESS_THAN_1GB
        if self.model_bytes <= 2 * _GIB:
            return ModelSize.BETWEEN_1GB_AND_2GB
        return ModelSize.GREATER_THAN_2G


class Event(_Model):
    """Something that happens at a time: an importance change, a thermal spike, memory pressure."""

    at_ms: NonNegative
    kind: Literal["importance", "heat", "memory_pressure"]
    app: str | None = None
    importance: Importance | None = None
    device: NonNegative = 0
    millicelsius: Annotated[int, Field(ge=-MAX_HEAT_STEP_MC, le=MAX_HEAT_STEP_MC)] = 0
    level: Annotated[int, Field(ge=0, le=2)] = 0

    @field_validator("importance", mode="before")
    @classmethod
    def _importance(cls, value: Any) -> Any:
        return None if value is None else _enum_by_name(Importance, value)

    @model_validator(mode="after")
    def _complete(self) -> Self:
        if self.kind == "importance" and (self.app is None or self.importance is None):
            raise ValueError("an importance event needs 'app' and 'importance'")
        return self


class Scenario(_Model):
    """A whole scenario file."""

    name: str
    description: str = ""
    duration_ms: Annotated[int, Field(gt=0, le=3_600_000)]
    policy: str = "pressure"
    policy_params: dict[str, Any] = Field(default_factory=dict)
    devices: list[DeviceSpec] = Field(
        default_factory=lambda: [DeviceSpec()], min_length=1, max_length=MAX_DEVICES
    )
    apps: list[App] = Field(min_length=1)
    events: list[Event] = Field(default_factory=list)

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        names = [app.name for app in self.apps]
        if len(set(names)) != len(names):
            raise ValueError(f"app names must be unique; got {names}")
        uids = [app.uid for app in self.apps]
        if len(set(uids)) != len(uids):
            raise ValueError(f"app uids must be unique; got {uids}")
        for app in self.apps:
            if app.device >= len(self.devices):
                raise ValueError(f"app {app.name!r} names unknown device {app.device}")
            if app.stop_ms is not None and app.stop_ms <= app.start_ms:
                raise ValueError(
                    f"app {app.name!r}: stop_ms ({app.stop_ms}) must be after start_ms "
                    f"({app.start_ms})"
                )
        for event in self.events:
            if event.app is not None and event.app not in names:
                raise ValueError(f"event at {event.at_ms} ms names unknown app {event.app!r}")
            if event.device >= len(self.devices):
                raise ValueError(f"event at {event.at_ms} ms names unknown device {event.device}")
        return self

    def event_key(self, index: int) -> str:
        """How an error names the scenario's event `index`: `events.2 (heat at 500 ms)`."""
        event = self.events[index]
        return f"events.{index} ({event.kind} at {event.at_ms} ms)"

    def app(self, name: str) -> App:
        """The app of that name."""
        return next(app for app in self.apps if app.name == name)

    def estimated_jobs(self, app: App) -> int:
        """An upper bound of the jobs `app` brings in one run: arrivals, or loops back to back."""
        span = max(0, (app.stop_ms or self.duration_ms) - app.start_ms)
        work = app.work
        if work.kind == "loop":
            return (span * 1000 // work.cost_us + 1) * work.burst
        return -(-span // work.period_ms) * work.burst


def check_budget(scenario: Scenario, origin: str) -> None:
    """Refuse, before any run, a scenario that would take more than the documented budget."""
    apps = len(scenario.apps)
    if apps > MAX_SCENARIO_APPS:
        raise ConfigError(f"{origin}: apps: {apps} apps; the limit is {MAX_SCENARIO_APPS}")
    app_ms = apps * scenario.duration_ms
    if app_ms > MAX_SCENARIO_APP_MS:
        raise ConfigError(
            f"{origin}: duration_ms: {apps} apps for {scenario.duration_ms} ms is {app_ms} "
            f"app-milliseconds to step; the limit is {MAX_SCENARIO_APP_MS} (fewer apps or a "
            "shorter duration)"
        )
    fastest = max(device.clock_mhz for device in scenario.devices)
    for index, app in enumerate(scenario.apps):
        if app.work.cost_us * fastest > MAX_COST_CYCLES:
            raise ConfigError(
                f"{origin}: apps.{index}.work.cost_us: {app.work.cost_us} us at {fastest} MHz "
                f"costs more than the {MAX_COST_CYCLES} cycles a job may; at most "
                f"{MAX_COST_CYCLES // fastest}"
            )
    jobs = sum(scenario.estimated_jobs(app) for app in scenario.apps)
    if jobs > MAX_SCENARIO_JOBS:
        busiest = max(scenario.apps, key=scenario.estimated_jobs)
        raise ConfigError(
            f"{origin}: apps.work: up to {jobs} jobs a run (most from app {busiest.name!r}); "
            f"the limit is {MAX_SCENARIO_JOBS} (a longer period_ms or cost_us, a smaller burst, "
            "or a shorter duration)"
        )


def shipped_scenarios() -> dict[str, Path]:
    """The scenario files that ship in `npumanager/scenarios/`, by name (file stem)."""
    folder = Path(str(resources.files("npumanager") / "scenarios"))
    return {path.stem: path for path in sorted(folder.glob("*.toml"))}


def find_scenario(spec: str) -> Path:
    """A scenario file given by path, or a shipped one by name (`thermal_stress`)."""
    path = Path(spec)
    if path.suffix == ".toml" or path.exists() or "/" in spec:
        return path
    shipped = shipped_scenarios()
    found = shipped.get(spec.replace("-", "_"))
    if found is None:
        names = ", ".join(shipped)
        raise ConfigError(f"no scenario file or shipped scenario {spec!r}; shipped: {names}")
    return found


def load_scenario(path: Path) -> Scenario:
    """Read and validate a scenario file; a bad one raises `ConfigError` naming file and key."""
    return parse_scenario(read_toml(path), str(path))


def parse_scenario(data: dict[str, Any], origin: str = "scenario") -> Scenario:
    """Validate scenario data; errors name the key path and what is allowed."""
    try:
        scenario = Scenario.model_validate(data, strict=False)
    except ValidationError as exc:
        error = exc.errors()[0]
        key = ".".join(str(p) for p in error["loc"]) or "(top level)"
        message = error["msg"]
        if error["type"] == "extra_forbidden":
            allowed = ", ".join(_model_at(error["loc"][:-1]).model_fields)
            message = f"unknown key; allowed: {allowed}"
        raise ConfigError(f"{origin}: {key}: {message}") from None
    check_budget(scenario, origin)
    return scenario


def _model_at(loc: tuple[int | str, ...]) -> type[BaseModel]:
    """The model class that validates the table at `loc` of a scenario."""
    model: type[BaseModel] = Scenario
    for part in loc:
        if isinstance(part, int):
            continue
        annotation = model.model_fields[part].annotation
        inner = [annotation, *get_args(annotation)]
        model = next((t for t in inner if isinstance(t, type) and issubclass(t, BaseModel)), model)
    return model
