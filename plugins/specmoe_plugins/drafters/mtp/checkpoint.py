# SPDX-License-Identifier: Apache-2.0
"""Reading and writing DeepSeek-V3 style MTP weights.

A DeepSeek-V3 checkpoint stores its multi-token-prediction module as one extra decoder layer after the last
one: ``model.layers.{N}.*`` with ``N = num_hidden_layers`` (``enorm``, ``hnorm``, ``eh_proj``,
``shared_head.{norm,head}``, ``embed_tokens`` and a full decoder block). ``from_pretrained`` ignores those
keys, so they are read here directly with ``safetensors.safe_open`` (single file or sharded through
``model.safetensors.index.json``). Heads trained by ``train_mtp`` are written in the same layout (a directory
with ``config.json`` + ``model.safetensors``), so one loader reads both.

Conversions done on read: FP8 block-quantized weights (``weight`` + ``weight_scale_inv``, DeepSeek-V3/V3.1
releases) are dequantized, and per-expert weights ``mlp.experts.{e}.{gate,up,down}_proj.weight`` are merged
into the fused ``mlp.experts.gate_up_proj [E, 2I, H]`` / ``down_proj [E, H, I]`` tensors of ``transformers``.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import torch

from specmoe.errors import UserError
from specmoe.utils.files import atomic_path

__all__ = ["MTP_SECTION", "hub_checkpoint", "read_config", "checkpoint_files", "mtp_keys", "read_mtp_tensors",
           "dequantize_fp8", "save_mtp_head", "default_layer_index", "load_head", "export_head"]

#: config.json section written by ``train_mtp`` describing a trained head (absent in DeepSeek checkpoints)
MTP_SECTION = "specmoe_mtp"
_EXPERT = re.compile(r"^(.*mlp\.experts)\.(\d+)\.(gate|up|down)_proj\.weight$")


def hub_checkpoint(repo_id: str, revision: str | None = None, local_files_only: bool = False) -> Path:
    """Local snapshot of a hub checkpoint: config, index and the shards that hold the MTP layer.

    ``from_pretrained`` of the target has usually fetched every shard already (the index lists the MTP
    layer's shard too), so this normally only resolves the cache; otherwise it downloads what is missing.
    """
    try:
        from huggingface_hub import hf_hub_download

        kw = dict(revision=revision, local_files_only=local_files_only)
        root = Path(hf_hub_download(repo_id, "config.json", **kw)).parent
        conf = json.loads((root / "config.json").read_text())
        prefix = f"model.layers.{default_layer_index(conf)}."
        try:
            index_file = hf_hub_download(repo_id, "model.safetensors.index.json", **kw)
            index = json.loads(Path(index_file).read_text())
            files = sorted({f for k, f in index.get("weight_map", {}).items() if k.startswith(prefix)})
        except Exception:  # noqa: BLE001 - single-file checkpoint
            files = ["model.safetensors"]
        for f in files:
            hf_hub_download(repo_id, f, **kw)
    except UserError:
        raise
    except Exception as exc:  # noqa: BLE001 - any hub/network error becomes one clear message
        raise UserError(f"MTP weights: '{repo_id}' is neither a local directory nor a reachable hub "
                        f"checkpoint ({type(exc).__name__}: {exc}); download it and point drafter 'path' at "
                        f"the directory") from exc
    return root


def read_config(path: str | Path) -> dict[str, Any]:
    """``config.json`` of a checkpoint or trained-head directory as a dict."""
    f = Path(path) / "config.json"
    if not f.is_file():
        raise UserError(f"MTP weights: '{path}' has no config.json; point drafter 'path' at a DeepSeek-V3 "
                        f"checkpoint directory or at the output directory of a train_mtp stage")
    return json.loads(f.read_text())


def default_layer_index(config: dict[str, Any]) -> int:
    """Index of the first MTP layer: ``num_hidden_layers`` (DeepSeek layout)."""
    if "num_hidden_layers" not in config:
        raise UserError("MTP weights: config.json has no 'num_hidden_layers'")
    return int(config["num_hidden_layers"])


def checkpoint_files(path: str | Path) -> dict[str, Path]:
    """Map every tensor key of a safetensors checkpoint directory to the file holding it."""
    from safetensors import safe_open

    root = Path(path)
    index = root / "model.safetensors.index.json"
    if index.is_file():
        weight_map = json.loads(index.read_text()).get("weight_map", {})
        return {k: root / v for k, v in weight_map.items()}
    out: dict[str, Path] = {}
    for f in sorted(root.glob("*.safetensors")):
        with safe_open(str(f), framework="pt") as sf:
            for k in sf.keys():
                out[k] = f
    return out


def mtp_keys(path: str | Path, layer_index: int) -> dict[str, Path]:
    """Checkpoint keys under ``model.layers.{layer_index}.`` -> file."""
    prefix = f"model.layers.{layer_index}."
    return {k: f for k, f in checkpoint_files(path).items() if k.startswith(prefix)}


def dequantize_fp8(weight: torch.Tensor, scale_inv: torch.Tensor, block: tuple[int, int]) -> torch.Tensor:
    """Block-wise FP8 dequantization: ``weight [O, I]`` times ``scale_inv [ceil(O/bo), ceil(I/bi)]``."""
    bo, bi = block
    o, i = weight.shape
    s = scale_inv.float().repeat_interleave(bo, dim=0)[:o].repeat_interleave(bi, dim=1)[:, :i]
    return weight.float() * s


class _Reader:
    """Reads single tensors of one MTP layer across shard files, dequantizing and casting each on read."""

    def __init__(self, keys: dict[str, Path], prefix: str, block: tuple[int, int], dtype: torch.dtype | None):
        from safetensors import safe_open

        self.prefix, self.block, self.dtype = prefix, block, dtype
        self.where = {k[len(prefix):]: f for k, f in keys.items()}
        self._open = {f: safe_open(str(f), framework="pt") for f in set(keys.values())}

    def names(self) -> list[str]:
        return [k for k in self.where if not k.endswith("weight_scale_inv")]

    def get(self, name: str) -> torch.Tensor:
        t = self._open[self.where[name]].get_tensor(self.prefix + name)
        scale_name = name + "_scale_inv"
        if name.endswith("weight") and scale_name in self.where:
            t = dequantize_fp8(t, self._open[self.where[scale_name]].get_tensor(self.prefix + scale_name),
                               self.block)
            if self.dtype is not None:
                t = t.to(self.dtype)
        return t


def read_mtp_tensors(path: str | Path, layer_index: int, quant_block: tuple[int, int] | None = None,
                     dtype: torch.dtype | None = None) -> dict[str, torch.Tensor]:
    """Read the MTP layer's tensors, keys relative to ``model.layers.{layer_index}.``.

    Tensors are read one at a time (FP8 ones dequantized to ``dtype``); per-expert weights are
    copied straight into the fused ``gate_up_proj [E, 2I, H]`` / ``down_proj [E, H, I]`` tensors, so the
    peak memory is about the size of the result (a DeepSeek-V3 MTP layer is ~11.5B parameters).

    Args:
        path: checkpoint or trained-head directory.
        layer_index: which extra layer (``num_hidden_layers`` for the first MTP module).
        quant_block: FP8 block size (``quantization_config.weight_block_size``); default (128, 128).
        dtype: dtype of dequantized FP8 tensors (default float32); other tensors keep their stored dtype
            (e.g. DeepSeek's float32 ``e_score_correction_bias``) and are cast when copied into the head.

    Raises:
        UserError: no key of that layer exists (the message says how to get MTP weights), or an expert
            weight is missing.
    """
    keys = mtp_keys(path, layer_index)
    if not keys:
        raise UserError(f"'{path}' holds no MTP weights (no 'model.layers.{layer_index}.*' tensors): use a "
                        f"DeepSeek-V3 checkpoint that ships them, or train a head with the 'train_mtp' stage "
                        f"and set the drafter's 'path' to its output directory")
    block = tuple(quant_block) if quant_block else (128, 128)
    reader = _Reader(keys, f"model.layers.{layer_index}.", block, dtype)
    out: dict[str, torch.Tensor] = {}
    groups: dict[str, dict[tuple[int, str], str]] = {}
    for name in reader.names():
        m = _EXPERT.match(name)
        if m is None:
            out[name] = reader.get(name)
        else:
            groups.setdefault(m.group(1), {})[(int(m.group(2)), m.group(3))] = name
    for base, parts in groups.items():
        n = 1 + max(e for e, _ in parts)
        missing = [f"{base}.{e}.{w}_proj.weight" for e in range(n) for w in ("gate", "up", "down")
                   if (e, w) not in parts]
        if missing:
            raise UserError(f"MTP weights in '{path}': expert tensors missing: {', '.join(missing[:8])}"
                            + (" ..." if len(missing) > 8 else ""))
        gate_up = down = None
        for e in range(n):
            g, u, d = (reader.get(parts[(e, w)]) for w in ("gate", "up", "down"))
            if gate_up is None:
                gate_up = torch.empty(n, g.shape[0] + u.shape[0], g.shape[1], dtype=g.dtype)
                down = torch.empty(n, *d.shape, dtype=d.dtype)
            gate_up[e, : g.shape[0]], gate_up[e, g.shape[0]:], down[e] = g, u, d
        out[f"{base}.gate_up_proj"], out[f"{base}.down_proj"] = gate_up, down
    return out


def save_mtp_head(out_dir: str | Path, tensors: dict[str, torch.Tensor], config: dict[str, Any],
                  layer_index: int) -> Path:
    """Write a trained head as ``config.json`` + ``model.safetensors`` with keys ``model.layers.{N}.*``.

    Args:
        tensors: head tensors, keys relative to the MTP layer (``enorm.weight``, ``self_attn...``).
        config: the target's config dict plus the :data:`MTP_SECTION` entry.
    """
    from safetensors.torch import save_file

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    prefix = f"model.layers.{layer_index}."
    flat = {prefix + k: v.detach().to("cpu").contiguous() for k, v in tensors.items()}
    with atomic_path(out / "model.safetensors") as tmp:
        save_file(flat, str(tmp), metadata={"format": "pt", "specmoe": "mtp"})
    (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True, default=str))
    return out


def load_head(parts: Any, path: str | Path, *, device: Any, dtype: torch.dtype,
              layer_index: int | None = None, recurse: str | None = None):
    """Build an :class:`~specmoe_plugins.drafters.mtp.model.MTPHead` for a target from a checkpoint.

    ``parts`` is the target's :class:`~specmoe.interfaces.target.TargetParts`.

    ``path`` is a DeepSeek-V3 checkpoint (directory or hub id) with MTP weights or a ``train_mtp`` output
    directory. The block is built from the target's config (the checkpoint must belong to the same
    architecture and sizes). A checkpoint's ``shared_head.head`` / ``embed_tokens`` copies that equal the
    target's own tensors are dropped and the target's are shared instead.
    """
    from specmoe_plugins.drafters.mtp.model import MTPSpec, build_head

    if not Path(path).expanduser().is_dir() and not str(path).startswith((".", "/", "~")):
        path = hub_checkpoint(str(path), local_files_only=bool(os.environ.get("HF_HUB_OFFLINE")))
    path = Path(path).expanduser()
    conf = read_config(path)
    tcfg = parts.config
    wrong = [f"{k}: {conf.get(k)!r} vs target {getattr(tcfg, k, None)!r}"
             for k in ("model_type", "hidden_size", "vocab_size") if conf.get(k) != getattr(tcfg, k, None)]
    if wrong:
        raise UserError(f"MTP weights in '{path}' were made for another model ({'; '.join(wrong)}); use the "
                        f"target's own checkpoint or a head trained on this target")
    n = default_layer_index(conf) if layer_index is None else int(layer_index)
    qblock = (conf.get("quantization_config") or {}).get("weight_block_size")
    tensors = read_mtp_tensors(path, n, quant_block=qblock, dtype=dtype)
    section = conf.get(MTP_SECTION)
    spec = MTPSpec.from_dict(section) if section else MTPSpec.from_keys(tensors)
    if recurse is not None:
        spec.recurse = recurse
        spec.__post_init__()
    for key, shared, flag in (("shared_head.head.weight", parts.lm_head, "own_head"),
                              ("embed_tokens.weight", parts.embed_tokens, "own_embed")):
        t = tensors.get(key)
        if t is not None and t.shape == shared.weight.shape and torch.equal(
                t.to(shared.weight.dtype), shared.weight.detach().cpu()):
            tensors.pop(key)
            setattr(spec, flag, False)
    return build_head(parts, spec, device=device, dtype=dtype, tensors=tensors,
                      source=f"{path} (model.layers.{n}.*)")


def export_head(head: Any, parts: Any, out_dir: str | Path,
                extra: dict[str, Any] | None = None) -> Path:
    """Save a head in the DeepSeek layout under the target's ``num_hidden_layers`` index.

    ``parts`` is the target's :class:`~specmoe.interfaces.target.TargetParts`.
    """
    conf = parts.config.to_dict()
    conf.pop("quantization_config", None)
    conf["num_nextn_predict_layers"] = 1
    conf[MTP_SECTION] = {**head.spec.to_dict(), "format": 1, **(extra or {})}
    return save_mtp_head(out_dir, head.checkpoint_state(), conf, int(parts.config.num_hidden_layers))
