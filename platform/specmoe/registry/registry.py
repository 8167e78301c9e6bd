# SPDX-License-Identifier: Apache-2.0
"""A generic, lazy plugin registry: one instance per component kind.

Plugins come from ``@reg.register("name")``, ``reg.register("name", target="pkg.mod:Class")`` or entry points of
``specmoe.<kind>s`` (built-ins too), imported only by :meth:`Registry.get`; a recipe may also name ``"pkg.mod:Class"``.
Defaults come from ``specmoe.defaults`` (:meth:`Registry.default`); the core names no plugin."""

from __future__ import annotations

import difflib
import importlib
import importlib.metadata
import inspect
import logging
import threading
from dataclasses import dataclass
from typing import Any, Callable, Generic, Optional, TypeVar

__all__ = ["Registry", "ModuleRegistry", "RegistryError", "UnknownPluginError", "DuplicatePluginError",
           "normalize_name", "import_object", "module_distribution", "DEFAULTS_GROUP"]

logger = logging.getLogger(__name__)
T = TypeVar("T")

#: entry-point group of the default plugins: ``<kind>[.<role>] = "<the default plugin's entry-point value>"``
DEFAULTS_GROUP = "specmoe.defaults"


class RegistryError(Exception):
    """Base class of registry errors."""


class UnknownPluginError(RegistryError, KeyError):
    """A name that no registered plugin has."""

    def __str__(self) -> str:  # KeyError quotes its message otherwise
        return str(self.args[0]) if self.args else ""


class DuplicatePluginError(RegistryError):
    """Two different plugins under one name."""


def normalize_name(name: str) -> str:
    """Registry keys are lowercase snake_case; ``-`` and spaces become ``_``."""
    return name.strip().lower().replace("-", "_").replace(" ", "_")


def import_object(path: str) -> Any:
    """Import ``"pkg.mod:Attr"`` (or ``"pkg.mod.Attr"``) and return the attribute."""
    if ":" in path:
        mod_name, _, attr = path.partition(":")
    else:
        mod_name, _, attr = path.rpartition(".")
    if not mod_name or not attr:
        raise RegistryError(f"'{path}' is not an import path of the form 'package.module:Class'")
    try:
        module = importlib.import_module(mod_name)
    except ImportError as exc:
        raise RegistryError(f"cannot import module '{mod_name}' for '{path}': {exc}") from exc
    obj: Any = module
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError as exc:
            raise RegistryError(f"module '{mod_name}' has no attribute '{attr}' (from '{path}')") from exc
    return obj


def module_distribution(module: str) -> Optional[tuple[str, str]]:
    """``(distribution, version)`` of the installed distribution holding ``module``'s top-level package."""
    top = module.split(".")[0]
    try:
        dists = importlib.metadata.packages_distributions().get(top, [])
        if dists:
            return dists[0], importlib.metadata.version(dists[0])
    except Exception:  # noqa: BLE001 - broken metadata of an unrelated distribution
        logger.debug("no distribution found for module %s", module)
    return None


@dataclass
class _Entry:
    name: str
    target: Any  # a class, or an import string "pkg.mod:Class"
    origin: str  # human readable: where the registration came from
    dist: Optional[tuple[str, str]] = None  # (distribution, version) of an entry point

    @property
    def target_str(self) -> str:
        if isinstance(self.target, str):
            return self.target
        return f"{self.target.__module__}:{self.target.__qualname__}"


class Registry(Generic[T]):
    """Registry of one ``kind`` (singular, e.g. ``"selector"``) whose plugins subclass ``base`` (a class or a lazy
    ``"mod:Class"``), discovered from the entry-point ``group`` (default ``"specmoe.<kind>s"``)."""

    def __init__(self, kind: str, base: type | str, group: str | None = None) -> None:
        self.kind = kind
        self._base = base
        self.group = group or f"specmoe.{kind}s"
        self._entries: dict[str, _Entry] = {}
        self._conflicts: dict[str, list[_Entry]] = {}
        self._loaded: dict[str, type] = {}
        self._discovered = False
        self._lock = threading.RLock()

    def register(self, name: str, target: type | str | None = None, *, origin: str | None = None,
                 override: bool = False) -> Callable[[type], type] | None:
        """Register ``target`` under ``name``; without ``target`` this is a class decorator."""
        key = normalize_name(name)
        if target is None:
            def decorator(cls: type) -> type:
                where = origin or f"decorator in {cls.__module__}"
                self._add(_Entry(key, cls, where), override)
                return cls
            return decorator
        if origin is None:
            origin = "register() call" if isinstance(target, str) else f"register() in {target.__module__}"
        self._add(_Entry(key, target, origin), override)
        return None

    def _add(self, entry: _Entry, override: bool) -> None:
        with self._lock:
            self._discover()
            old = self._entries.get(entry.name)
            if old is not None and not override:
                if old.target_str == entry.target_str:
                    return  # the same plugin registered again (e.g. re-import in a worker): harmless
                raise DuplicatePluginError(
                    f"{self.kind} '{entry.name}' is registered twice: {old.target_str} (from {old.origin}) "
                    f"and {entry.target_str} (from {entry.origin}). Rename one, or pass override=True.")
            self._entries[entry.name] = entry
            self._loaded.pop(entry.name, None)

    def unregister(self, name: str) -> None:
        with self._lock:
            key = normalize_name(name)
            self._entries.pop(key, None)
            self._loaded.pop(key, None)

    def _discover(self) -> None:
        """Read :attr:`group`'s entry points; a name declared for different classes is unusable (warned once)."""
        if self._discovered:
            return
        self._discovered = True
        for ep in importlib.metadata.entry_points(group=self.group):
            dist = getattr(ep, "dist", None)
            version = getattr(dist, "version", None) if dist is not None else None
            where = f"entry point '{self.group}' of distribution '{dist.name if dist else '?'}'"
            entry = _Entry(normalize_name(ep.name), ep.value, where,
                           (dist.name, str(version)) if dist is not None else None)
            old = self._entries.get(entry.name)
            if old is not None and old.target_str != entry.target_str:
                self._conflicts.setdefault(entry.name, [old]).append(entry)
                continue
            self._entries[entry.name] = entry
        for name in self._conflicts:
            logger.warning("%s", self.conflict_message(name))

    def conflict_message(self, name: str) -> str:
        """Why ``name`` cannot be used: the distributions that all declare it."""
        both = " and ".join(f"{e.target_str} ({e.origin})" for e in self._conflicts[name])
        return (f"{self.kind} '{name}' is declared by more than one installed package: {both}. It cannot be used "
                f"by that name until one is uninstalled or renamed; name the class you mean directly, e.g. "
                f"'{self._conflicts[name][-1].target_str}'. Every other {self.kind} works as usual.")

    def conflicts(self) -> list[str]:
        """Names declared by several distributions (unusable by name)."""
        with self._lock:
            self._discover()
            return sorted(self._conflicts)

    def _snapshot(self) -> tuple:
        """What :meth:`_restore` puts back (tests only: keeps import-time registrations across a test)."""
        with self._lock:
            return dict(self._entries), {k: list(v) for k, v in self._conflicts.items()}, dict(self._loaded), \
                self._discovered

    def _restore(self, snap: tuple) -> None:
        with self._lock:
            entries, conflicts, loaded, self._discovered = snap
            self._entries.clear()
            self._entries.update(entries)
            self._conflicts.clear()
            self._conflicts.update(conflicts)
            self._loaded.clear()
            self._loaded.update(loaded)

    def _clear(self) -> None:
        """Forget everything (tests only)."""
        with self._lock:
            self._entries.clear()
            self._conflicts.clear()
            self._loaded.clear()
            self._discovered = False

    @property
    def base(self) -> type:
        if isinstance(self._base, str):
            self._base = import_object(self._base)
        return self._base  # type: ignore[return-value]

    def names(self) -> list[str]:
        with self._lock:
            self._discover()
            return sorted(self._entries)

    def __contains__(self, name: str) -> bool:
        return normalize_name(name) in self.names() or ":" in name

    def origin(self, name: str) -> str:
        entry = self._entry(name)
        return f"{entry.target_str} ({entry.origin})"

    def entries(self) -> list[tuple[str, str, str]]:
        """``(name, target, origin)`` per plugin, sorted by name (a conflicting name: each declaration)."""
        rows = []
        for n in self.names():
            for e in self._conflicts.get(n, [self._entries[n]]):
                rows.append((n, e.target_str, e.origin + (" [CONFLICT: unusable by name]" if n in self._conflicts
                                                          else "")))
        return rows

    def distribution(self, name: str) -> Optional[tuple[str, str]]:
        """``(distribution, version)`` of plugin ``name``'s entry point or module; ``None`` for ``imports:`` files."""
        key = normalize_name(name)
        with self._lock:
            self._discover()
            entry = self._entries.get(key)
        if entry is not None and entry.dist is not None:
            return entry.dist
        target = entry.target_str if entry is not None else name
        module = target.partition(":")[0] if ":" in target else target.rpartition(".")[0]
        return module_distribution(module)

    def _entry(self, name: str) -> _Entry:
        with self._lock:
            self._discover()
            key = normalize_name(name)
            if key in self._conflicts:
                raise DuplicatePluginError(self.conflict_message(key))
            if key in self._entries:
                return self._entries[key]
            raise UnknownPluginError(self.unknown_message(name))

    def unknown_message(self, name: str) -> str:
        avail = self.names()
        close = difflib.get_close_matches(normalize_name(name), avail, n=1, cutoff=0.5)
        hint = f" Did you mean '{close[0]}'?" if close else ""
        return (f"unknown {self.kind} '{name}'.{hint} Available: {', '.join(avail) or '(none)'}. "
                f"A class can also be named as 'package.module:Class'.")

    def default(self, role: str = "") -> str:
        """Name of the plugin whose ``"pkg.mod:Class"`` the entry point ``<kind>[.<role>]`` of :data:`DEFAULTS_GROUP`
        declares. Raises :class:`RegistryError` when none, several or an unregistered one are declared."""
        key = f"{self.kind}.{role}" if role else self.kind
        values = sorted({ep.value for ep in importlib.metadata.entry_points(group=DEFAULTS_GROUP) if ep.name == key})
        what = f"default {self.kind}" + (f" ({role})" if role else "")
        if not values:
            raise RegistryError(f"no {what} is declared (an entry point '{key}' in the group '{DEFAULTS_GROUP}'); "
                                f"name one: {', '.join(self.names()) or '(none registered)'}")
        if len(values) > 1:
            raise RegistryError(f"the {what} is declared more than once ({', '.join(values)}, entry point '{key}' "
                                f"of '{DEFAULTS_GROUP}'); name one: {', '.join(self.names())}")
        found = [name for name, target, _ in self.entries() if target == values[0]]
        if not found:
            raise RegistryError(f"the {what} is declared as '{values[0]}', which no registered {self.kind} is; "
                                f"registered: {', '.join(self.names()) or '(none)'}")
        return found[0]

    def defaults(self) -> dict[str, str]:
        """``{role: name}`` (``""``: the plain default) of the valid defaults of this kind, without errors."""
        out: dict[str, str] = {}
        for ep in importlib.metadata.entry_points(group=DEFAULTS_GROUP):
            kind, _, role = ep.name.partition(".")
            if kind == self.kind:
                try:
                    out[role] = self.default(role)
                except RegistryError:
                    continue
        return out

    def get(self, name: str) -> type[T]:
        """Return the plugin class for ``name`` (a registry key or ``"pkg.mod:Class"``), importing it now."""
        if ":" in name and normalize_name(name) not in self._entries:
            cls = import_object(name)
            self._check(name, cls)
            return cls
        entry = self._entry(name)
        with self._lock:
            if entry.name in self._loaded:
                return self._loaded[entry.name]
            cls = import_object(entry.target) if isinstance(entry.target, str) else entry.target
            self._check(entry.name, cls, entry.origin)
            self._loaded[entry.name] = cls
            return cls

    def _check(self, name: str, cls: Any, origin: str = "recipe") -> None:
        base = self.base
        if not (inspect.isclass(cls) and issubclass(cls, base)):
            raise RegistryError(
                f"{self.kind} '{name}' ({origin}) is {cls!r}, which does not subclass "
                f"{base.__module__}.{base.__qualname__}: implement that interface.")


class ModuleRegistry(Registry):
    """Registry whose plugins are *modules* (``"pkg.mod"``, e.g. benchmarks) defining every callable in ``required``."""

    def __init__(self, kind: str, group: str, required: tuple[str, ...]) -> None:
        super().__init__(kind, base=object, group=group)
        self.required = required

    def get(self, name: str) -> Any:  # type: ignore[override]
        """The module registered as ``name``, imported now."""
        entry = self._entry(name)
        with self._lock:
            if entry.name in self._loaded:
                return self._loaded[entry.name]
        target = entry.target
        if isinstance(target, str):
            if ":" in target:  # "pkg.mod:attr" names an attribute; a bench is the module itself
                target = import_object(target)
            else:
                try:
                    target = importlib.import_module(target)
                except ImportError as exc:
                    raise RegistryError(f"cannot import {self.kind} module '{target}' ({entry.origin}): "
                                        f"{exc}") from exc
        missing = [attr for attr in self.required if not callable(getattr(target, attr, None))]
        if missing:
            raise RegistryError(f"{self.kind} '{entry.name}' ({entry.origin}) is {target!r}, which does not define "
                                f"{', '.join(missing)}: a {self.kind} module defines {', '.join(self.required)}.")
        with self._lock:
            self._loaded[entry.name] = target
        return target

    def _check(self, name: str, cls: Any, origin: str = "recipe") -> None:  # modules are checked in get()
        return None
