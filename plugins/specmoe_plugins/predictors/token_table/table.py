# SPDX-License-Identifier: Apache-2.0
"""The token-table baseline: per token id, the experts the router chose most often for it, per layer.

Built by streaming the ``train`` split of a trace directory shard by shard. Counts are kept only for token
ids that occur (``[U, L, E]``), so a 200k vocabulary costs nothing for tokens never seen. Tokens seen fewer
than ``min_count`` times, or never, fall back to the globally most frequent experts of each layer. Ties are
broken towards the lower expert id (stable sort), so tables are deterministic.

Stored as ``token_table.safetensors`` (``token_ids [U]``, ``experts [U, L, K]``, ``token_counts [U]``,
``fallback [L, K]``) plus ``token_table.json`` (shapes and provenance).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from specmoe.errors import UserError
from specmoe.traces.format import TraceReader

__all__ = ["TokenTable", "build_token_table", "TABLE_FILE", "TABLE_META"]

TABLE_FILE = "token_table.safetensors"
TABLE_META = "token_table.json"


def _top(counts: torch.Tensor, k: int) -> torch.Tensor:
    """``[..., E]`` counts -> ``[..., k]`` most frequent experts (ties: lower id first)."""
    return torch.sort(counts, dim=-1, descending=True, stable=True).indices[..., :k]


@dataclass
class TokenTable:
    """Most frequent top-K experts per token id and layer, with a global fallback.

    Attributes:
        token_ids: ``[U]`` int64 token ids with an entry.
        experts: ``[U, L, K]`` int64 their most frequent experts.
        token_counts: ``[U]`` int64 occurrences in the traces.
        fallback: ``[L, K]`` int64 globally most frequent experts (unseen tokens).
        meta: shapes (``num_layers``, ``num_experts``, ``top_k``, ``vocab_size``) and provenance.
    """

    token_ids: torch.Tensor
    experts: torch.Tensor
    token_counts: torch.Tensor
    fallback: torch.Tensor
    meta: dict[str, Any] = field(default_factory=dict)
    _dense: torch.Tensor | None = None

    def lookup(self, ids: torch.Tensor) -> torch.Tensor:
        """``[...]`` token ids -> ``[..., L, K]`` predicted experts (fallback for unseen ids)."""
        dev = ids.device
        if self._dense is None or self._dense.device != dev:
            vocab = int(self.meta.get("vocab_size", 0)) or int(self.token_ids.max().item() + 1)
            rows = torch.full((vocab,), len(self.token_ids), dtype=torch.long)
            rows[self.token_ids] = torch.arange(len(self.token_ids))
            self._rows = rows.to(dev)
            self._dense = torch.cat([self.experts, self.fallback[None]], dim=0).to(dev)
        row = self._rows[ids.clamp(0, self._rows.numel() - 1)]
        row = torch.where(ids < self._rows.numel(), row, torch.full_like(row, len(self.token_ids)))
        return self._dense[row]

    def save(self, out_dir: str | Path) -> Path:
        from safetensors.torch import save_file

        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        save_file({"token_ids": self.token_ids.contiguous(),
                   "experts": self.experts.to(torch.int16).contiguous(),
                   "token_counts": self.token_counts.contiguous(),
                   "fallback": self.fallback.to(torch.int16).contiguous()}, str(out / TABLE_FILE))
        (out / TABLE_META).write_text(json.dumps(self.meta, indent=1))
        return out

    @classmethod
    def load(cls, path: str | Path) -> "TokenTable":
        from safetensors.torch import load_file

        root = Path(path)
        if not (root / TABLE_FILE).is_file():
            raise UserError(f"'{path}' holds no {TABLE_FILE}: point 'path' at the output directory of the "
                            f"build_token_table stage")
        t = load_file(str(root / TABLE_FILE))
        meta = json.loads((root / TABLE_META).read_text()) if (root / TABLE_META).is_file() else {}
        return cls(t["token_ids"].long(), t["experts"].long(), t["token_counts"].long(), t["fallback"].long(),
                   meta)


def build_token_table(reader: TraceReader, split: str = "train", min_count: int = 1) -> TokenTable:
    """Count router choices per token id over ``split`` of ``reader`` (one shard in memory at a time)."""
    m = reader.meta
    n_l, n_e, k = m.num_layers, m.num_experts, m.top_k
    row_of = torch.full((m.vocab_size,), -1, dtype=torch.long)
    counts = torch.zeros(0, n_l, n_e, dtype=torch.int32)
    total = torch.zeros(n_l, n_e, dtype=torch.long)
    n_tokens = 0
    layer = torch.arange(n_l)[None, :, None]
    for _, cols in reader.iter_shards(split):
        ids = cols["token_ids"].long()
        routing = cols["routing"].long()  # [T, L, K]
        new = torch.unique(ids[row_of[ids] < 0])
        if new.numel():
            row_of[new] = torch.arange(counts.shape[0], counts.shape[0] + new.numel())
            counts = torch.cat([counts, torch.zeros(new.numel(), n_l, n_e, dtype=torch.int32)])
        rows = row_of[ids][:, None, None].expand_as(routing)
        counts.index_put_((rows, layer.expand_as(routing), routing), torch.ones((), dtype=torch.int32),
                          accumulate=True)
        total.index_put_((layer.expand_as(routing).reshape(-1), routing.reshape(-1)),
                         torch.ones((), dtype=torch.long), accumulate=True)
        n_tokens += ids.numel()
    if n_tokens == 0:
        raise UserError(f"traces in {reader.root} have no '{split}' tokens to build a token table from")
    token_ids = (row_of >= 0).nonzero().squeeze(1)
    rows = row_of[token_ids]
    tok_counts = counts[rows, 0].sum(dim=-1).long() // k  # each occurrence adds K to every layer
    keep = tok_counts >= min_count
    token_ids, rows, tok_counts = token_ids[keep], rows[keep], tok_counts[keep]
    meta = {"num_layers": n_l, "num_experts": n_e, "top_k": k, "vocab_size": m.vocab_size, "split": split,
            "min_count": min_count, "tokens_counted": n_tokens, "traces": str(reader.root)}
    return TokenTable(token_ids, _top(counts[rows], k).long(), tok_counts, _top(total, k).long(), meta)
