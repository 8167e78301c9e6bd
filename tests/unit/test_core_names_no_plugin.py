# SPDX-License-Identifier: Apache-2.0
"""Core (``platform/specmoe``) names no plugin: it asks the registry (issue 24, point 2).

The check reads pyproject.toml's ``specmoe.*`` entry-point names and walks the AST of every module under
``platform/specmoe``: a string literal (f-string pieces included) *equal* to a plugin name is a violation. Prose
that mentions a plugin inside a longer sentence, identifiers and English words are not (``confidence`` the
variable is fine; ``"confidence"`` the registry key is not).

``PENDING`` lists, per file, the names still there, with the reason and the part of issue 24 that removes them.
It is debt, not an allow-list: the test fails on any occurrence not listed *and* on a listed one that is gone,
so the list can only shrink (delete the entry when you clean a file).
"""

from __future__ import annotations

import ast
import importlib.metadata
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[2]
CORE = ROOT / "platform" / "specmoe"
#: the defaults group's names are kinds / roles ("selector", "verifier.union"), not plugins: its values point at
#: plugins the other groups name (``Registry.default``)
ROLES = "specmoe.defaults"
#: a plugin named after a component kind (the ``verifier`` bench) cannot be told from the kind's word, which core
#: quotes by design (a recipe's ``verifier:`` key, ``Registry("verifier")``): kind words are not checked
KIND_WORDS = {"target", "drafter", "selector", "predictor", "verifier", "dataset", "stage", "bench", "command"}
#: the built-in ``engine`` bench is named after the core's own object, the decoding engine, which core quotes as a
#: word (the ``engine`` column of ``platform compare``'s engine rows): not checked either
CORE_WORDS = {"engine"}

#: file (relative to platform/specmoe) -> plugin names still quoted there. Each line says why and what removes it.
PENDING: dict[str, set[str]] = {
    # deprecated aliases (removed in 0.3.0): MOVED's names of specmoe.traces.collect / .token_table are the moved
    # functions, which the stages are named after
    "utils/deprecation.py": {"collect_traces", "build_token_table"},
}


def plugin_names() -> dict[str, list[str]]:
    """Every entry-point name of a ``specmoe.*`` group in pyproject.toml -> its groups (Python 3.10 has no
    ``tomllib``: there the installed distribution's entry points, which the install wrote from pyproject.toml)."""
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        groups: dict[str, list[str]] = {}
        for ep in importlib.metadata.distribution("specmoe").entry_points:
            groups.setdefault(ep.group, []).append(ep.name)
    else:
        groups = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["entry-points"]
    out: dict[str, list[str]] = {}
    for group, entries in groups.items():
        if group.startswith("specmoe.") and group != ROLES:
            for name in entries:
                if name not in KIND_WORDS | CORE_WORDS:
                    out.setdefault(name, []).append(group)
    return out


def quoted_names(source: str, names: set[str]) -> list[tuple[int, str]]:
    """(line, name) of every string literal in ``source`` equal to one of ``names``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in names:
            found.append((node.lineno, node.value))
    return found


def core_occurrences(names: set[str]) -> dict[str, dict[str, list[int]]]:
    out: dict[str, dict[str, list[int]]] = {}
    for path in sorted(CORE.rglob("*.py")):
        for line, name in quoted_names(path.read_text(), names):
            out.setdefault(path.relative_to(CORE).as_posix(), {}).setdefault(name, []).append(line)
    return out


def test_the_check_sees_plugin_names_and_ignores_words():
    names = {"eagle3", "confidence", "hf"}
    src = ('confidence = 0.5\n'                       # an identifier: fine
           'msg = "the confidence of eagle3 drafts"\n'  # prose: fine
           'd = drafters.get("eagle3")\n'             # a registry key: found
           'x = {"hf": 1}\n'                          # a dict key: found
           'y = f"{confidence}: hf"\n')               # an f-string piece that is not exactly a name: fine
    assert quoted_names(src, names) == [(3, "eagle3"), (4, "hf")]


def test_entry_points_are_read():
    names = plugin_names()
    assert len(names) > 20 and all(g.startswith("specmoe.") for gs in names.values() for g in gs)
    installed = {ep.name for ep in importlib.metadata.distribution("specmoe").entry_points
                 if ep.group.startswith("specmoe.") and ep.group != ROLES}
    assert installed and installed - KIND_WORDS - CORE_WORDS <= set(names)  # the install read this pyproject.toml
    from specmoe.registry.kinds import KINDS, benches, commands

    assert KIND_WORDS == {*KINDS, benches.kind, commands.kind}  # only the kinds' own words are left unchecked


def test_core_quotes_no_plugin_name_beyond_the_pending_list():
    names = plugin_names()
    found = core_occurrences(set(names))
    new = {f"{f}:{lines[0]}: {n!r} ({', '.join(names[n])})"
           for f, by_name in found.items() for n, lines in by_name.items() if n not in PENDING.get(f, set())}
    assert not new, ("core names a plugin; ask the registry (names(), a plugin's own attributes or Config, the "
                     "target) instead:\n" + "\n".join(sorted(new)))


def test_the_pending_list_only_shrinks():
    found = core_occurrences(set(plugin_names()))
    stale = {f"{f}: {n!r}" for f, ns in PENDING.items() for n in ns if n not in found.get(f, {})}
    assert not stale, "no longer in core, delete from PENDING:\n" + "\n".join(sorted(stale))
