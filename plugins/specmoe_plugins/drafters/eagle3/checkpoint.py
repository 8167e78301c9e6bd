# SPDX-License-Identifier: Apache-2.0
"""Loading and saving EAGLE-3 drafts in the released checkpoint format.

A checkpoint is a directory (or a hub repository) with ``config.json`` (see
:class:`~specmoe_plugins.drafters.eagle3.model.Eagle3Config`) and the weights in ``model.safetensors`` (sharded with
``model.safetensors.index.json``) or ``pytorch_model.bin`` (the original EAGLE releases). Weight names are
those of :class:`~specmoe_plugins.drafters.eagle3.model.Eagle3Model`; on read a few spellings used elsewhere are
accepted: vLLM's ``layers.0.`` for ``midlayer.`` and ``draft_id_to_target_id`` for ``d2t``, and a leading
``model.``; rotary ``inv_freq`` buffers are ignored. ``t2d`` is rebuilt from ``d2t`` when absent (vLLM drops
it), ``embed_tokens`` is taken from the target when absent (SpecForge exports omit it), and ``d2t`` / ``t2d``
may be absent when the two vocabularies are equal. Any other missing or unexpected key is an error that
lists them all.

Saved directories use exactly the released layout (``config.json`` + ``model.safetensors``) so SGLang and vLLM
serve them; ``embed_tokens`` is written only on request (the serving engines share the target's).

**Aux layer ids.** ``eagle_config.eagle_aux_hidden_state_layer_ids`` are written and read in the convention
the serving engines read: hidden-state boundary indices (``k`` = the output of the first ``k`` target layers,
0 = the embeddings), distinct, one per ``fc`` chunk in layer order. vLLM captures exactly these
(``_maybe_add_hidden_state`` after each layer of its GPT-OSS / Llama / Qwen models, ids de-duplicated and
sorted, ``fc`` sized by their count), and so does SGLang's GPT-OSS model; SGLang's other models shift ids
that start at 1 by one (they name layer outputs). Drafts exported by specmoe before this convention wrote
SGLang-style output-of-layer ids (``k - 1``), duplicated for shallow targets (``[0, 1, 1]`` on a 4-layer
target, with an ``fc`` of three chunks): :func:`read_config` recognises them (repeated ids, or a
``summary.json`` of the training stage whose ``feature_layers`` are the ids plus one) and reads them as they
were trained, and :func:`rewrite_eagle3` rewrites them in the serving convention, folding the ``fc`` blocks
that see the same hidden state into one (their sum: the same function)::

    python -m specmoe_plugins.drafters.eagle3.checkpoint OLD_DIR [NEW_DIR] [--legacy-ids | --no-legacy-ids]
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any, Optional

import torch

from specmoe.errors import UserError
from specmoe.utils.files import atomic_path
from specmoe_plugins.drafters.eagle3.model import Eagle3Config, Eagle3Model
from specmoe_plugins.drafters.eagle3.vocab_map import check_vocab_map

__all__ = [
    "REQUIRED_SERVING_KEYS",
    "fold_repeated_features",
    "legacy_aux_ids",
    "rewrite_eagle3",
    "check_target_fit",
    "WEIGHTS_NAME",
    "load_eagle3",
    "load_state",
    "normalize_keys",
    "read_config",
    "read_state_dict",
    "resolve_checkpoint",
    "save_eagle3",
]

logger = logging.getLogger(__name__)

WEIGHTS_NAME = "model.safetensors"
#: the keys SGLang needs to serve a draft (SpecForge ``to_sglang.py``)
REQUIRED_SERVING_KEYS = ("fc.weight", "norm.weight", "lm_head.weight", "t2d", "d2t")
_PATTERNS = ["config.json", "*.safetensors", "model.safetensors.index.json", "pytorch_model*.bin",
             "pytorch_model.bin.index.json"]
_ALIASES = (("layers.0.", "midlayer."),)


def resolve_checkpoint(path: str, revision: Optional[str] = None, local_files_only: bool = False) -> Path:
    """A local checkpoint directory for ``path`` (a directory, or a hub id fetched with huggingface_hub)."""
    local = Path(path).expanduser()
    if local.exists():
        if not (local / "config.json").is_file():
            raise UserError(f"EAGLE-3 checkpoint '{path}' has no config.json: point 'path' at a draft "
                            f"directory")
        return local
    if path.startswith((".", "/", "~", "stage:")) or path.count("/") != 1:
        raise UserError(f"EAGLE-3 checkpoint '{path}' does not exist locally and is not a hub id "
                        f"(owner/name)")
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(path, revision=revision, allow_patterns=_PATTERNS,
                                      local_files_only=local_files_only))
    except Exception as exc:  # network, auth, missing repo: one clear message
        raise UserError(f"cannot fetch EAGLE-3 checkpoint '{path}' from the hub "
                        f"({type(exc).__name__}: {exc}); "
                        f"download it and pass the local directory") from exc


def legacy_aux_ids(ckpt: Path, ids: Optional[list[int]]) -> bool:
    """Whether ``ids`` (the checkpoint's ``eagle_aux_hidden_state_layer_ids``) are in the output-of-layer
    convention of specmoe's earlier exports: repeated ids (never written in the serving convention), or a
    training-stage ``summary.json`` beside the draft recording ``feature_layers`` = ids + 1."""
    if not ids:
        return False
    if len(set(ids)) < len(ids):
        return True
    summary = Path(ckpt) / "summary.json"
    try:
        layers = json.loads(summary.read_text()).get("feature_layers") if summary.is_file() else None
    except (OSError, json.JSONDecodeError, AttributeError):
        layers = None
    return isinstance(layers, list) and sorted(layers) == sorted(i + 1 for i in ids) != sorted(ids)


def read_config(ckpt: Path, legacy: Optional[bool] = None) -> Eagle3Config:
    """Parse ``ckpt/config.json``; its aux layer ids become hidden-state boundaries (see the module docstring).

    Args:
        legacy: the ids are output-of-layer ids of an earlier specmoe export (None: :func:`legacy_aux_ids`
            decides).
    """
    f = Path(ckpt) / "config.json"
    try:
        d = json.loads(f.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise UserError(f"cannot read {f}: {exc}") from exc
    cfg = Eagle3Config.from_dict(d, where=str(f))
    ids = cfg.aux_layer_ids
    if ids and (legacy if legacy is not None else legacy_aux_ids(Path(ckpt), ids)):
        boundaries = sorted(i + 1 for i in ids)
        logger.info("EAGLE-3 draft %s: aux layer ids %s were written as layer outputs (earlier specmoe "
                    "export); reading them as hidden-state boundaries %s", ckpt, ids, boundaries)
        cfg = cfg.replace(aux_layer_ids=boundaries)
    return cfg


def fold_repeated_features(ids: list[int], fc: torch.Tensor) -> tuple[list[int], torch.Tensor]:
    """Merge the ``fc`` chunks that read the same hidden state.

    Args:
        ids: the hidden-state index each chunk of ``fc`` reads, in chunk order (may repeat).
        fc: ``[H, len(ids) * H_t]``.

    Returns:
        ``(distinct sorted ids, fc' [H, len(distinct) * H_t])`` with ``fc'`` chunk ``j`` the sum of the chunks
        reading ``distinct[j]`` (summed in float32), so ``fc(cat(h[ids])) == fc'(cat(h[distinct]))`` up to
        rounding.
    """
    k = len(ids)
    if k == 0 or fc.shape[1] % k:
        raise UserError(f"EAGLE-3 fc.weight {tuple(fc.shape)} does not split into {k} aux-layer chunks")
    width = fc.shape[1] // k
    distinct = sorted(set(ids))
    blocks = fc.reshape(fc.shape[0], k, width).float()
    out = torch.zeros(fc.shape[0], len(distinct), width, dtype=torch.float32)
    for j, i in enumerate(ids):
        out[:, distinct.index(i)] += blocks[:, j]
    return distinct, out.reshape(fc.shape[0], len(distinct) * width).to(fc.dtype).contiguous()


def read_state_dict(ckpt: Path) -> dict[str, torch.Tensor]:
    """All tensors of the checkpoint (safetensors, sharded safetensors or ``pytorch_model.bin``)."""
    from safetensors.torch import load_file

    ckpt = Path(ckpt)
    index = ckpt / "model.safetensors.index.json"
    if index.is_file():
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        out: dict[str, torch.Tensor] = {}
        for s in shards:
            out.update(load_file(str(ckpt / s)))
        return out
    files = sorted(ckpt.glob("*.safetensors"))
    if files:
        out = {}
        for f in files:
            out.update(load_file(str(f)))
        return out
    bins = sorted(ckpt.glob("pytorch_model*.bin"))
    if bins:
        out = {}
        for f in bins:
            out.update(torch.load(f, map_location="cpu", weights_only=True))
        return out
    raise UserError(f"EAGLE-3 checkpoint {ckpt} holds no weights (model.safetensors or pytorch_model.bin)")


def normalize_keys(sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Map accepted alternative spellings to the released names (see the module docstring)."""
    out = {}
    for key, t in sd.items():
        if key.endswith("rotary_emb.inv_freq"):  # a derived buffer some exports include
            continue
        k = key.removeprefix("model.")
        for old, new in _ALIASES:
            if k.startswith(old):
                k = new + k[len(old):]
        if k == "draft_id_to_target_id":
            k = "d2t"
        out[k] = t
    return out


def check_target_fit(config: Eagle3Config, vocab_size: int, hidden_size: int, where: str,
                     own_embed: bool = True) -> None:
    """Raise one clear :class:`UserError` when a draft (``config``, read from ``where``/config.json) was made
    for a target with another vocabulary or hidden size.

    Args:
        vocab_size, hidden_size: the target's (its ``[V, H]`` embedding).
        own_embed: the checkpoint has its own ``embed_tokens`` (else it shares the target's, whose width must
            then be the draft's ``hidden_size``).
    """
    conf = f"{where}/config.json"
    fix = "Use an EAGLE-3 draft trained for this target (train one with the train_eagle3 stage)"
    if config.vocab_size != vocab_size:
        raise UserError(f"EAGLE-3 draft {conf}: vocab_size is {config.vocab_size} but the target's vocabulary "
                        f"has {vocab_size} tokens: this draft was trained for another target or tokenizer. "
                        f"{fix}, or load the target it was trained for.")
    fused = config.target_hidden_size or config.hidden_size
    if fused != hidden_size:
        key = "target_hidden_size" if config.target_hidden_size else "hidden_size"
        raise UserError(f"EAGLE-3 draft {conf}: {key} is {fused} (the width of the target hidden states it "
                        f"fuses) but the target's hidden size is {hidden_size}: this draft was trained for "
                        f"another target. {fix}.")
    if not own_embed and config.hidden_size != hidden_size:
        raise UserError(f"EAGLE-3 draft {conf}: hidden_size is {config.hidden_size} but the checkpoint has no "
                        f"embed_tokens, so it would share the target's embedding, which is {hidden_size} wide. "
                        f"Export the draft with its embed_tokens (train_eagle3 option save_embed_tokens: true).")


def load_state(model: Eagle3Model, sd: dict[str, torch.Tensor], where: str,
               embed: Optional[torch.Tensor] = None) -> None:
    """Check ``sd`` against ``model``'s layout and load it.

    Args:
        embed: the target's ``[V, H]`` embedding: used when the checkpoint has no ``embed_tokens``, and checked
            against the draft's vocabulary and sizes (:func:`check_target_fit`).

    Raises:
        UserError: missing / unexpected keys, shape mismatches, inconsistent ``d2t`` / ``t2d``, a draft made
            for another target.
    """
    c = model.config
    sd = normalize_keys(sd)
    expected = model.state_dict()
    optional = {"embed_tokens.weight", "t2d"}
    if c.draft_vocab_size == c.vocab_size:
        optional.add("d2t")
    missing = sorted(k for k in expected if k not in sd and k not in optional)
    unexpected = sorted(k for k in sd if k not in expected)
    if missing or unexpected:
        raise UserError(
            f"EAGLE-3 checkpoint {where} does not match its config: "
            f"missing keys: {missing or 'none'}; unexpected keys: {unexpected or 'none'}. "
            f"Expected the released layout (fc, midlayer.*, norm, lm_head, d2t, t2d, optional embed_tokens).")
    bad = [f"{k}: checkpoint {tuple(sd[k].shape)} vs config {tuple(v.shape)}" for k, v in expected.items()
           if k in sd and tuple(sd[k].shape) != tuple(v.shape)]
    if bad:
        raise UserError(f"EAGLE-3 checkpoint {where}: tensor shapes disagree with config.json: "
                        f"{'; '.join(bad)}")
    if embed is not None:
        check_target_fit(c, int(embed.shape[0]), int(embed.shape[1]), where, "embed_tokens.weight" in sd)
    if "embed_tokens.weight" not in sd:
        if embed is None:
            raise UserError(f"EAGLE-3 checkpoint {where} has no embed_tokens and no target embedding "
                            f"was given")
        sd["embed_tokens.weight"] = embed
    if "d2t" not in sd:
        sd["d2t"] = torch.zeros(c.draft_vocab_size, dtype=torch.long)
    if "t2d" not in sd:
        t2d = torch.zeros(c.vocab_size, dtype=torch.bool)
        t2d[sd["d2t"].long() + torch.arange(c.draft_vocab_size)] = True
        sd["t2d"] = t2d
    sd["d2t"], sd["t2d"] = sd["d2t"].long(), sd["t2d"].bool()
    try:
        check_vocab_map(sd["d2t"], sd["t2d"])
    except ValueError as exc:
        raise UserError(f"EAGLE-3 checkpoint {where}: {exc}") from exc
    model.load_state_dict(sd, strict=True)


def load_eagle3(path: str, *, embed: Optional[torch.Tensor] = None, dtype: Optional[torch.dtype] = None,
                device: Any = "cpu", revision: Optional[str] = None,
                local_files_only: bool = False) -> Eagle3Model:
    """Load a draft from a directory or hub id.

    Args:
        embed: the target's embedding weight (used when the checkpoint has none).
        dtype: parameter dtype (default: ``torch_dtype`` of config.json).
    """
    ckpt = resolve_checkpoint(path, revision, local_files_only)
    cfg = read_config(ckpt)
    if dtype is None:
        dtype = getattr(torch, cfg.torch_dtype, None) or torch.bfloat16
    with torch.device("meta"):
        model = Eagle3Model(cfg)
    model = model.to_empty(device="cpu")
    model.rotary = type(model.rotary)(cfg.llama_config())  # real (not meta) rotary buffers
    load_state(model, read_state_dict(ckpt), str(ckpt), None if embed is None else embed.detach().cpu())
    model.to(device=device, dtype=dtype)
    model.d2t.data = model.d2t.long()
    model.t2d.data = model.t2d.bool()
    return model.eval()


def save_eagle3(model: Eagle3Model, out_dir: str | Path, *, save_embed_tokens: bool = False,
                dtype: Optional[torch.dtype] = None) -> Path:
    """Write ``config.json`` + ``model.safetensors`` in the released layout.

    Args:
        save_embed_tokens: include ``embed_tokens.weight`` (by default the serving engine takes the target's).
        dtype: floating-point dtype of the written weights (default: the model's); recorded as
            ``torch_dtype``.
    """

    sd = {}
    for k, t in model.state_dict().items():
        if k == "embed_tokens.weight" and not save_embed_tokens:
            continue
        t = t.detach().to("cpu")
        if t.is_floating_point() and dtype is not None:
            t = t.to(dtype)
        sd[k] = t.contiguous()
    wdt = dtype or model.fc.weight.dtype
    return _write(model.config.replace(torch_dtype=str(wdt).replace("torch.", "")), sd, Path(out_dir))


def _write(cfg: Eagle3Config, sd: dict[str, torch.Tensor], out: Path) -> Path:
    """Write ``cfg`` + ``sd`` with distinct aux ids (repeated ones folded: :func:`fold_repeated_features`)."""
    from safetensors.torch import save_file

    ids = cfg.aux_layer_ids
    if ids and len(set(ids)) < len(ids):
        ids, sd["fc.weight"] = fold_repeated_features(sorted(ids), sd["fc.weight"])
        cfg = cfg.replace(aux_layer_ids=ids)
    out.mkdir(parents=True, exist_ok=True)
    with atomic_path(out / WEIGHTS_NAME) as tmp:
        save_file(sd, str(tmp), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(cfg.to_dict(), indent=2) + "\n")
    return out


def rewrite_eagle3(src: str | Path, dst: Optional[str | Path] = None, legacy: Optional[bool] = None) -> Path:
    """Rewrite a draft in the serving engines' convention: aux ids as distinct hidden-state boundaries, the
    ``fc`` chunks of repeated ids folded, weights in the released names (``model.safetensors``), their dtypes
    kept. Other keys of config.json are kept.

    Args:
        dst: the output directory (default: ``src`` itself, when its weights are one ``model.safetensors``).
        legacy: the ids are output-of-layer ids of an earlier specmoe export (None: detected,
            :func:`legacy_aux_ids`; pass True for such an export whose ids are distinct and that lost its
            ``summary.json``).
    """
    ckpt = Path(src).expanduser()
    if not (ckpt / "config.json").is_file():
        raise UserError(f"EAGLE-3 checkpoint '{src}' has no config.json: point it at a draft directory")
    out = ckpt if dst is None else Path(dst).expanduser()
    files = sorted(p.name for p in ckpt.iterdir() if p.suffix in (".safetensors", ".bin"))
    if out.resolve() == ckpt.resolve() and files != [WEIGHTS_NAME]:
        raise UserError(f"EAGLE-3 checkpoint {ckpt} keeps its weights in {files}: rewrite it into another "
                        f"directory (give a destination)")
    cfg = read_config(ckpt, legacy)
    sd = {k: t.contiguous() for k, t in normalize_keys(read_state_dict(ckpt)).items()}
    if "fc.weight" not in sd:
        raise UserError(f"EAGLE-3 checkpoint {ckpt} has no fc.weight")
    return _write(cfg, sd, out)


def main(argv: Optional[list[str]] = None) -> int:
    """``python -m specmoe_plugins.drafters.eagle3.checkpoint SRC [DST]``: :func:`rewrite_eagle3`."""
    import argparse
    import sys

    ap = argparse.ArgumentParser(prog="python -m specmoe_plugins.drafters.eagle3.checkpoint",
                                 description="Rewrite an EAGLE-3 draft with the aux layer ids vLLM and SGLang "
                                             "read (distinct hidden-state boundaries, fc chunks folded).")
    ap.add_argument("src", help="draft directory (config.json + weights)")
    ap.add_argument("dst", nargs="?", help="output directory (default: rewrite SRC in place)")
    group = ap.add_mutually_exclusive_group()
    group.add_argument("--legacy-ids", dest="legacy", action="store_const", const=True,
                       help="the ids are layer-output ids of an earlier specmoe export (default: detected)")
    group.add_argument("--no-legacy-ids", dest="legacy", action="store_const", const=False,
                       help="the ids are already hidden-state boundaries")
    args = ap.parse_args(argv)
    try:
        out = rewrite_eagle3(args.src, args.dst, args.legacy)
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    ids = json.loads((out / "config.json").read_text()).get("eagle_config", {})
    print(f"wrote {out} (eagle_aux_hidden_state_layer_ids {ids.get('eagle_aux_hidden_state_layer_ids')})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
