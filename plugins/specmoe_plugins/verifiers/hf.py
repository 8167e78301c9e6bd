# SPDX-License-Identifier: Apache-2.0
"""``hf``: the model's own experts implementation (the reference verifier)."""

from __future__ import annotations

from dataclasses import dataclass

from specmoe.interfaces.verifier import Verifier

__all__ = ["HFVerifier"]


class HFVerifier(Verifier):
    """Uses a built-in ``transformers`` experts implementation (``eager`` loops over the experts hit)."""

    description = "transformers' own experts implementation (eager or grouped_mm)"

    @dataclass
    class Config:
        implementation: str = "eager"
        """``eager`` (loop over the union of experts) or ``grouped_mm``; never ``batched_mm`` (copies weights
        per token)."""

    def implementation_name(self) -> str:
        if self.config.implementation == "batched_mm":
            raise ValueError("verifier hf: batched_mm copies expert weights per token; use eager or grouped_mm")
        return self.config.implementation
