"""Sections of settings: frozen, closed groups of keys, each declared with its type, bounds and
description, checked when a section is made, every error named by its path (`compaction.mask.batch`).

Written for config.py in place of pydantic and pydantic-settings, which cost every proxy process
~13 MB resident (their modules and each model's compiled validators) to read a few dozen keys once
at start-up. It knows the types config.py uses and no more: str, int, float, bool, Literal, Path,
Secret, `X | None`, tuple[X, ...], dict[str, X], Any and nested sections. Values are coerced as
they come from YAML and the environment ("8080" is a valid port, "yes" a valid bool); messages
follow pydantic's, which the earlier settings printed.

A section declares its keys as annotated class attributes, `name: type = Field(default, ...)` (or a
plain default); names starting with `_` are private state (`Private(factory)`), never read from
input. Two hooks: `_prepare(data)` rewrites the raw input first (old names, YAML quirks), `_check()`
checks the keys together once every one is valid. `overrides_of(Section)` is the same section with
every key optional, for a profile's overrides: only the keys given are set and dumped.
"""

from __future__ import annotations

import json
import re
import types
import typing
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, ClassVar, Literal, Union

MISSING: Any = object()
NONE_TYPE = type(None)
TRUE_WORDS = frozenset({"1", "on", "t", "true", "y", "yes"})
FALSE_WORDS = frozenset({"0", "off", "f", "false", "n", "no"})

Loc = tuple[str | int, ...]


class SettingsError(ValueError):
    """One or more keys are wrong: `errors` holds each one's path and message."""

    def __init__(self, errors: list[tuple[Loc, str]]) -> None:
        self.errors = errors
        super().__init__(self.one_line())

    def one_line(self, prefix: str = "") -> str:
        parts = [f"{'.'.join(map(str, loc))}: {message}" if loc else message for loc, message in self.errors]
        return prefix + "; ".join(parts)


class Secret:
    """A secret string: shown as stars (repr, str, logs, dumps), read with `get_secret_value()`."""

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        self._value = value

    def get_secret_value(self) -> str:
        return self._value

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Secret) and other._value == self._value

    def __hash__(self) -> int:
        return hash(self._value)

    def __str__(self) -> str:
        return "**********" if self._value else ""

    def __repr__(self) -> str:
        return f"Secret('{self}')"


class Key:
    """One declared key: its default, description, bounds and own check."""

    __slots__ = (
        "annotation",
        "check",
        "default",
        "default_factory",
        "description",
        "ge",
        "gt",
        "le",
        "min_length",
        "name",
        "pattern",
    )

    def __init__(self, default: Any = MISSING, *, default_factory: Callable[[], Any] | None = None,
                 description: str | None = None, ge: float | None = None, gt: float | None = None,
                 le: float | None = None, min_length: int | None = None, pattern: str | None = None,
                 check: Callable[[Any], Any] | None = None) -> None:
        self.name, self.annotation = "", Any
        self.default, self.default_factory, self.description = default, default_factory, description
        self.ge, self.gt, self.le, self.min_length, self.pattern, self.check = ge, gt, le, min_length, pattern, check

    def copy(self, **changes: Any) -> Key:
        twin = Key.__new__(Key)
        for slot in Key.__slots__:
            setattr(twin, slot, changes.get(slot, getattr(self, slot)))
        return twin

    def default_value(self) -> Any:
        return self.default_factory() if self.default_factory is not None else self.default


def Field(default: Any = MISSING, **options: Any) -> Any:  # reads as the declaration it is
    """Declare a key: `Field(default, ge=..., le=..., description=..., check=...)`. `check` gets the
    coerced value and returns it, or raises ValueError with what is wrong."""
    return Key(default, **options)


class Private:
    """Private state of a section (a name starting with `_`): a fresh `factory()` per instance."""

    def __init__(self, factory: Callable[[], Any]) -> None:
        self.factory = factory


class Section:
    """A frozen, closed group of keys (see the module's docstring)."""

    model_fields: ClassVar[dict[str, Key]] = {}
    _privates: ClassVar[dict[str, Private]] = {}
    _partial: ClassVar[bool] = False  # an overrides section: every key optional, no `_check`
    model_fields_set: frozenset[str]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "model_fields" in cls.__dict__:  # made by overrides_of, keys given
            return
        hints = typing.get_type_hints(cls)
        keys, privates = {}, dict(cls._privates)
        for name, hint in hints.items():
            if typing.get_origin(hint) is ClassVar or name in ("model_fields_set",):
                continue
            declared = cls.__dict__.get(name, MISSING)
            if name.startswith("_"):
                if isinstance(declared, Private):
                    privates[name] = declared
                continue
            key = declared.copy() if isinstance(declared, Key) else Key(declared)
            key.name, key.annotation = name, hint
            keys[name] = key
            if declared is not MISSING:
                delattr(cls, name)  # instances hold every key: the class keeps only its declaration
        cls.model_fields, cls._privates = {**_inherited(cls), **keys}, privates

    def __init__(self, **data: Any) -> None:
        errors: list[tuple[Loc, str]] = []
        self._load(data, (), errors)
        if errors:
            raise SettingsError(errors)

    @classmethod
    def model_validate(cls, data: Any) -> Any:
        """`data` (a mapping of keys, or already a `cls`) as a `cls`; SettingsError if wrong."""
        errors: list[tuple[Loc, str]] = []
        section = _section(cls, data, (), errors)
        if errors:
            raise SettingsError(errors)
        return section

    @classmethod
    def _prepare(cls, data: dict[str, Any]) -> dict[str, Any]:
        """Rewrite the raw input before its keys are read (ValueError: the section is wrong). Keys
        starting with `_` it adds set private state."""
        return data

    def _check(self) -> None:
        """Check the keys together (ValueError names what is wrong)."""

    def _load(self, data: Mapping[str, Any], loc: Loc, errors: list[tuple[Loc, str]]) -> None:
        cls, before = type(self), len(errors)
        for name, private in cls._privates.items():
            object.__setattr__(self, name, private.factory())
        try:
            data = cls._prepare(dict(data))
        except ValueError as exc:
            errors.append((loc, str(exc)))
            data = {}
        given = []
        for name, value in data.items():
            if name.startswith("_") and name in cls._privates:
                object.__setattr__(self, name, value)
            elif name not in cls.model_fields:
                errors.append(((*loc, name), "Extra inputs are not permitted"))
        for name, key in cls.model_fields.items():
            if name in data:
                value = _coerce(key.annotation, data[name], (*loc, name), errors, key)
                given.append(name)
            elif cls._partial:
                value = key.annotation() if _is_section(key.annotation) else None
            else:
                value = key.default_value()
            object.__setattr__(self, name, value)
        object.__setattr__(self, "model_fields_set", frozenset(given))
        if len(errors) == before and not cls._partial:
            try:
                self._check()
            except ValueError as exc:
                errors.append((loc, str(exc)))

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"settings are frozen: cannot set {type(self).__name__}.{name}")

    def model_dump(self, *, exclude_unset: bool = False) -> dict[str, Any]:
        """The keys as a dict, nested sections as dicts (with `exclude_unset`, only the keys given)."""
        names = [n for n in self.model_fields if n in self.model_fields_set] if exclude_unset else self.model_fields
        out = {}
        for name in names:
            value = getattr(self, name)
            out[name] = value.model_dump(exclude_unset=exclude_unset) if isinstance(value, Section) else _dump(value)
        return out

    def model_dump_json(self) -> str:
        return json.dumps(self.model_dump(), default=str)

    def model_copy(self, *, update: Mapping[str, Any]) -> Any:
        """A copy with `update`'s keys replaced (not checked again, as pydantic's model_copy)."""
        twin = object.__new__(type(self))
        object.__setattr__(twin, "__dict__", {**self.__dict__, **update})
        object.__setattr__(twin, "model_fields_set", self.model_fields_set | frozenset(update))
        return twin

    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        return all(getattr(self, name) == getattr(other, name) for name in self.model_fields)

    def __hash__(self) -> int:
        return hash((type(self), *(_hashable(getattr(self, name)) for name in self.model_fields)))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(f'{n}={getattr(self, n)!r}' for n in self.model_fields)})"


def overrides_of(section: type[Section]) -> type[Section]:
    """`section` with every key optional: a profile's overrides of it. Each key given is checked as
    the section checks it (type, bounds, its own check, `_prepare`); `_check`, across keys, runs on
    the merged profile, since a key may be valid only with the defaults it is merged over.
    `model_dump(exclude_unset=True)` is what the profile sets."""
    keys = {}
    for name, key in section.model_fields.items():
        annotation = overrides_of(key.annotation) if _is_section(key.annotation) else key.annotation
        keys[name] = key.copy(annotation=annotation, default=None, default_factory=None)
    namespace = {
        "model_fields": keys, "_privates": section._privates, "_partial": True,
        "_prepare": section.__dict__.get("_prepare", Section.__dict__["_prepare"]),
        "__module__": section.__module__, "__doc__": f"Overrides of {section.__name__}: only the keys given.",
    }
    return type(section.__name__.removesuffix("Settings") + "Overrides", (Section,), namespace)


def _inherited(cls: type) -> dict[str, Key]:
    keys: dict[str, Key] = {}
    for base in reversed(cls.__mro__[1:]):
        keys.update(base.__dict__.get("model_fields", {}))
    return keys


def _is_section(annotation: Any) -> bool:
    return isinstance(annotation, type) and issubclass(annotation, Section)


def _section(cls: type[Section], value: Any, loc: Loc, errors: list[tuple[Loc, str]]) -> Any:
    if isinstance(value, cls):
        return value
    if not isinstance(value, Mapping):
        errors.append((loc, f"Input should be a valid dictionary or instance of {cls.__name__}"))
        return None
    section = object.__new__(cls)
    section._load(value, loc, errors)
    return section


def _coerce(annotation: Any, value: Any, loc: Loc, errors: list[tuple[Loc, str]], key: Key | None = None) -> Any:
    """`value` as `annotation`, its bounds and check applied; on error, one appended and None."""
    before = len(errors)
    value = _typed(annotation, value, loc, errors)
    if len(errors) > before or key is None:
        return value
    if value is not None:
        problem = _out_of_bounds(key, value)
        if problem:
            errors.append((loc, problem))
            return None
    if key.check is not None:
        try:
            value = key.check(value)
        except ValueError as exc:
            errors.append((loc, str(exc)))
    return value


def _typed(annotation: Any, value: Any, loc: Loc, errors: list[tuple[Loc, str]]) -> Any:
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if annotation is Any:
        return value
    if origin in (Union, types.UnionType):
        if value is None and NONE_TYPE in args:
            return None
        (inner,) = [arg for arg in args if arg is not NONE_TYPE]
        return _typed(inner, value, loc, errors)
    if origin is Literal:
        if any(value == arg and type(value) is type(arg) for arg in args):
            return value
        return _wrong(errors, loc, f"Input should be {_choices(args)}")
    if _is_section(annotation):
        return _section(annotation, value, loc, errors)
    if annotation is str:
        return value if isinstance(value, str) else _wrong(errors, loc, "Input should be a valid string")
    if annotation is bool:
        return _bool(value, loc, errors)
    if annotation in (int, float):
        return _number(annotation, value, loc, errors)
    if annotation is Path:
        return Path(value) if isinstance(value, (str, Path)) else _wrong(errors, loc, "Input is not a valid path")
    if annotation is Secret:
        if isinstance(value, Secret):
            return value
        return Secret(value) if isinstance(value, str) else _wrong(errors, loc, "Input should be a valid string")
    if origin is tuple:
        if not isinstance(value, (list, tuple)):
            return _wrong(errors, loc, "Input should be a valid tuple")
        return tuple(_typed(args[0], item, (*loc, i), errors) for i, item in enumerate(value))
    if origin is dict:
        if not isinstance(value, Mapping):
            return _wrong(errors, loc, "Input should be a valid dictionary")
        return {
            _typed(args[0], name, (*loc, str(name)), errors): _typed(args[1], item, (*loc, str(name)), errors)
            for name, item in value.items()
        }
    raise TypeError(f"settings of type {annotation!r} are not supported")  # a declaration's mistake


def _bool(value: Any, loc: Loc, errors: list[tuple[Loc, str]]) -> Any:
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in TRUE_WORDS | FALSE_WORDS:
        return value.strip().lower() in TRUE_WORDS
    return _wrong(errors, loc, "Input should be a valid boolean, unable to interpret input")


def _number(kind: type, value: Any, loc: Loc, errors: list[tuple[Loc, str]]) -> Any:
    """`value` as an int or a float: a number (an int only when whole), or a string of one."""
    noun = "an integer" if kind is int else "a number"
    if isinstance(value, (int, float)) and not isinstance(value, bool) and (kind is float or float(value).is_integer()):
        return kind(value)
    if isinstance(value, str):
        try:
            return kind(value.strip())
        except ValueError:
            return _wrong(errors, loc, f"Input should be a valid {noun[noun.index(' ') + 1:]}, unable to parse string as {noun}")
    return _wrong(errors, loc, f"Input should be a valid {noun[noun.index(' ') + 1:]}")


def _out_of_bounds(key: Key, value: Any) -> str | None:
    if key.ge is not None and value < key.ge:
        return f"Input should be greater than or equal to {key.ge}"
    if key.gt is not None and value <= key.gt:
        return f"Input should be greater than {key.gt}"
    if key.le is not None and value > key.le:
        return f"Input should be less than or equal to {key.le}"
    if key.min_length is not None and len(value) < key.min_length:
        return f"String should have at least {key.min_length} character{'s' if key.min_length != 1 else ''}"
    if key.pattern is not None and not re.search(key.pattern, value):
        return f"String should match pattern '{key.pattern}'"
    return None


def _wrong(errors: list[tuple[Loc, str]], loc: Loc, message: str) -> None:
    errors.append((loc, message))


def _choices(options: Iterable[Any]) -> str:
    shown = [repr(option) for option in options]
    return shown[0] if len(shown) == 1 else f"{', '.join(shown[:-1])} or {shown[-1]}"


def _dump(value: Any) -> Any:
    if isinstance(value, dict):
        return {name: item.model_dump() if isinstance(item, Section) else _dump(item) for name, item in value.items()}
    return value


def _hashable(value: Any) -> Any:
    if isinstance(value, dict):
        return tuple(sorted((name, _hashable(item)) for name, item in value.items()))
    return value


# --- sources: YAML below the environment below the caller's own values ----------------------------------------


def env_values(model: type[Section], prefix: str, environ: Mapping[str, str]) -> dict[str, Any]:
    """The keys `environ` sets: `<PREFIX><SECTION>__<KEY>` (any case) as {section: {key: value}}.
    A name whose first part is no key of `model` is not ours and is left alone; a value that is a
    section, dict or tuple is JSON (`CONTEXT_PROXY_MODELS='{"m": {...}}'`). Raises SettingsError."""
    found: dict[str, Any] = {}
    for name, value in environ.items():
        if not name.lower().startswith(prefix.lower()):
            continue
        path = name[len(prefix):].lower().split("__")
        if path[0] not in model.model_fields:
            continue
        if _is_structured(_annotation_at(model, path)):
            try:
                value = json.loads(value)
            except ValueError:
                raise SettingsError([(tuple(path), f"{name} is not valid JSON")]) from None
        place = found
        for part in path[:-1]:
            if not isinstance(place.get(part), dict):
                place[part] = {}
            place = place[part]
        place[path[-1]] = value
    return found


def _annotation_at(model: type[Section], path: list[str]) -> Any:
    annotation: Any = model
    for part in path:
        annotation = _optional_inner(annotation)
        if _is_section(annotation):
            key = annotation.model_fields.get(part)
            if key is None:
                return Any
            annotation = key.annotation
        elif typing.get_origin(annotation) is dict:
            annotation = typing.get_args(annotation)[1]
        else:
            return Any
    return annotation


def _optional_inner(annotation: Any) -> Any:
    if typing.get_origin(annotation) in (Union, types.UnionType):
        inner = [arg for arg in typing.get_args(annotation) if arg is not NONE_TYPE]
        return inner[0] if len(inner) == 1 else annotation
    return annotation


def _is_structured(annotation: Any) -> bool:
    annotation = _optional_inner(annotation)
    return _is_section(annotation) or typing.get_origin(annotation) in (dict, tuple, list)


def deep_merge(*layers: Mapping[str, Any]) -> dict[str, Any]:
    """The layers merged, later ones winning, dicts merged key by key."""
    merged: dict[str, Any] = {}
    for layer in layers:
        for name, value in layer.items():
            if isinstance(value, Mapping) and isinstance(merged.get(name), Mapping):
                merged[name] = deep_merge(merged[name], value)
            else:
                merged[name] = value
    return merged


__all__ = [
    "Field", "Key", "Private", "Secret", "Section", "SettingsError", "deep_merge", "env_values", "overrides_of",
]
