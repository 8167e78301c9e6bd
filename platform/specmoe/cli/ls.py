# SPDX-License-Identifier: Apache-2.0
"""``platform ls [kind]``: list registered plugins, where each comes from and the defaults (imports no plugin)."""

from __future__ import annotations

import argparse

__all__ = ["add_parser", "run"]


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("ls", help="list registered plugins: platform ls [kind]")
    p.add_argument("kind", nargs="?", help="target, drafter, selector, predictor, verifier, dataset, stage")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from specmoe.errors import UserError
    from specmoe.registry import KINDS, registry_for

    try:
        regs = [registry_for(args.kind)] if args.kind else list(KINDS.values())
    except KeyError as exc:
        raise UserError(str(exc).strip("'\"")) from None
    for reg in regs:
        print(f"{reg.kind}{'es' if reg.kind.endswith('ch') else 's'} ({reg.group}):")
        entries = reg.entries()
        if not entries:
            print("  (none)")
        width = max((len(n) for n, _, _ in entries), default=0)
        marks: dict[str, list[str]] = {}
        for role, name in sorted(reg.defaults().items()):
            marks.setdefault(name, []).append(f"default{' ' + role if role else ''}")
        for name, target, origin in entries:
            mark = f"  ({', '.join(marks[name])})" if name in marks else ""
            print(f"  {name:<{width}}  {target}  [{origin}]{mark}")
    return 0
