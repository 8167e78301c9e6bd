# SPDX-License-Identifier: Apache-2.0
"""The typed schema of a run recipe.

A component is its registry key (or ``"pkg.mod:Class"``) or ``{name: <key>, <kwarg>: ...}``, the kwargs validated
against the plugin's ``Config`` dataclass; fields holding components carry ``metadata={"kind": <kind>}``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, Optional

__all__ = ["Component", "StageSpec", "DecodingConfig", "MethodConfig", "EvalConfig", "TrackingConfig",
           "RequiresConfig", "RunConfig", "component"]


@dataclass
class Component:
    """A plugin reference: registry key (or import path) plus validated keyword arguments."""

    name: str
    options: dict[str, Any] = field(default_factory=dict)
    kind: str = ""

    def plugin_class(self) -> type:
        from specmoe.registry import registry_for

        return registry_for(self.kind).get(self.name)

    def build(self, **overrides: Any) -> Any:
        """Instantiate the plugin with its typed ``Config``."""
        cls = self.plugin_class()
        return cls(cls.Config(**{**self.options, **overrides}))

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, **self.options}


def component(kind: str, default: str | None = None, optional: bool = False, *,
              options: dict[str, Any] | None = None, name_default: str | None = None,
              registry_default: bool = False) -> Any:
    """Dataclass field holding a component of ``kind``: ``default`` registry key (with ``options``), else required
    unless ``optional`` (``None``); ``name_default``: key assumed when a mapping omits ``name``; ``registry_default``:
    default to the kind's default plugin (``Registry.default``), looked up when the field is filled."""
    md: dict[str, Any] = {"kind": kind}
    if name_default is not None:
        md["name_default"] = name_default
    if registry_default:
        def from_registry() -> Component:
            from specmoe.registry import registry_for

            return Component(registry_for(kind).default(), dict(options or {}), kind)
        return field(default_factory=from_registry, metadata=md)
    if default is not None:
        return field(default_factory=lambda: Component(default, dict(options or {}), kind), metadata=md)
    if optional:
        return field(default=None, metadata=md)
    return field(metadata=md)


@dataclass
class StageSpec:
    """A recipe stage ``{id: <id>, name: <stage key>, <kwargs>}``; others refer to it as ``"stage:<id>"``."""

    id: str
    component: Component


@dataclass
class DecodingConfig:
    """Speculative decoding settings (paper defaults: 3 steps, top-2, gamma = 4, batch 1)."""

    budget: int = 4
    """gamma: tokens verified per step, root (bonus token) included."""
    steps: int = 3
    """draft levels (forward steps of the drafter)."""
    top_k: int = 2
    """branching factor of the draft tree."""
    max_new_tokens: int = 128
    stop_strings: list[str] = field(default_factory=list)
    """generation of a row stops at the first token where the decoded output contains one of these."""
    ignore_eos: bool = False

    #: keys of earlier versions, with what replaces them (reported by validation)
    removed_keys: ClassVar[dict[str, str]] = {
        "temperature": "set the temperatures of the evaluation grid with eval.temperatures: [0.0, 1.0]",
        "batch_size": "set the batch sizes of the evaluation grid with eval.batch_sizes: [1, 4]",
    }


@dataclass
class MethodConfig:
    """A named decoding method: drafter + predictor + selector (+ verifier). No drafter = autoregressive; no
    selector / verifier: the registry's default one (:meth:`specmoe.registry.Registry.default`)."""

    name: str
    drafter: Optional[Component] = component("drafter", optional=True)
    selector: Component = component("selector", registry_default=True)
    predictor: Optional[Component] = component("predictor", optional=True)
    verifier: Component = component("verifier", registry_default=True)
    analysis_only: bool = False
    """results are for analysis (e.g. oracle expert sets) and never reported as a real speedup."""
    budgets: Optional[list[int]] = None
    """gamma values of this method (e.g. an adaptive selector's gamma_max alone); default: ``eval.budgets``."""


@dataclass
class EvalConfig:
    """The evaluation grid: methods x datasets x temperatures x budgets x batch sizes."""

    temperatures: list[float] = field(default_factory=lambda: [0.0])
    budgets: list[int] = field(default_factory=list)
    """gamma values; empty = [decoding.budget]."""
    batch_sizes: list[int] = field(default_factory=lambda: [1])
    warmup: int = 1
    """untimed warm-up generations of a batch of the cell's size before each timed method."""
    repeats: int = 1
    """timed generations of every prompt batch per member (>= 1); a member's batch counts its fastest."""
    seed: int = 0
    prompts_for_margin: Optional[float] = None
    """grow each evaluation group's prompts (same-seed draws) until every method's speedup over AR has a 95 %
    interval of half-width <= this (0.02: ±2 %), or ``max_prompts``; null: the dataset's prompts as listed."""
    max_prompts: int = 128
    """the cap of ``prompts_for_margin``: prompts per group at most."""


@dataclass
class TrackingConfig:
    """Experiment tracking (MLflow)."""

    enabled: bool = True
    uri: Optional[str] = None
    """tracking URI; default: $MLFLOW_TRACKING_URI, else sqlite ``mlflow.db`` in the working directory."""
    experiment: Optional[str] = None
    """experiment name; default: the recipe name."""
    artifact_location: Optional[str] = None


@dataclass
class RequiresConfig:
    """Resources a recipe needs; checked before any work starts."""

    cuda_devices: int = 0
    gpu_memory_gb: float = 0.0


@dataclass
class RunConfig:
    """A whole recipe."""

    name: str
    description: str = ""
    """free text, shown as the MLflow description of the recipe's runs."""
    imports: list[str] = field(default_factory=list)
    """modules or ``.py`` files imported before plugins are resolved (ad-hoc ``@register`` code)."""
    variables: dict[str, Any] = field(default_factory=dict)
    """free-form values for ``${variables.x}`` interpolation."""
    output_dir: str = "runs"
    cache_dir: str = ".specmoe_cache"
    data_dir: Optional[str] = None
    """benchmark data directory (layout of ../shared/data); default: $SPECMOE_DATA_DIR."""
    requires: RequiresConfig = field(default_factory=RequiresConfig)
    stages: list[StageSpec] = field(default_factory=list)
    target: Optional[Component] = component("target", optional=True)
    datasets: list[Component] = field(default_factory=list, metadata={"kind": "dataset"})
    methods: list[MethodConfig] = field(default_factory=list)
    decoding: DecodingConfig = field(default_factory=DecodingConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    tracking: TrackingConfig = field(default_factory=TrackingConfig)
    source: str = field(default="", metadata={"internal": True})
    """the recipe file this configuration was loaded from (set by the loader, not written in recipes)."""
    overrides: list[str] = field(default_factory=list, metadata={"internal": True})
    """the command-line overrides applied to it (set by the loader, not written in recipes)."""

    removed_keys: ClassVar[dict[str, str]] = {
        "seed": "seeds live where they act: eval.seed (decoding), each stage's and dataset's own seed",
    }
