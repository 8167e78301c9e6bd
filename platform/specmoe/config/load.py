# SPDX-License-Identifier: Apache-2.0
"""Load a recipe: YAML file (+ one ``base:`` chain), dotlist overrides, interpolation, typed validation.

Every problem is collected into one :class:`ConfigError`, each with the file that set the key and a hint.
Interpolation is OmegaConf's; the base merge and the overrides are plain dict code because ``OmegaConf.merge``
refuses a list over a mapping (and a later ``???`` keeps the base's value), ``from_dotlist`` cannot index or
append list items, expand a component shorthand or delete (``~key``) and parses values as OmegaConf, not YAML
(``1e-3``, ``on``), and both lose which file or override set each key.
"""

from __future__ import annotations

import copy
import importlib
import importlib.util
import re
import sys
from pathlib import Path
from typing import Any, Sequence

import yaml

from specmoe.config.errors import ConfigError, Problem
from specmoe.config.validate import Validator

__all__ = ["load_recipe", "load_layers", "apply_overrides", "resolve_interpolations", "RECIPES_DIR"]

#: recipes shipped with the repository (``recipes/`` beside ``platform/``)
RECIPES_DIR = Path(__file__).resolve().parents[3] / "recipes"


class _Origins:
    """Which file (or command-line override) set each dotted key."""

    def __init__(self, default: str) -> None:
        self.default = default
        self.map: dict[str, str] = {}

    def mark(self, node: Any, source: str, prefix: str = "") -> None:
        if prefix:
            self.map[prefix] = source
        if isinstance(node, dict):
            for k, v in node.items():
                self.mark(v, source, f"{prefix}.{k}" if prefix else str(k))
        elif isinstance(node, list):
            for i, v in enumerate(node):
                self.mark(v, source, f"{prefix}.{i}" if prefix else str(i))

    def of(self, key: str) -> str:
        parts = key.split(".") if key else []
        while parts:
            k = ".".join(parts)
            if k in self.map:
                return self.map[k]
            parts.pop()
        return self.default


def _read_yaml(path: Path, problems: list[Problem], key: str = "") -> dict[str, Any] | None:
    if not path.is_file():
        problems.append(Problem(str(path), key, "file not found" + (
            "" if key else "; give the path of a recipe YAML file (e.g. recipes/tiny_gsm8k.yaml)")))
        return None
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark else str(path)
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        problems.append(Problem(where, key, f"YAML syntax error: {problem}; fix the YAML at that line"))
        return None
    if data is None:
        return {}
    if not isinstance(data, dict):
        problems.append(Problem(str(path), key, f"a recipe must be a YAML mapping, not {type(data).__name__}"))
        return None
    return data


def _find_base(ref: str, recipe: Path) -> Path:
    cand = [recipe.parent / ref, recipe.parent / "_base" / ref, RECIPES_DIR / ref, RECIPES_DIR / "_base" / ref]
    for c in cand:
        if c.is_file():
            return c
    return recipe.parent / ref


def _deep_merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """``over`` on ``base``: mappings merge key by key; any other value (a list, ``???``) replaces."""
    out = dict(base)
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = _deep_merge(out[k], v)
        else:
            out[k] = copy.deepcopy(v)
    return out


def load_layers(path: Path, problems: list[Problem], origins: _Origins) -> dict[str, Any]:
    """Read ``path`` and its ``base:`` chain, merged base-first."""
    chain: list[tuple[Path, dict[str, Any]]] = []
    seen: set[Path] = set()
    cur, key = path, ""
    while True:
        data = _read_yaml(cur, problems, key)
        if data is None:
            break
        chain.append((cur, data))
        seen.add(cur.resolve())
        ref = data.pop("base", None)
        if ref is None:
            break
        if not isinstance(ref, str):
            problems.append(Problem(str(cur), "base", "must be one file name (e.g. _base/tiny.yaml)"))
            break
        nxt = _find_base(ref, cur)
        if nxt.resolve() in seen:
            problems.append(Problem(str(cur), "base", f"'{ref}' makes a cycle of base recipes"))
            break
        if not nxt.is_file():
            problems.append(Problem(str(cur), "base", f"base recipe '{ref}' not found (looked beside the "
                                    f"recipe, in its _base/ folder and in {RECIPES_DIR}/_base)"))
            break
        cur, key = nxt, "base"
    merged: dict[str, Any] = {}
    for file, data in reversed(chain):
        merged = _deep_merge(merged, data)
        origins.mark(data, str(file))
    return merged


def _parse_value(text: str) -> Any:
    try:
        return yaml.safe_load(text) if text.strip() else ""
    except yaml.YAMLError:
        return text


def _walk_to(root: Any, parts: list[str], create: bool) -> tuple[Any, str | int]:
    node = root
    for p in parts[:-1]:
        if isinstance(node, list):
            idx = int(p)
            node = node[idx]
        else:
            if p not in node or node[p] is None:
                if not create:
                    raise KeyError(p)
                node[p] = {}
            elif isinstance(node[p], str) and create:
                node[p] = {"name": node[p]}  # component shorthand "ecospec" -> {name: ecospec}
            node = node[p]
    last: str | int = parts[-1]
    if isinstance(node, list):
        last = int(last)
    return node, last


def apply_overrides(cfg: dict[str, Any], overrides: Sequence[str], problems: list[Problem],
                    origins: _Origins) -> dict[str, Any]:
    """Apply ``key=value``, ``+key=value`` (add) and ``~key`` (delete). A numeric part indexes a list (one past
    the end appends); setting a key inside a component given by name makes it ``{name: ...}``; values are YAML."""
    for ov in overrides:
        src = f"command-line override '{ov}'"
        if ov.startswith("~"):
            key = ov[1:]
            try:
                parent, last = _walk_to(cfg, key.split("."), create=False)
                del parent[last]
            except (KeyError, IndexError, ValueError, TypeError):
                problems.append(Problem(src, key, "cannot delete: no such key or list item"))
            continue
        if "=" not in ov:
            problems.append(Problem(src, "", "an override is 'key=value', '+key=value' or '~key'"))
            continue
        key, _, text = ov.partition("=")
        key = key.lstrip("+").strip()
        value = _parse_value(text)
        try:
            parent, last = _walk_to(cfg, key.split("."), create=True)
            if isinstance(parent, list):
                if last == len(parent):
                    parent.append(value)
                else:
                    parent[last] = value
            else:
                parent[last] = value
            origins.mark(value, src, key)
            origins.map[key] = src
        except (KeyError, IndexError, ValueError, TypeError) as exc:
            problems.append(Problem(src, key, f"cannot set: {exc} is not a key or list index here"))
    return cfg


_VAR_REF = re.compile(r"\$\{\s*variables\.([A-Za-z0-9_\-.]+?)\s*\}")


def _variable_refs(node: Any) -> set[str]:
    """Dotted paths ``x.y`` of every ``${variables.x.y}`` interpolation in ``node``'s strings (keys included)."""
    out: set[str] = set()
    stack = [node]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            stack.extend(item.values())
            stack.extend(k for k in item.keys() if isinstance(k, str))
        elif isinstance(item, list):
            stack.extend(item)
        elif isinstance(item, str) and "${" in item:
            out.update(_VAR_REF.findall(item))
    return out


def _variable_at(variables: Any, path: str) -> Any:
    node = variables
    for part in path.split("."):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node


def used_variables(cfg: dict[str, Any]) -> set[str]:
    """The ``variables.*`` paths the recipe uses: referenced outside ``variables``, and transitively by those."""
    variables = cfg.get("variables") if isinstance(cfg.get("variables"), dict) else {}
    todo = list(_variable_refs({k: v for k, v in cfg.items() if k != "variables"}))
    used: set[str] = set()
    while todo:
        path = todo.pop()
        if path in used:
            continue
        used.add(path)
        todo.extend(_variable_refs(_variable_at(variables, path)) - used)
    return used


def check_variable_overrides(cfg: dict[str, Any], overrides: Sequence[str], problems: list[Problem]) -> None:
    """Report overrides of ``variables.<path>`` that no value of the recipe references (they change nothing)."""
    used = used_variables(cfg)
    for ov in overrides:
        if ov.startswith("~") or "=" not in ov:
            continue
        key = ov.partition("=")[0].lstrip("+").strip()
        if not key.startswith("variables."):
            continue
        path = key[len("variables."):]
        if any(u == path or u.startswith(path + ".") or path.startswith(u + ".") for u in used):
            continue
        known = ", ".join(f"variables.{u}" for u in sorted(used)) or "none"
        problems.append(Problem(f"command-line override '{ov}'", key,
                                f"no value of this recipe uses {key}, so the override would change nothing. "
                                f"The variables this recipe uses: {known}. Override one of those, or the key "
                                f"itself (e.g. stages.0.trainer.max_steps=8)"))


def resolve_interpolations(cfg: dict[str, Any], problems: list[Problem], origins: _Origins) -> dict[str, Any]:
    """Resolve ``${...}`` interpolations key by key, reporting each one that fails."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    try:
        oc = OmegaConf.create(cfg)
    except OmegaConfBaseException as exc:
        problems.append(Problem(origins.default, "", f"cannot read the recipe: {exc}"))
        return cfg

    def walk(node: Any, path: str) -> Any:
        if OmegaConf.is_dict(node):
            out = {}
            for k in node.keys():
                p = f"{path}.{k}" if path else str(k)
                try:
                    v = node[k]
                except OmegaConfBaseException as exc:
                    msg = str(exc).splitlines()[0]
                    problems.append(Problem(origins.of(p), p, f"interpolation failed: {msg}"))
                    out[k] = None
                    continue
                out[k] = walk(v, p)
            return out
        if OmegaConf.is_list(node):
            out_l = []
            for i in range(len(node)):
                p = f"{path}.{i}"
                try:
                    v = node[i]
                except OmegaConfBaseException as exc:
                    problems.append(Problem(origins.of(p), p, f"interpolation failed: {str(exc).splitlines()[0]}"))
                    out_l.append(None)
                    continue
                out_l.append(walk(v, p))
            return out_l
        return node

    return walk(oc, "")


def _import_extra(items: list[Any], problems: list[Problem], origins: _Origins) -> None:
    for i, item in enumerate(items):
        key = f"imports.{i}"
        if not isinstance(item, str):
            problems.append(Problem(origins.of(key), key, "must be a module name or a .py path"))
            continue
        try:
            if item.endswith(".py"):
                p = Path(item)
                if not p.is_absolute():
                    base = Path(origins.of(key)).parent if Path(origins.of(key)).is_file() else Path.cwd()
                    p = (base / p) if (base / p).is_file() else Path.cwd() / p
                mod_name = f"specmoe_recipe_import_{p.stem}"
                if mod_name not in sys.modules:
                    spec = importlib.util.spec_from_file_location(mod_name, p)
                    if spec is None or spec.loader is None or not p.is_file():
                        raise ImportError(f"file {p} not found")
                    mod = importlib.util.module_from_spec(spec)
                    sys.modules[mod_name] = mod
                    spec.loader.exec_module(mod)
            else:
                importlib.import_module(item)
        except Exception as exc:  # noqa: BLE001 - any failure of user code is a recipe problem
            problems.append(Problem(origins.of(key), key, f"cannot import '{item}': {exc}"))


def load_recipe(path: str | Path, overrides: Sequence[str] = (), *, check_plugins: bool = True):
    """Load, override, resolve and validate a recipe into a ``RunConfig``; :class:`ConfigError` lists every problem."""
    from specmoe.config.schema import RunConfig

    path = Path(path)
    problems: list[Problem] = []
    origins = _Origins(str(path))
    raw = load_layers(path, problems, origins)
    if problems:
        raise ConfigError(problems)
    raw = apply_overrides(raw, overrides, problems, origins)
    check_variable_overrides(raw, overrides, problems)
    resolved = resolve_interpolations(raw, problems, origins)
    if isinstance(resolved.get("imports"), list):
        _import_extra(resolved["imports"], problems, origins)
    validator = Validator(problems, origins.of, check_plugins=check_plugins)
    cfg = validator.convert(resolved, RunConfig, "")
    validator.check_stage_refs(cfg)
    validator.check_values(cfg)
    if problems:
        raise ConfigError(problems)
    cfg.source = str(path)
    cfg.overrides = list(overrides)
    return cfg
