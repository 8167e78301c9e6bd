# SPDX-License-Identifier: Apache-2.0
"""Tree attention masks in the form each Hugging Face architecture expects, per layer attention type."""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

import torch

from specmoe.errors import UserError
from specmoe.interfaces.kv import KVState

if TYPE_CHECKING:
    from transformers import PretrainedConfig

__all__ = ["MaskSpec"]

#: layer types of ``config.layer_types`` this module builds masks for
_KINDS = ("full_attention", "sliding_attention")


class MaskSpec:
    """Which masks a model takes, decided from its ``transformers`` config as its own modeling code decides:

    * ``config.layer_types`` present (GPT-OSS, Qwen3, ...): each layer gets the mask of its own type (a window
      only on ``sliding_attention`` layers); several types: a ``{type: mask}`` mapping, one type: that mask.
    * otherwise (Qwen3-MoE, DeepSeek-V3): one mask for every layer, windowed when ``sliding_window`` is set (and
      ``use_sliding_window`` is not false).
    """

    def __init__(self, config: PretrainedConfig) -> None:
        window = getattr(config, "sliding_window", None)
        layer_types = getattr(config, "layer_types", None)
        if layer_types:
            bad = sorted(set(layer_types) - set(_KINDS))
            if bad:
                raise UserError(f"tree masks for layer types {bad} are not supported (config.layer_types of "
                                f"{type(config).__name__}); supported: {', '.join(_KINDS)}")
            self.kinds = [k for k in _KINDS if k in layer_types]
            if "sliding_attention" in self.kinds and window is None:
                raise UserError(f"{type(config).__name__}: layer_types has sliding_attention layers but "
                                f"sliding_window is not set")
        else:
            slides = window is not None and getattr(config, "use_sliding_window", True)
            self.kinds = ["sliding_attention" if slides else "full_attention"]
        self.window = window if "sliding_attention" in self.kinds else None

    @property
    def mode(self) -> str:
        """``mapping`` (one mask per layer type), ``sliding`` or ``full``."""
        if len(self.kinds) > 1:
            return "mapping"
        return "sliding" if self.kinds[0] == "sliding_attention" else "full"

    def layer_windows(self, layer_types: Sequence[str] | None, num_layers: int) -> list[int | None]:
        """Per layer, the attention window of its mask (``None``: full attention)."""
        if self.mode != "mapping":
            return [self.window] * num_layers
        return [self.window if kind == "sliding_attention" else None for kind in layer_types]

    def build(self, kv: KVState, positions: torch.Tensor, attend: torch.Tensor, valid: torch.Tensor,
              dtype: torch.dtype, cached_attend: torch.Tensor | None = None) -> torch.Tensor | dict[str, torch.Tensor]:
        """Additive float mask(s) ``[B, 1, N, S + N]`` (a ``{layer type: mask}`` dict for several types)."""
        windows = [self.window if k == "sliding_attention" else None for k in self.kinds]
        masks = kv.masks(positions, attend, valid, windows, cached_attend, dtype)
        if len(masks) == 1:
            return masks[0]
        return dict(zip(self.kinds, masks))
