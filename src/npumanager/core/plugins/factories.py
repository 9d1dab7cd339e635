"""A plugin factory's options, read from its signature, so a bad one is refused before
anything is built, naming the options the factory takes and their types.

For a class, its ``__init__``; where that passes ``**options`` on to a base that takes
keyword options, the base's too (``OnnxRuntimeDriver`` hands them to ``Channels``). A
factory that wraps another (``functools.wraps``, or `LazyFactory`) is read through
``__wrapped__``. Where the options cannot be known (``**options`` kept by the class
itself), nothing is checked before the call. A leaf: it imports only the errors (and
pydantic), so a driver's registration may use `LazyFactory`.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable, Collection, Mapping
from typing import Any

from pydantic import ValidationError

from npumanager.errors import IllegalArgumentError

SERVICE_OPTIONS = frozenset({"clock"})
"""Keyword arguments the service gives a driver's factory itself, never a user's option
(the devices are the factory's first positional parameter)."""

_SIMPLE_TYPES: dict[str, tuple[type, ...]] = {
    "int": (int,),
    "bool": (bool,),
    "str": (str,),
    "float": (int, float),
}
_ARTICLES = {"int": "an int", "bool": "a bool (true or false)", "str": "text", "float": "a number"}


class LazyFactory:
    """A factory that imports its target on first use, so registering it stays cheap: it
    calls ``module.attribute`` and reads as it (``__wrapped__``) for option checks."""

    def __init__(self, module: str, attribute: str) -> None:
        self._where = (module, attribute)

    @property
    def __wrapped__(self) -> Callable[..., Any]:
        module, attribute = self._where
        target: Callable[..., Any] = getattr(importlib.import_module(module), attribute)
        return target

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Build with the target."""
        return self.__wrapped__(*args, **kwargs)

    def __repr__(self) -> str:
        return f"LazyFactory({'.'.join(self._where)})"


def _keywords(signature: inspect.Signature, skip_first: bool) -> tuple[dict[str, str], bool]:
    """The keyword parameters of one signature (name -> annotation text), and whether it
    takes ``**options`` too."""
    found: dict[str, str] = {}
    more = False
    positional = skip_first
    for parameter in signature.parameters.values():
        if parameter.kind is parameter.VAR_KEYWORD:
            more = True
        elif parameter.kind is parameter.POSITIONAL_OR_KEYWORD and positional:
            positional = False  # the devices, or what a subclass passes in their place
        elif parameter.kind in (parameter.POSITIONAL_OR_KEYWORD, parameter.KEYWORD_ONLY):
            found[parameter.name] = _annotation(parameter.annotation)
        elif parameter.kind is parameter.POSITIONAL_ONLY:
            positional = False
    return found, more


def _annotation(annotation: Any) -> str:
    if annotation is inspect.Parameter.empty:
        return "any"
    if isinstance(annotation, str):
        return annotation
    return inspect.formatannotation(annotation)


def factory_options(factory: Callable[..., Any]) -> dict[str, str] | None:
    """The keyword options `factory` takes after its first positional parameter (name ->
    type), or None when they cannot be known."""
    try:
        target = inspect.unwrap(factory)
    except (ImportError, ValueError):
        return None
    if not inspect.isclass(target):
        try:
            options, more = _keywords(inspect.signature(target), skip_first=True)
        except (TypeError, ValueError):
            return None
        return None if more else options
    options = {}
    levels = [cls for cls in target.__mro__ if "__init__" in vars(cls) and cls is not object]
    for depth, cls in enumerate(levels):
        try:
            signature = inspect.signature(vars(cls)["__init__"])
        except (TypeError, ValueError):
            return None
        unbound = list(signature.parameters.values())[1:]  # self
        own, more = _keywords(signature.replace(parameters=unbound), skip_first=True)
        if depth and not own and not more:
            return None  # the subclass keeps its **options: what it takes is its own affair
        options.update({k: v for k, v in own.items() if k not in options})
        if not more:
            return options
    return None


def _accepts(annotation: str, value: Any) -> bool:
    """False only when a simple annotation ("int", "str | None", ...) rules `value` out."""
    parts = [part.strip() for part in annotation.split("|")]
    if not all(part in _SIMPLE_TYPES or part == "None" for part in parts):
        return True
    if value is None:
        return "None" in parts
    for part in parts:
        if part == "None":
            continue
        if isinstance(value, bool) and part != "bool":
            continue
        if isinstance(value, _SIMPLE_TYPES[part]):
            return True
    return False


def describe_options(options: Mapping[str, str], hidden: Collection[str] = ()) -> str:
    """``name (type), ...`` of the options a user may give, or "none"."""
    shown = [f"{name} ({kind})" for name, kind in options.items() if name not in hidden]
    return ", ".join(shown) or "none"


def check_factory_options(
    what: str, factory: Callable[..., Any], options: Mapping[str, Any]
) -> None:
    """An `IllegalArgumentError` of one line for an option `factory` does not take, one
    the service gives itself, or a value of the wrong type; `what` names the plugin
    ("driver 'vnpu'")."""
    known = factory_options(factory)
    if known is None:
        return
    allowed = describe_options(known, SERVICE_OPTIONS)
    for key, value in options.items():
        if key in SERVICE_OPTIONS:
            raise IllegalArgumentError(
                f"{key!r} is not an option of {what}: the service sets it itself; "
                f"its options: {allowed}"
            )
        if key not in known:
            raise IllegalArgumentError(f"{what} has no option {key!r}; its options: {allowed}")
        if not _accepts(known[key], value):
            wanted = " or ".join(
                _ARTICLES.get(part.strip(), part.strip()) for part in known[key].split("|")
            )
            raise IllegalArgumentError(f"{what}: option {key} takes {wanted}; got {value!r}")


def build_with_options(
    what: str,
    factory: Callable[..., Any],
    args: tuple[Any, ...],
    options: Mapping[str, Any],
    service_given: Mapping[str, Any] | None = None,
) -> Any:
    """``factory(*args, **options, **service_given)`` with the user's `options` checked
    first; a factory's refusal of them (an unexpected keyword, a pydantic model's
    validation) becomes an `IllegalArgumentError` of one line naming `what`."""
    check_factory_options(what, factory, options)
    given = ", ".join(f"{key}={value!r}" for key, value in options.items()) or "none"
    try:
        return factory(*args, **options, **(service_given or {}))
    except TypeError as exc:
        if "keyword argument" not in str(exc):
            raise
        raise IllegalArgumentError(f"{what} refused its options ({given}): {exc}") from None
    except ValidationError as exc:
        error = exc.errors()[0]
        key = ".".join(str(part) for part in error["loc"]) or "value"
        raise IllegalArgumentError(
            f"{what} refused its options ({given}): {key}: {error['msg']}; got {error['input']!r}"
        ) from None
