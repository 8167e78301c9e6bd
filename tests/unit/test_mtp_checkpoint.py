# SPDX-License-Identifier: Apache-2.0
"""MTP weights: a tiny DeepSeek-V3 checkpoint whose safetensors carry ``model.layers.{N}.*`` (written here in
the released layout: per-expert weights, a second shard listed in ``model.safetensors.index.json``) loads
into the ``mtp`` drafter and computes what the architecture's own decoder layer computes; FP8 weights are
dequantized; incomplete or absent MTP weights give errors that name the keys / the fix; trained-head exports
round-trip."""

from __future__ import annotations

import copy
import json

import pytest
import torch

from specmoe.errors import UserError
from specmoe.interfaces.kv import additive_mask
from specmoe.models.tiny import build_tiny_model
from specmoe.registry import drafters, targets
from specmoe_plugins.drafters.mtp.checkpoint import dequantize_fp8, export_head, load_head, read_mtp_tensors
from specmoe_plugins.drafters.mtp.model import MTPSpec, build_head

H = 64


def _split_experts(sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """transformers' fused expert tensors -> the released per-expert layout."""
    out = {}
    for k, v in sd.items():
        if k.endswith("experts.gate_up_proj"):
            base, inter = k[: -len(".gate_up_proj")], v.shape[1] // 2
            for e in range(v.shape[0]):
                out[f"{base}.{e}.gate_proj.weight"] = v[e, :inter].clone()
                out[f"{base}.{e}.up_proj.weight"] = v[e, inter:].clone()
        elif k.endswith("experts.down_proj"):
            base = k[: -len(".down_proj")]
            for e in range(v.shape[0]):
                out[f"{base}.{e}.down_proj.weight"] = v[e].clone()
        else:
            out[k] = v
    return out


@pytest.fixture(scope="module")
def ds_ckpt(tmp_path_factory):
    """Tiny DeepSeek-V3 checkpoint + MTP layer in a second shard; returns (dir, reference modules)."""
    from safetensors.torch import save_file
    from transformers.models.deepseek_v3 import modeling_deepseek_v3 as mds

    torch.manual_seed(0)
    root = tmp_path_factory.mktemp("ds_mtp")
    path = build_tiny_model("deepseek_v3", root / "ckpt", seed=0)
    cfg = json.loads((path / "config.json").read_text())
    n = cfg["num_hidden_layers"]
    assert cfg["num_nextn_predict_layers"] == 1
    hf_cfg = targets.get("hf")(path=str(path)).model.config
    lcfg = copy.deepcopy(hf_cfg)
    lcfg.first_k_dense_replace = 0  # the MTP block of DeepSeek-V3 is an MoE layer
    layer = mds.DeepseekV3DecoderLayer(lcfg, 0)
    for name, p in layer.named_parameters():
        torch.nn.init.normal_(p, std=0.3 if p.dim() > 1 else 0.1)
        if "norm" in name:
            p.data += 1.0
    layer.mlp.gate.e_score_correction_bias.normal_(std=0.1)
    ref = {"layer": layer.eval(),
           "enorm": torch.rand(H) + 0.5, "hnorm": torch.rand(H) + 0.5, "eh_proj": torch.randn(H, 2 * H) * 0.1,
           "sh_norm": torch.rand(H) + 0.5, "sh_head": torch.randn(256, H) * 0.2}
    from safetensors import safe_open

    with safe_open(str(path / "model.safetensors"), framework="pt") as sf:
        embed = sf.get_tensor("model.embed_tokens.weight")
    p = f"model.layers.{n}."
    mtp = {p + k: v.detach().clone() for k, v in _split_experts(layer.state_dict()).items()}
    mtp.update({p + "enorm.weight": ref["enorm"], p + "hnorm.weight": ref["hnorm"],
                p + "eh_proj.weight": ref["eh_proj"], p + "shared_head.norm.weight": ref["sh_norm"],
                p + "shared_head.head.weight": ref["sh_head"], p + "embed_tokens.weight": embed.clone()})
    # shard layout: the base weights in shard 1, the MTP layer in shard 2, both listed in the index
    base = path / "model.safetensors"
    shard1, shard2 = "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"
    base.rename(path / shard1)
    save_file(mtp, str(path / shard2), metadata={"format": "pt"})
    with safe_open(str(path / shard1), framework="pt") as sf:
        weight_map = {k: shard1 for k in sf.keys()}
    weight_map.update({k: shard2 for k in mtp})
    (path / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return path, ref, mtp


def _reference(target, ref, ids, hidden, pos):
    """The MTP step computed with the architecture's own ``DeepseekV3DecoderLayer.forward``."""
    m = target.model
    e = m.get_input_embeddings()(ids) * (pos != 0)[..., None]
    rms = lambda x, w: w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6))  # noqa: E731
    x = torch.cat([rms(e, ref["enorm"]), rms(hidden, ref["hnorm"])], dim=-1) @ ref["eh_proj"].T
    n = ids.shape[1]
    mask = additive_mask(torch.ones(n, n, dtype=torch.bool).tril()[None, None], torch.float32)
    y = ref["layer"](x, attention_mask=mask, position_ids=pos, position_embeddings=m.model.rotary_emb(x, pos))
    return rms(y, ref["sh_norm"]) @ ref["sh_head"].T


def test_from_pretrained_ignores_mtp_layer_and_loader_finds_it(ds_ckpt):
    path, ref, mtp = ds_ckpt
    target = targets.get("hf")(path=str(path))
    assert len(target.model.model.layers) == 3  # the extra layer is not part of the main model
    drafter = drafters.get("mtp")()  # default path: the target's own checkpoint
    drafter.setup(target)
    head = drafter.head
    assert head.spec.mlp == "moe" and head.spec.own_norm and head.spec.own_head
    assert not head.spec.own_embed, "an embed_tokens copy equal to the target's is shared, not duplicated"
    torch.testing.assert_close(head.block.mlp.experts.gate_up_proj, ref["layer"].mlp.experts.gate_up_proj)
    g = torch.Generator().manual_seed(5)
    ids = torch.randint(0, 256, (2, 7), generator=g)
    hidden = torch.randn(2, 7, H, generator=g)
    pos = torch.arange(7).expand(2, 7)
    causal = torch.ones(7, 7, dtype=torch.bool).tril()[None, None].expand(2, 1, 7, 7)
    mask = additive_mask(causal, torch.float32)
    with torch.no_grad():
        got = head.logits(head(ids, hidden, pos, mask))
        want = _reference(target, ref, ids, hidden, pos)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def test_single_file_and_layer_index(ds_ckpt, tmp_path):
    path, ref, mtp = ds_ckpt
    from safetensors.torch import save_file

    target = targets.get("hf")(path=str(path))
    # the same layer stored at another index of a single-file checkpoint, selected with layer_index
    (tmp_path / "config.json").write_text((path / "config.json").read_text())
    moved = {k.replace("layers.3.", "layers.7."): v for k, v in mtp.items()}
    save_file(moved, str(tmp_path / "model.safetensors"))
    with pytest.raises(UserError, match=r"no MTP weights.*model\.layers\.3\..*train_mtp"):
        load_head(target.parts(), tmp_path, device="cpu", dtype=torch.float32)
    head = load_head(target.parts(), tmp_path, device="cpu", dtype=torch.float32, layer_index=7)
    torch.testing.assert_close(head.eh_proj.weight, ref["eh_proj"])


def test_missing_keys_are_listed(ds_ckpt, tmp_path):
    path, _, mtp = ds_ckpt
    from safetensors.torch import save_file

    target = targets.get("hf")(path=str(path))
    (tmp_path / "config.json").write_text((path / "config.json").read_text())
    drop = ["model.layers.3.hnorm.weight", "model.layers.3.self_attn.kv_b_proj.weight"]
    save_file({k: v for k, v in mtp.items() if k not in drop}, str(tmp_path / "model.safetensors"))
    msg = r"missing 2 tensor\(s\): hnorm\.weight, self_attn\.kv_b_proj\.weight"
    with pytest.raises(UserError, match=msg):
        load_head(target.parts(), tmp_path, device="cpu", dtype=torch.float32)


def test_fp8_block_weights_are_dequantized(ds_ckpt, tmp_path):
    path, ref, mtp = ds_ckpt
    from safetensors.torch import save_file

    target = targets.get("hf")(path=str(path))
    conf = json.loads((path / "config.json").read_text())
    conf["quantization_config"] = {"quant_method": "fp8", "weight_block_size": [32, 32]}
    (tmp_path / "config.json").write_text(json.dumps(conf))
    w = ref["eh_proj"]  # [64, 128] -> scale [2, 4]
    scale = w.reshape(2, 32, 4, 32).abs().amax(dim=(1, 3)) / 448.0
    q = (w / scale.repeat_interleave(32, 0).repeat_interleave(32, 1)).to(torch.float8_e4m3fn)
    tensors = dict(mtp)
    tensors["model.layers.3.eh_proj.weight"] = q
    tensors["model.layers.3.eh_proj.weight_scale_inv"] = scale
    save_file(tensors, str(tmp_path / "model.safetensors"))
    got = read_mtp_tensors(tmp_path, 3, quant_block=(32, 32))["eh_proj.weight"]
    assert "eh_proj.weight_scale_inv" not in read_mtp_tensors(tmp_path, 3)
    torch.testing.assert_close(got, dequantize_fp8(q, scale, (32, 32)))
    assert float((got - w).abs().max()) < 0.07 * float(w.abs().max())  # e4m3 rounding only
    head = load_head(target.parts(), tmp_path, device="cpu", dtype=torch.float32)
    torch.testing.assert_close(head.eh_proj.weight, got)


def test_bf16_moe_head_runs(ds_ckpt):
    path, _, _ = ds_ckpt
    target = targets.get("hf")(path=str(path))
    head = load_head(target.parts(), path, device="cpu", dtype=torch.bfloat16)
    assert head.block.mlp.gate.weight.dtype == torch.float32  # kept in fp32 like transformers does
    assert head.eh_proj.weight.dtype == torch.bfloat16
    target.model.to(torch.bfloat16)
    ids = torch.randint(0, 256, (1, 5))
    mask = additive_mask(torch.ones(5, 5, dtype=torch.bool).tril()[None, None], torch.bfloat16)
    with torch.no_grad():
        out = head.logits(head(ids, torch.randn(1, 5, H), torch.arange(5)[None], mask))
    assert out.shape == (1, 5, 256) and bool(torch.isfinite(out.float()).all())


def test_target_without_mtp_weights_errors(make_target, tmp_path):
    target = make_target("qwen3_moe")
    with pytest.raises(UserError, match=r"no MTP weights.*train_mtp.*'path'"):
        drafters.get("mtp")().setup(target)
    other = make_target("gpt_oss")
    head = build_head(other.parts(), MTPSpec(), device="cpu", dtype=torch.float32)
    export_head(head, other.parts(), tmp_path)
    with pytest.raises(UserError, match="another model.*model_type"):
        drafters.get("mtp")(path=str(tmp_path)).setup(target)


@pytest.mark.parametrize("mlp", ["dense", "moe"])
def test_trained_head_export_roundtrip(make_target, tmp_path, arch, mlp):
    target = make_target(arch)
    torch.manual_seed(1)
    head = build_head(target.parts(), MTPSpec(mlp=mlp, recurse="block"), device="cpu",
                      dtype=torch.float32)
    out = export_head(head, target.parts(), tmp_path)
    conf = json.loads((out / "config.json").read_text())
    assert conf["specmoe_mtp"]["mlp"] == mlp and conf["num_nextn_predict_layers"] == 1
    n = target.num_hidden_layers
    from safetensors import safe_open

    with safe_open(str(out / "model.safetensors"), framework="pt") as sf:
        keys = set(sf.keys())
    assert {f"model.layers.{n}.{k}" for k in ("enorm.weight", "hnorm.weight", "eh_proj.weight",
                                               "shared_head.norm.weight")} <= keys
    assert all(k.startswith(f"model.layers.{n}.") for k in keys)
    drafter = drafters.get("mtp")(path=str(out))
    drafter.setup(target)
    assert drafter.head.spec == head.spec
    for k, v in head.checkpoint_state().items():
        torch.testing.assert_close(drafter.head.checkpoint_state()[k], v, msg=k)
