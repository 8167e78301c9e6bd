# SPDX-License-Identifier: Apache-2.0
"""Tree attention masks in the form each Hugging Face architecture expects."""

from __future__ import annotations

from typing import Any

import torch

from specmoe.interfaces.kv import KVState

__all__ = ["MaskSpec"]


class MaskSpec:
    """How a model takes custom masks: one mask, a sliding one, or GPT-OSS's per-layer-kind mapping.

    Args:
        config: the model's ``transformers`` config.
    """

    def __init__(self, config: Any) -> None:
        layer_types = getattr(config, "layer_types", None) or []
        window = getattr(config, "sliding_window", None)
        if "sliding_attention" in layer_types:
            self.mode, self.window = "mapping", window
        elif window is not None and getattr(config, "use_sliding_window", True):
            self.mode, self.window = "sliding", window
        else:
            self.mode, self.window = "full", None

    def build(self, kv: KVState, positions: torch.Tensor, attend: torch.Tensor, valid: torch.Tensor,
              dtype: torch.dtype, cached_attend: torch.Tensor | None = None) -> Any:
        """Additive float mask(s) ``[B, 1, N, S + N]`` (a dict for ``mapping`` models)."""
        if self.mode == "mapping":
            return {"full_attention": kv.mask(positions, attend, valid, dtype, None, cached_attend),
                    "sliding_attention": kv.mask(positions, attend, valid, dtype, self.window, cached_attend)}
        return kv.mask(positions, attend, valid, dtype, self.window, cached_attend)
