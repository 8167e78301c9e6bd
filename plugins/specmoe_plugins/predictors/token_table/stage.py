# SPDX-License-Identifier: Apache-2.0
"""``build_token_table``: the zero-parameter ``token_table`` predictor from routing traces (per token id, the
most frequent experts per layer on the ``train`` split); reports its held-out top-K accuracy."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specmoe.errors import UserError
from specmoe.interfaces.stage import Stage, StageContext

__all__ = ["BuildTokenTable"]


class BuildTokenTable(Stage):
    """Counts router choices per token id; output directory is the ``token_table`` predictor's ``path``."""

    description = "per-token most frequent experts from routing traces (token_table predictor)"
    version = "1"

    @dataclass
    class Config:
        traces: str = ""
        """trace directory (``stage:<collect_traces id>``)."""
        split: str = "train"
        """split the table is built from."""
        eval_split: str = "test"
        """split its accuracy is reported on (empty: none)."""
        min_count: int = 1
        """tokens seen fewer times use the global fallback."""

    def run(self, out_dir: Path, ctx: StageContext) -> dict[str, Any]:
        from specmoe.traces.format import TraceReader
        from specmoe.training.trace_eval import evaluate_lookup
        from specmoe.utils.dist import dist_info
        from specmoe_plugins.predictors.token_table.table import build_token_table

        cfg = self.config
        if not cfg.traces:
            raise UserError("build_token_table: set 'traces' (e.g. \"stage:traces\")")
        if cfg.min_count < 1:
            raise UserError(f"build_token_table.min_count must be >= 1, got {cfg.min_count}")

        reader = TraceReader(cfg.traces)
        table = build_token_table(reader, cfg.split, cfg.min_count)
        summary: dict[str, Any] = {"tokens_with_entry": int(table.token_ids.numel()),
                                   "tokens_counted": table.meta["tokens_counted"]}
        if cfg.eval_split and cfg.eval_split in reader.splits():
            res = evaluate_lookup(table.lookup, reader, cfg.eval_split)
            summary[f"{cfg.eval_split}_acc"] = res["acc"]
            summary[f"{cfg.eval_split}_acc_per_layer"] = res["acc_per_layer"]
            table.meta[f"{cfg.eval_split}_acc"] = res["acc"]
        if dist_info().rank == 0:
            table.save(out_dir)
        return summary
