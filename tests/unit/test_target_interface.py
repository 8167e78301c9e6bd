# SPDX-License-Identifier: Apache-2.0
"""The ``Target`` interface split (issue 24.5): the members every target must implement, and the optional
capabilities whose defaults a target without them gets (the expert byte accounting, the norms before the
routers). A target implementing only the required members decodes losslessly through the engine."""

from __future__ import annotations

import pytest
from fixtures.tiny import ARCHS, random_prompts

from specmoe.decoding.ar import ar_generate
from specmoe.decoding.engine import SpeculativeEngine
from specmoe.decoding.stopping import StopRule
from specmoe.interfaces.target import Target
from specmoe.registry import drafters, selectors

#: what a target must implement (everything else has a default)
REQUIRED = {"device", "dtype", "vocab_size", "num_hidden_layers", "hidden_size", "moe_layer_ids", "num_experts",
            "top_k", "to", "forward", "new_standard_cache", "forward_standard", "routers", "experts_modules",
            "embed", "experts_implementation", "set_experts_implementation"}


class RequiredOnly(Target):
    """Only the required members, each answered by a wrapped target."""

    def __init__(self, inner: Target) -> None:
        self.inner, self.tokenizer, self.path = inner, inner.tokenizer, inner.path

    device = property(lambda self: self.inner.device)
    dtype = property(lambda self: self.inner.dtype)
    vocab_size = property(lambda self: self.inner.vocab_size)
    num_hidden_layers = property(lambda self: self.inner.num_hidden_layers)
    hidden_size = property(lambda self: self.inner.hidden_size)
    moe_layer_ids = property(lambda self: self.inner.moe_layer_ids)
    num_experts = property(lambda self: self.inner.num_experts)
    top_k = property(lambda self: self.inner.top_k)
    experts_implementation = property(lambda self: self.inner.experts_implementation)

    def to(self, device):
        self.inner.to(device)

    def forward(self, *args, **kwargs):
        return self.inner.forward(*args, **kwargs)

    def new_standard_cache(self):
        return self.inner.new_standard_cache()

    def forward_standard(self, *args, **kwargs):
        return self.inner.forward_standard(*args, **kwargs)

    def routers(self):
        return self.inner.routers()

    def experts_modules(self):
        return self.inner.experts_modules()

    def embed(self, input_ids):
        return self.inner.embed(input_ids)

    def set_experts_implementation(self, name):
        self.inner.set_experts_implementation(name)


def test_a_target_must_implement_only_the_required_members():
    assert set(Target.__abstractmethods__) == REQUIRED
    assert set(RequiredOnly.__abstractmethods__) == set()


@pytest.mark.parametrize("arch", ["gpt_oss", "qwen3_moe"])
def test_the_optional_byte_accounting_defaults_to_the_experts_modules_parameters(make_target, arch):
    inner = make_target(arch)
    target = RequiredOnly(inner)
    # the tiny checkpoints store the experts as loaded: the default and the hf target's own accounting agree
    assert target.bytes_per_expert == inner.bytes_per_expert == inner.bytes_per_expert_stored > 0
    assert target.bytes_per_expert_stored == target.bytes_per_expert
    assert str(inner.dtype).removeprefix("torch.") in target.expert_storage
    with pytest.raises(NotImplementedError, match="RequiredOnly does not expose the norms before its routers"):
        target.router_inputs_norms()


@pytest.mark.parametrize("arch", ARCHS)
def test_a_target_with_only_the_required_members_decodes_as_ar(make_predictable, agreeing_drafts, arch):
    inner = make_predictable(arch)[0]
    target = RequiredOnly(inner)
    drafter = drafters.get("draft_model")(path=str(agreeing_drafts(arch, "draft_lm")))
    drafter.setup(target)
    prompts = random_prompts(3, [3, 10, 19], target.vocab_size, seed=7)
    stop = StopRule(14)
    refs = ar_generate(inner, prompts, temperature=0.0, stop=stop).tokens
    assert ar_generate(target, prompts, temperature=0.0, stop=stop).tokens == refs
    engine = SpeculativeEngine(target, drafter, selectors.get(selectors.default())(), None)
    out = engine.generate(prompts, budget=4, steps=3, top_k=2, temperature=0.0, stop=stop)
    assert out.tokens == refs
    accepted = [a for s in out.steps for a in s.accepted]
    assert sum(a >= 2 for a in accepted) >= 0.3 * len(accepted)  # drafts were accepted: the tree path ran
