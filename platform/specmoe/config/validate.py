# SPDX-License-Identifier: Apache-2.0
"""Convert plain recipe data into typed dataclasses, collecting every problem instead of stopping."""

from __future__ import annotations

import dataclasses
import difflib
import enum
import types
import typing
from typing import Any, Callable, Literal, Union

from specmoe.config.errors import Problem
from specmoe.config.schema import Component, RunConfig, StageSpec

__all__ = ["Validator", "to_plain"]

_MISSING = object()


def _type_name(tp: Any) -> str:
    if isinstance(tp, type):
        return tp.__name__
    return str(tp).replace("typing.", "")


def _describe(value: Any) -> str:
    text = repr(value)
    return f"{type(value).__name__} {text if len(text) < 40 else text[:37] + '...'}"


def to_plain(obj: Any) -> Any:
    """Dataclasses / Components -> plain dicts and lists (for YAML dumps and hashing)."""
    if isinstance(obj, enum.Enum):
        return obj.value
    if isinstance(obj, Component):
        return {"name": obj.name, **{k: to_plain(v) for k, v in obj.options.items()}}
    if isinstance(obj, StageSpec):
        return {"id": obj.id, **to_plain(obj.component)}
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: to_plain(getattr(obj, f.name)) for f in dataclasses.fields(obj)
                if not f.metadata.get("internal")}
    if isinstance(obj, dict):
        return {k: to_plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_plain(v) for v in obj]
    return obj


def _nested_config(obj: Any) -> bool:
    """A dataclass instance holding options (not a component reference)."""
    return dataclasses.is_dataclass(obj) and not isinstance(obj, (type, Component, StageSpec))


class Validator:
    """Walks a plain value against a type, appending :class:`Problem` s to ``problems``. ``origin_of``: dotted key
    -> file that set it; ``check_plugins``: resolve component names against the registries (imports plugins)."""

    def __init__(self, problems: list[Problem], origin_of: Callable[[str], str], check_plugins: bool = True):
        self.problems = problems
        self.origin_of = origin_of
        self.check_plugins = check_plugins

    def error(self, key: str, message: str) -> None:
        self.problems.append(Problem(self.origin_of(key), key, message))

    @staticmethod
    def _join(path: str, key: Any) -> str:
        return f"{path}.{key}" if path else str(key)

    def convert(self, value: Any, tp: Any, path: str, kind: str | None = None) -> Any:
        origin = typing.get_origin(tp)
        args = typing.get_args(tp)
        if tp is Any or tp is object:
            return value
        if origin in (Union, types.UnionType):
            if value is None and type(None) in args:
                return None
            rest = [a for a in args if a is not type(None)]
            if len(rest) == 1:
                return self.convert(value, rest[0], path, kind)
            for a in rest:  # first type that accepts the value silently
                trial: list[Problem] = []
                v = Validator(trial, self.origin_of, self.check_plugins).convert(value, a, path, kind)
                if not trial:
                    return v
            self.error(path, f"expected {_type_name(tp)}, got {_describe(value)}")
            return value
        if tp is Component:
            return self.component(value, kind or "", path)
        if tp is StageSpec:
            return self.stage(value, path)
        if origin is Literal:
            if value not in args:
                self.error(path, f"must be one of {', '.join(map(repr, args))}, got {value!r}")
            return value
        if origin in (list, typing.List):
            if not isinstance(value, list):
                self.error(path, f"expected a list, got {_describe(value)}")
                return []
            item_tp = args[0] if args else Any
            return [self.convert(v, item_tp, self._join(path, i), kind) for i, v in enumerate(value)]
        if origin in (dict, typing.Dict):
            if not isinstance(value, dict):
                self.error(path, f"expected a mapping, got {_describe(value)}")
                return {}
            val_tp = args[1] if len(args) == 2 else Any
            return {k: self.convert(v, val_tp, self._join(path, k), kind) for k, v in value.items()}
        if dataclasses.is_dataclass(tp):
            return self.dataclass(value, tp, path)
        if isinstance(tp, type) and issubclass(tp, enum.Enum):
            return self.enum(value, tp, path)
        return self.scalar(value, tp, path)

    def enum(self, value: Any, tp: type[enum.Enum], path: str) -> Any:
        """An :class:`enum.Enum` option, given as a member, a value or a member name (aliases included)."""
        try:
            return tp(value)
        except (ValueError, TypeError):
            pass
        if isinstance(value, str) and value in tp.__members__:
            return tp.__members__[value]
        values = [str(m.value) for m in tp]
        aliases = [n for n in tp.__members__ if n not in values]
        also = f" (or {', '.join(aliases)})" if aliases else ""
        self.error(path, f"must be one of {', '.join(values)}{also}, got {_describe(value)}")
        return value

    def scalar(self, value: Any, tp: Any, path: str) -> Any:
        if tp is bool:
            ok = isinstance(value, bool)
        elif tp is int:
            ok = isinstance(value, int) and not isinstance(value, bool)
        elif tp is float:
            ok = isinstance(value, (int, float)) and not isinstance(value, bool)
            if ok:
                value = float(value)
        elif tp is str:
            ok = isinstance(value, str)
        else:
            ok = isinstance(value, tp) if isinstance(tp, type) else True
        if not ok:
            self.error(path, f"expected {_type_name(tp)}, got {_describe(value)}")
        return value

    def dataclass(self, value: Any, tp: type, path: str, defaults: Any = None) -> Any:
        """Convert a mapping to the dataclass ``tp``. Omitted keys come, not validated again, from ``defaults``
        (the field's default ``tp`` instance) or the dataclass defaults: ``trainer: {max_steps: 10}`` keeps every
        other option of the stage's own default."""
        if not isinstance(value, dict):
            self.error(path or "(top level)", f"expected a mapping for {tp.__name__}, got {_describe(value)}")
            return None
        hints = typing.get_type_hints(tp)
        flds = {f.name: f for f in dataclasses.fields(tp) if f.init}
        removed = getattr(tp, "removed_keys", {})
        for k in value:
            if k in removed:
                self.error(self._join(path, k), f"this key was removed: {removed[k]}")
            elif k not in flds:
                close = difflib.get_close_matches(str(k), list(flds), n=1, cutoff=0.6)
                hint = f" Did you mean '{close[0]}'?" if close else ""
                valid = ", ".join(n for n, f in flds.items() if not f.metadata.get("internal"))
                self.error(self._join(path, k), f"unknown key.{hint} Valid keys here: {valid}")
            elif flds[k].metadata.get("internal"):
                self.error(self._join(path, k), "is set by platform (from the command line), not by a recipe: "
                                                "remove it")
        kwargs = {}
        for name, f in flds.items():
            key = self._join(path, name)
            if name in value:
                sub = value[name]
                if isinstance(sub, dict) and "name" not in sub and f.metadata.get("name_default"):
                    sub = {"name": f.metadata["name_default"], **sub}
                base = getattr(defaults, name) if defaults is not None else (
                    f.default_factory() if f.default_factory is not dataclasses.MISSING else None)
                if isinstance(sub, dict) and _nested_config(base):
                    kwargs[name] = self.dataclass(sub, type(base), key, defaults=base)
                else:
                    kwargs[name] = self.convert(sub, hints[name], key, f.metadata.get("kind"))
            elif defaults is not None:
                kwargs[name] = getattr(defaults, name)
            elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                self.error(key, f"missing required key '{name}' ({_type_name(hints[name])})")
        try:
            return tp(**kwargs)
        except Exception:  # noqa: BLE001 - already reported
            return None

    def component(self, value: Any, kind: str, path: str) -> Component | None:
        from specmoe.registry import registry_for

        if isinstance(value, Component):
            return value
        if isinstance(value, str):
            name, kwargs = value, {}
        elif isinstance(value, dict):
            if "name" not in value:
                self.error(path, f"a {kind} needs 'name': a registry key (see 'platform ls {kind}') "
                                 f"or 'package.module:Class'")
                return None
            kwargs = {k: v for k, v in value.items() if k != "name"}
            name = value["name"]
            if not isinstance(name, str):
                self.error(self._join(path, "name"), f"expected a {kind} name (str), got {_describe(name)}")
                return None
        else:
            self.error(path, f"expected a {kind} name or {{name: ..., <options>}}, got {_describe(value)}")
            return None
        if not self.check_plugins:
            return Component(name, kwargs, kind)
        reg = registry_for(kind)
        try:
            cls = reg.get(name)
        except KeyError as exc:
            self.error(self._join(path, "name") if isinstance(value, dict) else path, str(exc))
            return None
        except Exception as exc:  # noqa: BLE001 - import errors of plugin code
            self.error(path, f"cannot load {kind} '{name}': {exc}")
            return None
        config_cls = getattr(cls, "Config", None)
        if config_cls is None or not dataclasses.is_dataclass(config_cls):
            self.error(path, f"{kind} '{name}' has no Config dataclass")
            return None
        cfg = self.dataclass(kwargs, config_cls, path)
        options = {f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg)} if cfg is not None else kwargs
        return Component(name, options, kind)

    def stage(self, value: Any, path: str) -> StageSpec | None:
        if not isinstance(value, dict):
            self.error(path, f"a stage is {{id: ..., name: <stage>, <options>}}, got {_describe(value)}")
            return None
        sid = value.get("id")
        if not isinstance(sid, str) or not sid:
            self.error(self._join(path, "id"), "every stage needs an 'id' (str) that others refer to as "
                                               "'stage:<id>'")
            sid = ""
        comp = self.component({k: v for k, v in value.items() if k != "id"}, "stage", path)
        if comp is None:  # already reported; keep the id so references to it are not reported twice
            comp = Component(str(value.get("name", "")), {}, "stage")
        return StageSpec(sid, comp)

    def check_stage_refs(self, cfg: RunConfig | None) -> None:
        """Every ``"stage:<id>"`` string must name a stage of the recipe; ids must be unique."""
        if cfg is None:
            return
        ids: dict[str, int] = {}
        for i, st in enumerate(cfg.stages or []):
            if st is None:
                continue
            if st.id in ids:
                self.error(f"stages.{i}.id", f"duplicate stage id '{st.id}' (also stages.{ids[st.id]})")
            ids[st.id] = i

        def walk(node: Any, path: str) -> None:
            if isinstance(node, str) and node.startswith("stage:"):
                ref = node[len("stage:"):].partition("/")[0]
                if ref not in ids:
                    close = difflib.get_close_matches(ref, list(ids), n=1)
                    hint = f" Did you mean 'stage:{close[0]}'?" if close else ""
                    self.error(path, f"refers to unknown stage '{ref}'.{hint} Stages: {', '.join(ids) or '(none)'}")
            elif isinstance(node, dict):
                for k, v in node.items():
                    walk(v, self._join(path, k))
            elif isinstance(node, list):
                for i, v in enumerate(node):
                    walk(v, self._join(path, i))

        plain = to_plain(cfg)
        for key in ("stages", "target", "methods", "datasets"):
            walk(plain.get(key), key)

    def check_values(self, cfg: RunConfig | None) -> None:
        """Ranges the types do not say."""
        ev = getattr(cfg, "eval", None)
        if ev is None:
            return
        for key, low, what in (("repeats", 1, "timed generations per prompt batch"),
                               ("warmup", 0, "untimed warm-up generations"),
                               ("max_prompts", 1, "prompts per group at most")):
            value = getattr(ev, key, None)
            if isinstance(value, int) and value < low:
                self.error(f"eval.{key}", f"must be >= {low} ({what}), got {value}")
        margin = getattr(ev, "prompts_for_margin", None)
        if margin is not None and not (isinstance(margin, (int, float)) and 0 < margin < 1):
            self.error("eval.prompts_for_margin", f"must be a relative margin in (0, 1), e.g. 0.02, or null; got "
                                                  f"{margin}")
