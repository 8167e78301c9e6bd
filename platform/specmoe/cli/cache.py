# SPDX-License-Identifier: Apache-2.0
"""``platform cache ls`` and ``platform cache clean [ID...|--failed|--all]``: the stage cache."""

from __future__ import annotations

import argparse

__all__ = ["add_parser"]


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("cache", help="list or remove cached stages: platform cache ls | clean ID...",
                       description="Stages are cached under <cache_dir>/stages/<name>-<key>/. 'ls' shows each "
                       "one's recipe id, stage name, key, state (done, failed, incomplete, running, killed, "
                       "partial), size and age; 'clean' removes them (never one that a process is computing).")
    p.add_argument("--cache-dir", default=".specmoe_cache", help="cache directory (default: .specmoe_cache)")
    inner = p.add_subparsers(dest="action", metavar="ACTION")
    ls = inner.add_parser("ls", help="list cached stages")
    ls.set_defaults(func=_ls)
    clean = inner.add_parser("clean", help="remove cached stages: IDs (stage id, key or directory name), "
                             "--failed or --all")
    clean.add_argument("ids", nargs="*", metavar="ID", help="stage id from the recipe, cache key or directory")
    which = clean.add_mutually_exclusive_group()
    which.add_argument("--failed", action="store_true", help="every failed or incomplete stage")
    which.add_argument("--all", action="store_true", help="every stage and every cached evaluation group")
    clean.set_defaults(func=_clean)
    p.set_defaults(func=lambda args: p.print_help() or 2)


def _ls(args: argparse.Namespace) -> int:
    from specmoe.stages.state import human_age, human_size, list_stages

    entries = list_stages(args.cache_dir)
    if not entries:
        print(f"no cached stages in {args.cache_dir}/stages")
        return 0
    rows = [("ID", "NAME", "KEY", "STATE", "SIZE", "AGE")]
    rows += [(e.id, e.name, e.key, e.state, human_size(e.size), human_age(e.age_s)) for e in entries]
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip())
    for e in entries:
        if e.reason:
            print(f"{e.id} ({e.key}) {e.state}: {e.reason}")
    return 0


def _clean(args: argparse.Namespace) -> int:
    import shutil
    from pathlib import Path

    from specmoe.errors import UserError
    from specmoe.stages.state import find, list_stages, remove

    entries = list_stages(args.cache_dir)
    if args.all:
        chosen = entries
    elif args.failed:
        chosen = [e for e in entries if e.state in ("failed", "incomplete")]
    elif args.ids:
        chosen, unknown = [], []
        for token in args.ids:
            hits = find(entries, token)
            chosen += [h for h in hits if h not in chosen]
            if not hits:
                unknown.append(token)
        if unknown:
            known = ", ".join(sorted({e.id for e in entries})) or "(none)"
            raise UserError(f"no cached stage matches {', '.join(unknown)} in {args.cache_dir}/stages; "
                            f"stage ids there: {known} (see 'platform cache ls')")
    else:
        raise UserError("say what to remove: stage IDs, --failed or --all (see 'platform cache ls')")
    code = 0
    for e in chosen:
        why = remove(e)
        if why is None:
            print(f"removed {e.id} ({e.name}-{e.key}, {e.state})")
        else:
            print(f"kept {e.id} ({e.name}-{e.key}): {why}")
            code = 1
    if args.all:
        evals = Path(args.cache_dir) / "eval"
        if evals.is_dir():
            shutil.rmtree(evals)
            print(f"removed the evaluation cache {evals}")
    if not chosen and not args.all:
        print("nothing to remove")
    return code
