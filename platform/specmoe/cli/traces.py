# SPDX-License-Identifier: Apache-2.0
"""``platform traces evaluate --traces DIR -p PREDICTOR...``: held-out top-K accuracy of expert predictors on a
routing-trace directory (feature-based ones, e.g. ``-p draft_head:path=DIR``, need ``--drafter eagle3:path=DIR``)."""

from __future__ import annotations

import argparse

__all__ = ["add_parser", "run"]


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("traces", help="routing traces: platform traces evaluate --traces DIR -p PREDICTOR...")
    inner = p.add_subparsers(dest="action", metavar="ACTION")
    ev = inner.add_parser(
        "evaluate", help="held-out top-K accuracy of expert predictors on routing traces",
        description="Replays each held-out traced sample through each predictor's decoding interface and "
        "prints its top-K overlap accuracy (overall and per layer), then all results as one JSON line.")
    ev.add_argument("--traces", required=True, help="trace directory (a collect_traces stage's output)")
    ev.add_argument("--split", default="test")
    ev.add_argument("--target", default=None, help="target checkpoint (default: the one recorded in the traces)")
    ev.add_argument("--target-plugin", default=None, help="target plugin name (default: the registry's default "
                    "target, marked by 'platform ls target')")
    ev.add_argument("--device", default="cpu")
    ev.add_argument("--max-samples", type=int, default=None)
    ev.add_argument("-p", "--predictor", action="append", default=[], metavar="NAME[:KEY=VALUE,...]",
                    help="predictor to evaluate, with options (repeat for several)")
    ev.add_argument("--drafter", default=None, metavar="NAME[:KEY=VALUE,...]",
                    help="drafter giving the node features of feature-based predictors (draft_head), e.g. "
                    "eagle3:path=DIR")
    ev.add_argument("--feature-depth", type=int, default=1,
                    help="tree depth of the drafter features (1: proposed from committed context)")
    ev.set_defaults(func=run)
    p.set_defaults(func=lambda args: p.print_help() or 2)


def _options(text: str) -> dict[str, str]:
    from specmoe.errors import UserError

    out = {}
    for item in filter(None, text.split(",")):
        key, sep, value = item.partition("=")
        if not sep:
            raise UserError(f"predictor option '{item}' is not KEY=VALUE (e.g. -p learned:path=DIR)")
        out[key] = value
    return out


def run(args: argparse.Namespace) -> int:
    import json

    from specmoe.registry import drafters, predictors, targets
    from specmoe.traces.format import TraceReader
    from specmoe.training.trace_eval import evaluate_predictor

    reader = TraceReader(args.traces)
    target = targets.get(args.target_plugin or targets.default())(path=args.target or reader.meta.target["path"],
                                                                   device=args.device)
    drafter = None
    if args.drafter:
        name, _, opts = args.drafter.partition(":")
        drafter = drafters.get(name)(**_options(opts))
        drafter.setup(target)
    results = {}
    for spec in args.predictor:
        name, _, opts = spec.partition(":")
        pred = predictors.get(name)(**_options(opts))
        pred.setup(target)
        res = evaluate_predictor(pred, reader, args.split, max_samples=args.max_samples, device=args.device,
                                 drafter=drafter, target=target, feature_depth=args.feature_depth)
        results[spec] = res
        print(f"{spec}: acc={res['acc']:.4f} per layer={[round(a, 4) for a in res['acc_per_layer']]} "
              f"tokens={res['tokens']}")
    print(json.dumps(results))
    return 0
