# SPDX-License-Identifier: Apache-2.0
"""EAGLE-3 checkpoint format: the released layout loads and saves unchanged, spelling variants load, broken
checkpoints fail with the offending keys listed, the d2t / t2d maps are consistent, aux layer ids are the
serving engines' distinct hidden-state boundaries, and old exports (repeated output-of-layer ids) read as
trained and rewrite to the same function."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from specmoe.errors import UserError
from specmoe_plugins.drafters.eagle3.checkpoint import load_eagle3, main, rewrite_eagle3, save_eagle3
from specmoe_plugins.drafters.eagle3.model import Eagle3Config, capture_indices, default_aux_layer_ids
from specmoe_plugins.drafters.eagle3.vocab_map import build_vocab_map, check_vocab_map, token_counts

V, VD, H, HEADS, KV, HD, FF = 96, 40, 32, 4, 2, 16, 48


def released_config() -> dict:
    """The lmsys/SpecForge gpt-oss EAGLE-3 config.json, field for field, with tiny sizes."""
    return {"architectures": ["LlamaForCausalLMEagle3"],
            "eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 17, 33]},
            "head_dim": HD, "hidden_act": "silu", "hidden_size": H, "initializer_range": 0.02,
            "intermediate_size": FF, "eos_token_id": 90, "max_position_embeddings": 131072,
            "model_type": "llama", "num_attention_heads": HEADS, "num_key_value_heads": KV,
            "num_hidden_layers": 1, "pad_token_id": 89, "rms_norm_eps": 1e-05, "rope_theta": 150000,
            "tie_word_embeddings": False, "torch_dtype": "float32",
            "transformers_version": "4.52.3", "use_cache": True, "vocab_size": V, "draft_vocab_size": VD}


def released_weights(seed: int = 0) -> dict[str, torch.Tensor]:
    """Tensors under the released names (written independently of our module's own naming)."""
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g) * 0.1
    counts = torch.randint(0, 50, (V,), generator=g)
    d2t, t2d = build_vocab_map(counts, VD)
    return {"fc.weight": r(H, 3 * H), "midlayer.hidden_norm.weight": 1 + r(H),
            "midlayer.input_layernorm.weight": 1 + r(H), "midlayer.post_attention_layernorm.weight": 1 + r(H),
            "midlayer.self_attn.q_proj.weight": r(HEADS * HD, 2 * H),
            "midlayer.self_attn.k_proj.weight": r(KV * HD, 2 * H),
            "midlayer.self_attn.v_proj.weight": r(KV * HD, 2 * H),
            "midlayer.self_attn.o_proj.weight": r(H, HEADS * HD),
            "midlayer.mlp.gate_proj.weight": r(FF, H), "midlayer.mlp.up_proj.weight": r(FF, H),
            "midlayer.mlp.down_proj.weight": r(H, FF), "norm.weight": 1 + r(H), "lm_head.weight": r(VD, H),
            "d2t": d2t, "t2d": t2d}


def write_ckpt(path, cfg: dict, weights: dict) -> None:
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(cfg, indent=2))
    save_file(weights, str(path / "model.safetensors"), metadata={"format": "pt"})


@pytest.fixture
def embed():
    return torch.randn(V, H, generator=torch.Generator().manual_seed(7))


def test_released_layout_round_trip(tmp_path, embed):
    cfg, w = released_config(), released_weights()
    write_ckpt(tmp_path / "src", cfg, w)
    model = load_eagle3(str(tmp_path / "src"), embed=embed)
    assert model.config.aux_layer_ids == [1, 17, 33]
    assert torch.equal(model.embed_tokens.weight, embed)  # absent from the checkpoint: taken from the target
    save_eagle3(model, tmp_path / "out")
    assert json.loads((tmp_path / "out" / "config.json").read_text()) == cfg
    back = load_file(str(tmp_path / "out" / "model.safetensors"))
    assert set(back) == set(w)  # exactly the released names; embed_tokens not written by default
    for k, t in w.items():
        assert back[k].dtype == t.dtype and torch.equal(back[k], t), k
    again = load_eagle3(str(tmp_path / "out"), embed=embed)
    for (k, a), b in zip(model.state_dict().items(), again.state_dict().values()):
        assert torch.equal(a, b), k


def test_qwen_style_config_and_embed_tokens(tmp_path, embed):
    cfg = {**released_config(), "eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 46, 90],
                                                  "use_aux_hidden_state": True},
           "rope_scaling": None, "rope_theta": 1000000.0, "attention_bias": False, "bos_token_id": 1}
    w = {**released_weights(1), "embed_tokens.weight": torch.randn(V, H)}
    write_ckpt(tmp_path / "src", cfg, w)
    model = load_eagle3(str(tmp_path / "src"))  # embed_tokens from the checkpoint: no target needed
    assert torch.equal(model.embed_tokens.weight, w["embed_tokens.weight"])
    save_eagle3(model, tmp_path / "out", save_embed_tokens=True)
    assert json.loads((tmp_path / "out" / "config.json").read_text()) == cfg
    assert set(load_file(str(tmp_path / "out" / "model.safetensors"))) == set(w)


def test_vllm_spelling_loads_and_rebuilds_t2d(tmp_path, embed):
    w = released_weights(2)
    vllm = {("model." + k.replace("midlayer.", "layers.0.")) if k.startswith("midlayer.") else k: t
            for k, t in w.items() if k != "t2d"}
    vllm["draft_id_to_target_id"] = vllm.pop("d2t")
    write_ckpt(tmp_path / "v", released_config(), vllm)
    model = load_eagle3(str(tmp_path / "v"), embed=embed)
    sd = model.state_dict()
    for k, t in w.items():
        assert torch.equal(sd[k], t), k


def test_partial_checkpoint_lists_missing_and_unexpected_keys(tmp_path, embed):
    w = released_weights()
    del w["fc.weight"], w["midlayer.mlp.up_proj.weight"]
    w["midlayer.self_attn.qkv_proj.weight"] = torch.zeros(3, 3)
    write_ckpt(tmp_path / "bad", released_config(), w)
    with pytest.raises(UserError) as err:
        load_eagle3(str(tmp_path / "bad"), embed=embed)
    msg = str(err.value)
    assert "missing keys" in msg and "fc.weight" in msg and "midlayer.mlp.up_proj.weight" in msg
    assert "unexpected keys" in msg and "midlayer.self_attn.qkv_proj.weight" in msg


def test_shape_mismatch_and_missing_embedding_are_errors(tmp_path, embed):
    write_ckpt(tmp_path / "a", {**released_config(), "intermediate_size": FF + 8}, released_weights())
    with pytest.raises(UserError, match="mlp.gate_proj.weight"):
        load_eagle3(str(tmp_path / "a"), embed=embed)
    write_ckpt(tmp_path / "b", released_config(), released_weights())
    with pytest.raises(UserError, match="embed_tokens"):
        load_eagle3(str(tmp_path / "b"))
    with pytest.raises(UserError, match="does not exist"):
        load_eagle3(str(tmp_path / "nowhere"))


def test_inconsistent_vocab_map_is_rejected(tmp_path, embed):
    w = released_weights()
    w["t2d"] = w["t2d"].clone()
    w["t2d"][w["t2d"].nonzero()[0]] = False  # drop one draft token from t2d only
    write_ckpt(tmp_path / "c", released_config(), w)
    with pytest.raises(UserError, match="d2t and t2d disagree"):
        load_eagle3(str(tmp_path / "c"), embed=embed)


def test_vocab_map_offsets_from_frequencies():
    seqs = [[5, 5, 5, 9, 9, 2], [9, 7, 7, 7, 7], [3]]
    counts = token_counts(seqs, 12)
    d2t, t2d = build_vocab_map(counts, 4)
    # most frequent: 7 (4), 9 (3), 5 (3), then 2 and 3 tie (1) -> the lower id 2; sorted ascending
    assert torch.equal(t2d.nonzero().squeeze(1), torch.tensor([2, 5, 7, 9]))
    assert torch.equal(t2d.nonzero().squeeze(1), d2t + torch.arange(4))  # the SpecForge consistency check
    assert torch.equal(d2t, torch.tensor([2, 4, 5, 6]))
    check_vocab_map(d2t, t2d)
    # fewer distinct tokens than the draft vocabulary: filled with the lowest unseen ids
    d2t, t2d = build_vocab_map(token_counts([[8, 8, 11]], 12), 5)
    assert t2d.nonzero().squeeze(1).tolist() == [0, 1, 2, 8, 11]
    with pytest.raises(ValueError):
        check_vocab_map(d2t + 1, t2d)
    with pytest.raises(ValueError):
        token_counts([[12]], 12)


def test_draft_ids_map_to_target_ids(tmp_path, embed):
    w = released_weights(3)
    write_ckpt(tmp_path / "m", released_config(), w)
    model = load_eagle3(str(tmp_path / "m"), embed=embed)
    used = w["t2d"].nonzero().squeeze(1)
    assert torch.equal(model.to_target(torch.arange(VD)), used)
    t2d_index = model.target_to_draft()
    assert torch.equal(t2d_index[used], torch.arange(VD))
    assert bool((t2d_index[~w["t2d"]] == -1).all())


def test_capture_layers_follow_the_serving_engines():
    """Ids are hidden-state boundaries, captured as they are (vLLM's ``aux_hidden_state_layers``)."""
    assert capture_indices([1, 17, 33], 36) == [1, 17, 33]  # lmsys gpt-oss-120b draft, as vLLM reads it
    assert capture_indices([1, 46, 90], 94) == [1, 46, 90]  # lmsys Qwen3-235B draft
    assert capture_indices(None, 36) == [2, 18, 33]  # the engines' default [2, L//2, L-3]
    assert capture_indices([33, 1, 17], 36) == [1, 17, 33]  # concatenated in layer order
    with pytest.raises(UserError, match=r"\[1, 17, 33\]: \[17, 33\] outside 0..4"):
        capture_indices([1, 17, 33], 4)
    cfg = Eagle3Config.from_dict(released_config())
    assert cfg.fused_size == 3 * H and cfg.head_dim == HD
    two = Eagle3Config.from_dict({**released_config(), "eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 2]}})
    assert two.fused_size == 2 * H  # vLLM sizes fc by the number of ids


@pytest.mark.parametrize("layers", list(range(1, 41)) + [61, 94])
def test_default_aux_layers_are_distinct_inner_boundaries(layers):
    ids = default_aux_layer_ids(layers)
    assert len(set(ids)) == len(ids) == min(3, layers), ids
    assert ids == sorted(ids) and all(0 <= i < layers for i in ids), ids  # never L (normed in transformers)
    if layers >= 7:
        assert ids == [2, layers // 2, layers - 3]
    if layers >= 4:
        assert ids[0] >= 1  # the embeddings only where fewer than three inner boundaries exist


def test_init_and_export_of_a_four_layer_target_write_distinct_ids(make_target, tmp_path):
    """The demo's 4-layer GPT-OSS target: three distinct boundaries [1, 2, 3] (not the [0, 1, 1] of before),
    an fc of three chunks, and the drafter captures exactly those hidden states."""
    from specmoe.registry import drafters
    from specmoe_plugins.drafters.eagle3.drafter import init_config
    from specmoe_plugins.drafters.eagle3.model import Eagle3Model

    target = make_target("gpt_oss")
    assert target.num_hidden_layers == 4
    cfg = init_config(target)
    assert cfg.aux_layer_ids == [1, 2, 3] and cfg.fused_size == 3 * target.hidden_size
    save_eagle3(Eagle3Model(cfg), tmp_path / "d")
    written = json.loads((tmp_path / "d" / "config.json").read_text())
    assert written["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [1, 2, 3]
    drafter = drafters.get("eagle3")(path=str(tmp_path / "d"))
    drafter.setup(target)
    assert drafter.feature_layers == [1, 2, 3]


def _legacy_export(path, fc: torch.Tensor, ids: list[int], summary: dict | None = None, seed: int = 0):
    """A draft as specmoe exported it before: SGLang-style output-of-layer ids, one fc chunk per id."""
    cfg = {**released_config(), "eagle_config": {"eagle_aux_hidden_state_layer_ids": ids}}
    write_ckpt(path, cfg, {**released_weights(seed), "fc.weight": fc})
    if summary is not None:
        (path / "summary.json").write_text(json.dumps(summary))


def _hidden_states(n: int, seed: int = 5) -> list[torch.Tensor]:
    """Stand-ins for the target's ``hidden_states[0..n]`` at a few positions."""
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(2, 7, H, generator=g) for _ in range(n + 1)]


def test_legacy_export_with_repeated_ids_reads_as_trained_and_rewrites_to_the_same_function(tmp_path, embed):
    """The old 4-layer export ([0, 1, 1], fc of 3 chunks): read as boundaries [1, 2, 2] (the same numbers as
    before: fc sees hidden_states 1, 2, 2), rewritten as [1, 2] with the twin blocks summed (the same function
    up to rounding), loadable and unchanged by a second rewrite."""
    g = torch.Generator().manual_seed(11)
    fc = torch.randn(H, 3 * H, generator=g) * 0.1
    _legacy_export(tmp_path / "old", fc, [0, 1, 1])
    hs = _hidden_states(4)
    old = load_eagle3(str(tmp_path / "old"), embed=embed)
    assert old.config.aux_layer_ids == [1, 2, 2]
    layers = capture_indices(old.config.aux_layer_ids, 4)
    assert layers == [1, 2, 2]
    with torch.no_grad():
        before = torch.nn.functional.linear(torch.cat([hs[1], hs[2], hs[2]], -1), fc)  # what old code computed
        assert torch.equal(old.project(torch.cat([hs[i] for i in layers], -1)), before)

    assert main([str(tmp_path / "old"), str(tmp_path / "new")]) == 0
    cfg = json.loads((tmp_path / "new" / "config.json").read_text())
    assert cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [1, 2]
    new = load_eagle3(str(tmp_path / "new"), embed=embed)
    assert new.config.aux_layer_ids == [1, 2] and tuple(new.fc.weight.shape) == (H, 2 * H)
    with torch.no_grad():
        after = new.project(torch.cat([hs[i] for i in capture_indices([1, 2], 4)], -1))
    torch.testing.assert_close(after, before, rtol=1e-5, atol=1e-5)
    sd_old, sd_new = old.state_dict(), new.state_dict()
    assert all(torch.equal(sd_old[k], sd_new[k]) for k in sd_old if k != "fc.weight")  # only fc changed

    rewrite_eagle3(tmp_path / "new")  # in place: already in the serving convention, nothing moves
    again = load_file(str(tmp_path / "new" / "model.safetensors"))
    assert torch.equal(again["fc.weight"], new.fc.weight)
    assert json.loads((tmp_path / "new" / "config.json").read_text()) == cfg


def test_saving_a_legacy_draft_folds_it(tmp_path, embed):
    """A draft loaded from an old export (e.g. ``init_from`` of a training stage) is saved servable."""
    _legacy_export(tmp_path / "old", torch.randn(H, 3 * H, generator=torch.Generator().manual_seed(2)), [0, 1, 1])
    old = load_eagle3(str(tmp_path / "old"), embed=embed)
    save_eagle3(old, tmp_path / "saved")
    assert json.loads((tmp_path / "saved" / "config.json").read_text())["eagle_config"] == {
        "eagle_aux_hidden_state_layer_ids": [1, 2]}
    assert tuple(load_file(str(tmp_path / "saved" / "model.safetensors"))["fc.weight"].shape) == (H, 2 * H)


def test_legacy_ids_recognised_from_the_stage_summary(tmp_path, embed):
    """Distinct old-style ids are told apart by the training stage's summary.json (feature_layers = ids + 1);
    without it they read as boundaries (as vLLM would), and the flag forces either reading."""
    fc = torch.randn(H, 3 * H, generator=torch.Generator().manual_seed(3))
    _legacy_export(tmp_path / "stage", fc, [0, 1, 2], summary={"steps": 10, "feature_layers": [1, 2, 3]})
    _legacy_export(tmp_path / "bare", fc, [0, 1, 2])
    _legacy_export(tmp_path / "fresh", fc, [1, 2, 3], summary={"feature_layers": [1, 2, 3]})
    assert load_eagle3(str(tmp_path / "stage"), embed=embed).config.aux_layer_ids == [1, 2, 3]
    assert load_eagle3(str(tmp_path / "bare"), embed=embed).config.aux_layer_ids == [0, 1, 2]
    assert load_eagle3(str(tmp_path / "fresh"), embed=embed).config.aux_layer_ids == [1, 2, 3]
    out = rewrite_eagle3(tmp_path / "bare", tmp_path / "bare_fixed", legacy=True)
    assert json.loads((out / "config.json").read_text())["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [
        1, 2, 3]
    assert torch.equal(load_file(str(out / "model.safetensors"))["fc.weight"], fc)  # distinct: fc unchanged


def test_rewrite_errors_are_one_clear_message(tmp_path, capsys):
    assert main([str(tmp_path / "nowhere")]) == 2
    assert "has no config.json" in capsys.readouterr().err
    _legacy_export(tmp_path / "bin", torch.zeros(H, 3 * H), [0, 1, 1])
    sd = load_file(str(tmp_path / "bin" / "model.safetensors"))
    (tmp_path / "bin" / "model.safetensors").unlink()
    torch.save(sd, tmp_path / "bin" / "pytorch_model.bin")
    assert main([str(tmp_path / "bin")]) == 2  # in place would leave the .bin beside the new weights
    assert "rewrite it into another directory" in capsys.readouterr().err
    assert main([str(tmp_path / "bin"), str(tmp_path / "bin_out")]) == 0


def test_draft_for_another_vocabulary_names_the_real_mismatch(tmp_path, embed):
    """A draft made for a larger vocabulary is reported as a vocabulary mismatch (file, key, fix), with or
    without its own embed_tokens, never as a hidden-size mismatch."""
    big = V + 64
    w = released_weights()
    w["d2t"], w["t2d"] = build_vocab_map(torch.arange(big), VD)
    write_ckpt(tmp_path / "big", {**released_config(), "vocab_size": big}, w)
    write_ckpt(tmp_path / "big_embed", {**released_config(), "vocab_size": big},
               {**w, "embed_tokens.weight": torch.zeros(big, H)})
    for name in ("big", "big_embed"):
        with pytest.raises(UserError) as err:
            load_eagle3(str(tmp_path / name), embed=embed)
        msg = str(err.value)
        assert f"{tmp_path / name}/config.json: vocab_size is {big}" in msg, msg
        assert f"target's vocabulary has {V} tokens" in msg and "train_eagle3" in msg
        assert "hidden" not in msg
    write_ckpt(tmp_path / "wide", {**released_config(), "target_hidden_size": 2 * H},
               {**released_weights(), "fc.weight": torch.zeros(H, 6 * H)})
    with pytest.raises(UserError, match=rf"wide/config.json: target_hidden_size is {2 * H} .* hidden size is {H}"):
        load_eagle3(str(tmp_path / "wide"), embed=embed)


def test_drafter_on_a_target_with_a_smaller_vocabulary(make_target, tmp_path):
    from specmoe.registry import drafters
    from specmoe_plugins.drafters.eagle3.drafter import init_config
    from specmoe_plugins.drafters.eagle3.model import Eagle3Model

    target = make_target("qwen3_moe")
    draft = Eagle3Model(init_config(target, vocab_size=target.vocab_size + 128, draft_vocab_size=64))
    save_eagle3(draft, tmp_path / "draft")  # the released layout: no embed_tokens
    drafter = drafters.get("eagle3")(path=str(tmp_path / "draft"))
    with pytest.raises(UserError, match=rf"draft/config.json: vocab_size is {target.vocab_size + 128} but the "
                                        rf"target's vocabulary has {target.vocab_size} tokens"):
        drafter.setup(target)


def test_inference_rotary_tables_match_the_training_rotation(tmp_path, embed):
    """A loaded draft's inference step (rotary tables computed once, ``specmoe.models.rope``) rotates queries and
    keys as its training step does (the model's own rotary module per call), at positions beyond the first table
    (it grows), so drafts are what the trained network proposes."""
    write_ckpt(tmp_path / "src", released_config(), released_weights())
    model = load_eagle3(str(tmp_path / "src"), embed=embed)
    g = torch.Generator().manual_seed(3)
    tokens, hidden = torch.randint(0, V, (2, 3), generator=g), torch.randn(2, 3, H, generator=g)
    for positions in (torch.tensor([[4, 5, 6], [0, 1, 2]]), torch.tensor([[300, 301, 302], [900, 901, 903]])):
        with torch.no_grad():
            fast = model.qkv(tokens, hidden, positions)
        with torch.enable_grad():
            ref = model.qkv(tokens, hidden, positions)
        for a, b in zip(fast, ref):
            assert torch.allclose(a, b.detach(), rtol=1e-5, atol=1e-6)
    assert model._rope_tables is not None and model._rope_tables.rotary is model.rotary  # the tables ran
