# SPDX-License-Identifier: Apache-2.0
"""A decoding method assembled from its components: autoregressive, or drafter + predictor + selector."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Sequence

from specmoe.config.schema import MethodConfig
from specmoe.decoding.ar import ar_generate
from specmoe.decoding.engine import SpeculativeEngine
from specmoe.decoding.records import Generation
from specmoe.decoding.settings import DecodeSettings

if TYPE_CHECKING:
    from specmoe.interfaces.target import Target

__all__ = ["Method"]


class Method:
    """Builds and runs one method on a shared target (``resolve`` maps option trees with ``stage:<id>``
    references to concrete paths)."""

    def __init__(self, cfg: MethodConfig, target: Target, resolve: Callable[[Any], Any]) -> None:
        self.cfg = cfg
        self.name = cfg.name
        self.target = target
        build = lambda comp: comp.__class__(comp.name, resolve(comp.options), comp.kind).build()  # noqa: E731
        self.verifier = build(cfg.verifier)
        self.drafter = None
        self.predictor = None
        self.engine = None
        if cfg.drafter is not None:
            self.drafter = build(cfg.drafter)
            self.drafter.setup(target)
            self.selector = build(cfg.selector)
            if cfg.predictor is not None:
                self.predictor = build(cfg.predictor)
                if self.predictor.uses_draft_features and self.drafter.feature_size <= 0:
                    from specmoe.errors import UserError
                    from specmoe.registry import drafters

                    others = [n for n in drafters.names() if n != cfg.drafter.name]
                    raise UserError(f"method '{cfg.name}': predictor '{cfg.predictor.name}' reads the drafter's "
                                    f"node features, which drafter '{cfg.drafter.name}' does not provide (use "
                                    f"a drafter with node features; registered: {', '.join(others)})")
                self.predictor.setup(target)
            self.engine = SpeculativeEngine(target, self.drafter, self.selector, self.predictor)
        elif cfg.predictor is not None:
            raise ValueError(f"method '{cfg.name}': a predictor needs a drafter (autoregressive methods have "
                             f"no draft tree)")

    @property
    def adaptive(self) -> bool:
        """The selector prices its choice and learns online (an AdaptiveSelector)."""
        return self.engine is not None and self.engine.adaptive

    def calibration(self) -> dict[str, Any]:
        """The adaptive selector's models now, and the AR floor's decisions so far (empty otherwise)."""
        if not self.adaptive:
            return {}
        out = dict(self.selector.calibration())
        if self.engine.floor is not None:
            out["ar_floor"] = dict(self.engine.floor.counts)
        return out

    @property
    def analysis_only(self) -> bool:
        return self.cfg.analysis_only or bool(getattr(self.predictor, "analysis_only", False))

    def generate(self, prompts: Sequence[Sequence[int]], settings: DecodeSettings) -> Generation:
        """Generate ``prompts`` with this method's components (``settings.budget`` etc. ignored by ``ar``)."""
        self.verifier.install(self.target)
        if self.engine is None:
            return ar_generate(self.target, prompts, temperature=settings.temperature, stop=settings.stop,
                               seed=settings.seed)
        return self.engine.generate(prompts, **settings.engine_kwargs())

