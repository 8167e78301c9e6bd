# SPDX-License-Identifier: Apache-2.0
"""Tree masks follow the attention type of every layer, as the config says (``config.layer_types``; Qwen3-MoE's
``use_sliding_window``): one tree pass gives the logits of running each path sequentially, and greedy
speculative decoding equals autoregressive decoding, for patterns beyond the default alternation. A GPT-OSS
config whose layers are all ``full_attention`` while ``sliding_window`` is set must get no window at all."""

from __future__ import annotations

import pytest
import torch
from fixtures.tiny import random_prompts

from specmoe.decoding.ar import ar_generate
from specmoe.decoding.engine import SpeculativeEngine
from specmoe.decoding.stopping import StopRule
from specmoe.interfaces.tree import DraftTree
from specmoe.models.hf_masks import MaskSpec
from specmoe.models.tiny import tiny_config
from specmoe.registry import drafters, predictors, selectors, targets

FULL, SLIDE = "full_attention", "sliding_attention"
#: name -> (arch, config overrides, mask kinds expected); tiny windows are 8 tokens
PATTERNS = {
    "gpt_oss/all_full": ("gpt_oss", {"layer_types": [FULL] * 4}, [FULL]),
    "gpt_oss/all_sliding": ("gpt_oss", {"layer_types": [SLIDE] * 4}, [SLIDE]),
    "gpt_oss/full_first": ("gpt_oss", {"layer_types": [FULL, SLIDE] * 2}, [FULL, SLIDE]),
    "gpt_oss/blocks": ("gpt_oss", {"layer_types": [SLIDE, SLIDE, FULL, FULL]}, [FULL, SLIDE]),
    "qwen3_moe/sliding": ("qwen3_moe", {"use_sliding_window": True, "sliding_window": 8}, [SLIDE]),
    "qwen3_moe/no_window": ("qwen3_moe", {"use_sliding_window": False, "sliding_window": 8}, [FULL]),
}


@pytest.fixture(scope="module")
def pattern_target(tmp_path_factory):
    root = tmp_path_factory.mktemp("layer_types")
    built = {}

    def get(name):
        if name not in built:
            arch, overrides, _ = PATTERNS[name]
            built[name] = targets.get("hf")(tiny={"arch": arch, "seed": 2, **overrides}, cache_dir=str(root))
        return built[name]

    return get


@pytest.mark.parametrize("name", list(PATTERNS))
def test_mask_kinds_follow_the_config(name):
    arch, overrides, kinds = PATTERNS[name]
    spec = MaskSpec(tiny_config(arch, **overrides))
    assert spec.kinds == kinds
    assert (spec.window is not None) == (SLIDE in kinds)


@pytest.mark.parametrize("name", list(PATTERNS))
def test_tree_logits_equal_sequential(pattern_target, name):
    torch.set_num_threads(1)
    target = pattern_target(name)
    prefix = random_prompts(1, [19], target.vocab_size, seed=3)[0]  # longer than the window of 8
    kv = target.new_kv(1)
    n = len(prefix)
    target.forward(torch.tensor([prefix]), kv, torch.arange(n)[None])
    tree = DraftTree.from_lists([5, 9, 11, 13, 17, 19], [-1, 0, 0, 1, 3, 2])
    out = target.forward(tree.tokens, kv, n + tree.depth, tree.ancestors(), tree.valid)
    for path in tree.paths(0):
        with torch.no_grad():
            ref = target.model(input_ids=torch.tensor([prefix + tree.tokens[0, path].tolist()])).logits[0, n:]
        assert torch.allclose(out.logits[0, path], ref.float(), atol=1e-4, rtol=1e-4), (name, path)


@pytest.mark.parametrize("name", list(PATTERNS))
def test_greedy_equals_ar(pattern_target, name):
    torch.set_num_threads(1)
    target = pattern_target(name)
    drafter = drafters.get("draft_model")(share_target=True)
    drafter.setup(target)
    pred = predictors.get("router_on_embedding")()
    pred.setup(target)
    prompts = random_prompts(3, [4, 17, 30], target.vocab_size, seed=6)
    stop = StopRule(20)
    refs = [ar_generate(target, [p], temperature=0, stop=stop).tokens[0] for p in prompts]
    multi = 0
    for sel_name in ("confidence", "ecospec"):
        engine = SpeculativeEngine(target, drafter, selectors.get(sel_name)(), pred)
        for p, ref in zip(prompts, refs):
            out = engine.generate([p], budget=4, steps=3, top_k=2, temperature=0, stop=stop)
            assert out.tokens[0] == ref, f"{name} {sel_name} prompt len {len(p)}"
            multi += sum(a > 1 for s in out.steps for a in s.accepted)
        assert engine.generate(prompts, budget=4, steps=3, top_k=2, temperature=0, stop=stop).tokens == refs
    assert multi > 0, "self-drafting must accept multi-token paths"
