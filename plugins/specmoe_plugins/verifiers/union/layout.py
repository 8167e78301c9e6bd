# SPDX-License-Identifier: Apache-2.0
"""Expert weight layouts of ``transformers`` MoE experts modules, and the per-expert math in plain PyTorch.

Three layouts are supported (``transformers`` 5.24), told apart by the module flags that
``@use_experts_implementation`` sets and by the weight shapes (never by attribute names, which differ):

* GPT-OSS: ``is_transposed``, not ``is_concatenated``, ``has_bias``. ``gate_up_proj [E, H, 2I]`` used as
  ``x @ W`` with gate in the even and up in the odd output columns; ``down_proj [E, I, H]``; biases
  ``[E, 2I]`` / ``[E, H]``; activation ``(clamp(u, -l, l) + 1) * g * sigmoid(alpha * g)``, ``g = min(g, l)``.
* Qwen3-MoE and DeepSeek-V3: not transposed, concatenated, no bias. ``gate_up_proj [E, 2I, H]`` used as
  ``F.linear`` with gate rows ``[0, I)`` and up rows ``[I, 2I)``; ``down_proj [E, H, I]``;
  activation ``act_fn(g) * u`` (SiLU).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from specmoe.errors import UserError

__all__ = ["ExpertsLayout", "experts_layout", "expert_forward", "apply_gate"]

#: activation kinds a kernel can implement; anything else runs only through ``module`` in PyTorch
ACT_SILU = "silu"
ACT_SWIGLU_OAI = "swiglu_oai"
ACT_OTHER = "other"


@dataclass(frozen=True)
class ExpertsLayout:
    """Dimensions and storage flags of one experts module."""

    num_experts: int
    hidden: int
    intermediate: int
    transposed: bool
    """weights are input-major (``x @ W``), ``[E, in, out]``; else output-major ``[E, out, in]``."""
    interleaved: bool
    """gate / up alternate in the gate_up output columns; else gate ``[0, I)``, up ``[I, 2I)``."""
    has_bias: bool
    activation: str
    """``swiglu_oai`` (GPT-OSS clamp), ``silu`` or ``other`` (only the module's own ``act_fn`` knows it)."""
    alpha: float = 1.0
    limit: float = float("inf")


def _is_silu(act: Any) -> bool:
    return isinstance(act, torch.nn.SiLU) or type(act).__name__ in ("SiLUActivation", "SiLU")


def experts_layout(module: Any) -> ExpertsLayout:
    """Read the layout of an experts module (one decorated with ``@use_experts_implementation``).

    Raises:
        UserError: the module is not a gated (gate_up / down) experts module this package understands.
    """
    name = type(module).__name__
    if not getattr(module, "has_gate", True) or not hasattr(module, "gate_up_proj"):
        raise UserError(f"union verifiers need gated experts (gate_up_proj + down_proj); {name} has none: "
                        f"use 'verifier: {{name: hf}}' for this model")
    if getattr(module, "has_post_expert_norm", False):
        raise UserError(f"union verifiers do not implement a post-expert norm ({name}): "
                        f"use 'verifier: {{name: hf}}'")
    transposed = bool(getattr(module, "is_transposed", False))
    interleaved = not bool(getattr(module, "is_concatenated", True))
    has_bias = bool(getattr(module, "has_bias", False))
    gu, dn = module.gate_up_proj, module.down_proj
    e = int(gu.shape[0])
    if transposed:
        h, i2 = int(gu.shape[1]), int(gu.shape[2])
        down_expected = (e, i2 // 2, h)
    else:
        i2, h = int(gu.shape[1]), int(gu.shape[2])
        down_expected = (e, h, i2 // 2)
    if i2 % 2 or tuple(dn.shape) != down_expected:
        raise UserError(f"{name}: gate_up_proj {tuple(gu.shape)} and down_proj {tuple(dn.shape)} do not "
                        f"form a {'transposed' if transposed else 'output-major'} gated layout")
    if interleaved and hasattr(module, "alpha") and hasattr(module, "limit"):
        act, alpha, limit = ACT_SWIGLU_OAI, float(module.alpha), float(module.limit)
    elif not interleaved and _is_silu(getattr(module, "act_fn", None)):
        act, alpha, limit = ACT_SILU, 1.0, float("inf")
    else:
        act, alpha, limit = ACT_OTHER, 1.0, float("inf")
    return ExpertsLayout(num_experts=e, hidden=h, intermediate=i2 // 2, transposed=transposed,
                         interleaved=interleaved, has_bias=has_bias, activation=act, alpha=alpha, limit=limit)


def apply_gate(module: Any, layout: ExpertsLayout, gate_up: torch.Tensor) -> torch.Tensor:
    """``[M, 2I] -> [M, I]`` in the same dtype."""
    if layout.activation == ACT_SWIGLU_OAI:
        gate, up = gate_up[..., 0::2], gate_up[..., 1::2]
        gate = gate.clamp(max=layout.limit)
        up = up.clamp(min=-layout.limit, max=layout.limit)
        return (up + 1) * (gate * torch.sigmoid(gate * layout.alpha))
    if layout.activation == ACT_SILU or not layout.interleaved:
        gate, up = gate_up.chunk(2, dim=-1)
        return module.act_fn(gate) * up
    return module._apply_gate(gate_up)


def expert_forward(module: Any, layout: ExpertsLayout, expert: int, x: torch.Tensor) -> torch.Tensor:
    """One expert on its tokens: ``x [M, H]`` -> ``[M, H]`` in the weights' dtype (no routing weight).

    One matmul per projection over all ``M`` rows, so the expert's weights are read once.
    """
    w_gu, w_d = module.gate_up_proj[expert], module.down_proj[expert]
    x = x.to(w_gu.dtype)
    h = x @ w_gu if layout.transposed else torch.nn.functional.linear(x, w_gu)
    if layout.has_bias:
        h = h + module.gate_up_proj_bias[expert]
    a = apply_gate(module, layout, h)
    y = a @ w_d if layout.transposed else torch.nn.functional.linear(a, w_d)
    if layout.has_bias:
        y = y + module.down_proj_bias[expert]
    return y
