# SPDX-License-Identifier: Apache-2.0
"""``hf`` target: any ``GptOssForCausalLM`` / ``Qwen3MoeForCausalLM`` / ``DeepseekV3ForCausalLM`` checkpoint.

Loaded with ``from_pretrained`` from a local directory or a hub id (``tiny:`` builds a small random model
into the cache first and then loads it through the same call). Routing is read from the model's own experts
modules with forward pre-hooks, which see ``(hidden [T, H], top_k_index [T, K], top_k_weights [T, K])``.

Devices: a model spread over devices by a ``device_map`` runs each layer where it lives; everything a forward
pass returns that crosses layers (routing of every MoE layer, hidden states for drafters, logits) is moved once
per pass to :attr:`HFTarget.device`, the device of the input embedding, where the engine keeps its own tensors
(KV-cache positions and masks, trees, sampling generator). Masks and positions are made there too; the model's
device hooks move them to each layer.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Sequence, Union

import torch

from specmoe.errors import UserError
from specmoe.interfaces.kv import KVState
from specmoe.interfaces.options import DType, torch_dtype
from specmoe.interfaces.target import Target, TargetOutput, TargetParts
from specmoe.models import linear
from specmoe.models.hf_masks import MaskSpec
from specmoe_plugins.targets.hf import attention
from specmoe_plugins.targets.hf.expert_bytes import ExpertBytes, expert_bytes
from specmoe_plugins.targets.hf.graph import GraphDecoder
from specmoe_plugins.targets.hf.lean import LeanDecoder

__all__ = ["HFTarget", "hf_expert_bytes"]

logger = logging.getLogger(__name__)


def hf_expert_bytes(model: Any, checkpoint_config: Any) -> ExpertBytes:
    """Bytes of one routed expert of a Hugging Face MoE model, loaded and as its checkpoint stores them.

    The loaded size comes from the first MoE layer's experts module as loaded; the stored size from an
    unquantized copy of that layer built on the meta device from ``checkpoint_config`` (the checkpoint's own
    ``config.json``, with its ``quantization_config``), so that it does not depend on how the model was loaded.
    """
    layers = model.model.layers
    idx = next(i for i, layer in enumerate(layers) if hasattr(getattr(layer, "mlp", None), "experts"))
    loaded = layers[idx].mlp.experts
    with torch.device("meta"):
        plain = type(layers[idx])(checkpoint_config, idx).mlp.experts
    num = int(getattr(plain, "num_experts", 0) or plain.gate_up_proj.shape[0])
    return expert_bytes(plain, loaded, num, checkpoint_config, f"model.layers.{idx}.mlp.experts")


def _splits_onto_cpu(device_map: Any) -> bool:
    """An explicit mapping that puts some modules on the CPU and others on an accelerator."""
    if not isinstance(device_map, dict):
        return False
    devices = {str(d) for d in device_map.values()}
    return "cpu" in devices and len(devices - {"cpu", "disk"}) > 0


def _dispatch_with_cpu_layers(model: Any, device_map: dict[str, Any]) -> Any:
    """Place ``model`` (loaded on the CPU) by ``device_map`` so that its ``cpu`` modules *run* on the CPU.

    ``from_pretrained(device_map=...)`` hands such a mapping to ``accelerate.dispatch_model`` with an accelerator
    as the main device, which reads ``cpu`` as "offload": the weights stay on the CPU as meta placeholders and the
    module runs on the accelerator, so a drafter that reads a target weight directly (a shared final norm, the
    embedding) finds no data. With the CPU as the main device every module runs where the mapping says.
    """
    from accelerate import dispatch_model

    return dispatch_model(model, device_map={k: str(v) for k, v in device_map.items()}, main_device="cpu")


@functools.lru_cache(maxsize=64)
def _causal(b: int, n: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """``(attend [B, N, N], valid [B, N])``: a causal block and all-valid rows (kept: read only)."""
    return (torch.ones(n, n, dtype=torch.bool, device=device).tril().expand(b, n, n),
            torch.ones(b, n, dtype=torch.bool, device=device))


class HFTarget(Target):
    """A Hugging Face MoE causal LM."""

    description = "Hugging Face GPT-OSS / Qwen3-MoE / DeepSeek-V3 checkpoint (local path or hub id)"

    @dataclass
    class Config:
        path: Optional[str] = None
        """local checkpoint directory or hub id; ignored when ``tiny`` is set."""
        tiny: Optional[dict[str, Any]] = None
        """build a tiny random model: ``{arch: gpt_oss|qwen3_moe|deepseek_v3, seed: 0, <config overrides>}``."""
        dtype: DType = DType.float32
        """parameter dtype: ``float32``, ``bfloat16`` or ``float16``."""
        device: Optional[str] = None
        """``cpu``, ``cuda``, ``cuda:1``; default: the device a stage runs on, else ``cpu``; ignored with
        ``device_map``."""
        device_map: Optional[Union[str, dict[str, Any]]] = None
        """``auto`` to spread a large checkpoint over all visible GPUs, or an explicit ``{module: device}``
        mapping (``transformers``' ``device_map``)."""
        attn_implementation: Optional[str] = None
        """default: ``specmoe_gqa`` (:mod:`.attention`: eager's math with additive float masks and
        GPT-OSS sinks, without materialising repeated KV heads); ``eager`` is the model library's own."""
        revision: Optional[str] = None
        dequantize_mxfp4: bool = True
        """GPT-OSS MXFP4 checkpoints are dequantized to ``dtype`` on load (the experts hooks need it)."""
        tokenizer: Optional[str] = None
        """tokenizer path or hub id; default: the checkpoint's own (none for tiny models)."""
        fast_linear: bool = True
        """route the model's linear layers through :func:`specmoe.models.linear.linear` (on CPUs, 2-8 rows take
        the faster BLAS orientation; elsewhere ``F.linear``)."""
        lean: bool = True
        """run the engine's passes (verification, drafting over the target, the autoregressive reference)
        through :class:`~specmoe_plugins.targets.hf.lean.LeanDecoder` where the architecture allows (the model's
        own modules without ``transformers``' per-layer glue); ``false`` or an unsupported architecture: the
        model's own forward."""
        cache_dir: str = ".specmoe_cache/tiny_targets"
        local_files_only: bool = False

    def __init__(self, config: Any = None, **kwargs: Any) -> None:
        super().__init__(config, **kwargs)
        self.model: Any = None
        self.tokenizer: Any = None
        self._capture: list[torch.Tensor] | None = None
        self._lean: LeanDecoder | None = None
        self._verifier: Any = None
        self._verifier_key: Any = None
        self._graph: GraphDecoder | None = None
        self._hooks: list[Any] = []
        self._checkpoint_config: Any = None
        self.load()

    # ------------------------------------------------------------------ loading
    def resolve_path(self) -> str:
        cfg = self.config
        if cfg.tiny is not None:
            from specmoe.models.tiny import build_tiny_model, spec_hash

            tiny = dict(cfg.tiny)
            arch = tiny.pop("arch", "gpt_oss")
            seed = int(tiny.pop("seed", 0))
            out = Path(cfg.cache_dir) / f"{arch}-{spec_hash(arch, seed, tiny)}"
            return str(build_tiny_model(arch, out, seed=seed, **tiny))
        if not cfg.path:
            raise UserError("target: set 'path' (checkpoint directory or hub id) or 'tiny' ({arch: ...})")
        if cfg.path.startswith("stage:"):
            raise UserError(f"target.path '{cfg.path}' was not resolved: run the recipe with 'platform run'")
        local = Path(cfg.path).expanduser()
        if local.exists():
            if not (local / "config.json").is_file():
                raise UserError(f"target.path '{cfg.path}' has no config.json: point it at a checkpoint "
                                f"directory (save_pretrained output)")
            return str(local)
        if cfg.path.startswith((".", "/", "~")) or cfg.local_files_only or os.environ.get("HF_HUB_OFFLINE"):
            raise UserError(f"target.path '{cfg.path}' does not exist locally (and hub access is off): "
                            f"download the checkpoint or fix the path")
        return cfg.path  # a hub id

    def load(self) -> None:
        import transformers

        cfg = self.config
        path = self.resolve_path()
        dtype = torch_dtype(cfg.dtype, where="target.dtype")
        fix = ("re-download or re-export the checkpoint (if a stage made it: 'platform cache clean <stage id>' "
               "and rerun)")
        try:
            hf_cfg = transformers.AutoConfig.from_pretrained(path, revision=cfg.revision,
                                                             local_files_only=cfg.local_files_only)
        except (OSError, ValueError) as exc:
            where = Path(path) / "config.json" if Path(path).is_dir() else path
            raise UserError(f"target: cannot read {where}: {str(exc).splitlines()[0]}; {fix}") from exc
        self._checkpoint_config = hf_cfg  # as stored (quantization_config), whatever the load does
        attention.register()
        attn = cfg.attn_implementation or attention.ATTN_IMPLEMENTATION
        kwargs: dict[str, Any] = dict(dtype=dtype, attn_implementation=attn, revision=cfg.revision,
                                      local_files_only=cfg.local_files_only)
        qcfg = getattr(hf_cfg, "quantization_config", None)
        if qcfg is not None and cfg.dequantize_mxfp4 and "mxfp4" in str(qcfg).lower():
            kwargs["quantization_config"] = transformers.Mxfp4Config(dequantize=True)
        if cfg.device_map:
            if importlib.util.find_spec("accelerate") is None:
                raise UserError("target.device_map needs the 'accelerate' package: pip install 'specmoe[accelerate]' "
                                "(or pip install accelerate)")
            if not _splits_onto_cpu(cfg.device_map):  # else: loaded on the CPU, dispatched below
                kwargs["device_map"] = cfg.device_map
        try:
            model = transformers.AutoModelForCausalLM.from_pretrained(path, **kwargs)
            if cfg.device_map and _splits_onto_cpu(cfg.device_map):
                model = _dispatch_with_cpu_layers(model, cfg.device_map)
        except Exception as exc:  # truncated / corrupted weights, missing shards: name the file
            from safetensors import safe_open

            damaged = []
            for f in sorted(Path(path).glob("*.safetensors")) if Path(path).is_dir() else []:
                try:
                    with safe_open(str(f), "pt"):
                        pass
                except Exception as bad:  # noqa: BLE001 - any failure to open it is the reason
                    damaged.append(f"{f} ({str(bad).splitlines()[0]})")
            if damaged:
                raise UserError(f"target: damaged weights file {', '.join(damaged)}: it is truncated or not a "
                                f"safetensors file; {fix}") from exc
            if isinstance(exc, OSError):
                raise UserError(f"cannot load target '{path}': {exc}") from exc
            raise
        if not cfg.device_map:
            model.to(cfg.device or "cpu")
        model.eval()
        model.requires_grad_(False)
        if cfg.fast_linear:
            linear.install(model)
        self.model = model
        self.path = path
        tok_path = cfg.tokenizer or path
        try:
            tok = transformers.AutoTokenizer.from_pretrained(tok_path, local_files_only=cfg.local_files_only)
            self.tokenizer = tok if len(tok) > 1 else None  # tiny checkpoints without tokenizer files
        except (OSError, ValueError, TypeError) as exc:
            if cfg.tokenizer:
                raise UserError(f"cannot load tokenizer '{tok_path}': {exc}") from exc
            self.tokenizer = None
        self._inspect()

    def _inspect(self) -> None:
        layers = self.model.model.layers
        self._moe_ids = [i for i, layer in enumerate(layers) if hasattr(getattr(layer, "mlp", None), "experts")]
        if not self._moe_ids:
            raise UserError(f"target '{self.path}' has no MoE layers (no mlp.experts module)")
        first = layers[self._moe_ids[0]].mlp
        self._experts = [layers[i].mlp.experts for i in self._moe_ids]
        self._routers = [getattr(layers[i].mlp, "router", None) or layers[i].mlp.gate for i in self._moe_ids]
        self._norms = [layers[i].post_attention_layernorm for i in self._moe_ids]
        c = self.model.config
        self._num_experts = int(first.experts.num_experts if hasattr(first.experts, "num_experts")
                                else first.experts.gate_up_proj.shape[0])
        self._top_k = int(getattr(c, "num_experts_per_tok", None) or first.router.top_k)
        self._expert_bytes = hf_expert_bytes(self.model, self._checkpoint_config or c)
        self._masks = MaskSpec(c)
        self._device = self.model.get_input_embeddings().weight.device
        for ex_mod in self._experts:
            self._hooks.append(ex_mod.register_forward_pre_hook(self._routing_hook))
        self._eos = self._collect_eos()
        self._lean = LeanDecoder.build(self.model) if self.config.lean else None
        self._graph = self._build_graph()

    def _collect_eos(self) -> list[int]:
        ids: list[int] = []
        for src in (getattr(self.model, "generation_config", None), self.model.config, self.tokenizer):
            v = getattr(src, "eos_token_id", None) if src is not None else None
            if v is None:
                continue
            ids.extend(v if isinstance(v, (list, tuple)) else [v])
        return sorted({int(i) for i in ids})

    def _routing_hook(self, module: Any, args: tuple) -> None:
        if self._capture is not None:  # forward passes run without autograd: no detach needed
            self._capture.append(args[1])

    def _home(self, t: torch.Tensor) -> torch.Tensor:
        """``t`` on :attr:`device` (a no-op for a model on one device)."""
        if t.device == self._device:
            return t
        return t.to(self._device, non_blocking=self._device.type == "cuda")  # a host copy must be complete

    def _routing(self, b: int, n: int) -> torch.Tensor:
        """``[B, N, L, K]`` from the per-layer captures (each on its layer's device), on :attr:`device`."""
        return torch.stack([self._home(r) for r in self._capture], dim=1).view(b, n, len(self._moe_ids), -1)

    def _hidden(self, hidden_states: Sequence[torch.Tensor], layers: Sequence[int]) -> torch.Tensor | None:
        if not layers:
            return None
        return torch.cat([self._home(hidden_states[i]) for i in layers], dim=-1)

    # ------------------------------------------------------------------ structure
    @property
    def device(self) -> torch.device:
        """The input embedding's device: where inputs go and every output is returned (see the module doc)."""
        return self._device

    @property
    def dtype(self) -> torch.dtype:
        return self.model.get_input_embeddings().weight.dtype

    @property
    def vocab_size(self) -> int:
        return int(self.model.config.vocab_size)

    @property
    def num_hidden_layers(self) -> int:
        return int(self.model.config.num_hidden_layers)

    @property
    def hidden_size(self) -> int:
        return int(self.model.config.hidden_size)

    @property
    def moe_layer_ids(self) -> list[int]:
        return list(self._moe_ids)

    @property
    def num_experts(self) -> int:
        return self._num_experts

    @property
    def top_k(self) -> int:
        return self._top_k

    @property
    def bytes_per_expert(self) -> int:
        return self._expert_bytes.loaded

    @property
    def bytes_per_expert_stored(self) -> int:
        return self._expert_bytes.stored

    @property
    def expert_storage(self) -> str:
        return self._expert_bytes.storage

    @property
    def eos_token_ids(self) -> list[int]:
        return list(self._eos)

    @property
    def sliding_window(self) -> int | None:
        return self._masks.window

    def routers(self) -> list[torch.nn.Module]:
        return list(self._routers)

    def router_inputs_norms(self) -> list[torch.nn.Module]:
        return list(self._norms)

    def experts_modules(self) -> list[torch.nn.Module]:
        return list(self._experts)

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model.get_input_embeddings()(input_ids)

    @property
    def experts_implementation(self) -> str:
        impl = self.model.get_experts_implementation()  # {submodule: name}; "" is the whole model
        if isinstance(impl, dict):
            impl = impl.get("", next(iter(impl.values()), "eager"))
        return str(impl)

    def set_experts_implementation(self, name: str) -> None:
        self.model.set_experts_implementation(name)

    def compile_passes(self, verifier: Any) -> None:
        """Decoding passes compiled with ``verifier`` where the lean path runs
        (:class:`~specmoe_plugins.targets.hf.graph.GraphDecoder`), compiled here (so that no timed pass pays for
        it) and kept while the same verifier is installed again; ``None``: every pass eager."""
        key = None if verifier is None else (type(verifier), repr(getattr(verifier, "config", None)))
        if key is not None and key == self._verifier_key and self._graph is not None:
            return
        self._verifier, self._verifier_key = verifier, key
        self._graph = self._build_graph()
        if self._graph is not None:
            self._warm_graph()

    @torch.no_grad()
    def _warm_graph(self) -> None:
        """A prompt pass and one decoding step on a scratch cache: compiles the batch-1 pass and runs its trial."""
        kv = self.new_kv(1, capacity=8)
        ids = torch.tensor([[1, 2, 3]], device=self.device) % self.vocab_size
        self.forward(ids, kv, torch.arange(3, device=self.device)[None])
        self.forward(ids[:, :1], kv, torch.tensor([[3]], device=self.device))

    def _build_graph(self) -> GraphDecoder | None:
        if self._lean is None or self._verifier is None:
            return None
        layer_types = getattr(self.model.config, "layer_types", None)
        windows = self._masks.layer_windows(layer_types, self.model.config.num_hidden_layers)
        return GraphDecoder.build(self._lean, self._verifier.graph_experts, windows)

    def to(self, device: torch.device | str) -> None:
        if not self.config.device_map:
            self.model.to(device)
            self._device = self.model.get_input_embeddings().weight.device
            if self._lean is not None:  # its precision routes depend on the device
                self._lean = LeanDecoder.build(self.model)
                self._graph = self._build_graph()

    def parts(self) -> TargetParts:
        model, base = self.model, self.model.model
        cls = type(model)
        return TargetParts(config=model.config, embed_tokens=model.get_input_embeddings(),
                           lm_head=model.get_output_embeddings(), final_norm=base.norm,
                           rotary_emb=base.rotary_emb, decoder_layer_cls=type(base.layers[-1]),
                           norm_cls=type(base.norm), init_weights=model._init_weights,
                           keep_in_fp32=list(getattr(cls, "_keep_in_fp32_modules", None) or []),
                           keep_in_fp32_strict=list(getattr(cls, "_keep_in_fp32_modules_strict", None) or []))

    @torch.no_grad()
    def native_generate(self, input_ids: torch.Tensor, max_new_tokens: int) -> torch.Tensor:
        return self.model.generate(input_ids, attention_mask=torch.ones_like(input_ids),
                                   max_new_tokens=max_new_tokens, min_new_tokens=max_new_tokens, do_sample=False,
                                   pad_token_id=0)

    # ------------------------------------------------------------------ compute
    @torch.no_grad()
    def forward(self, input_ids: torch.Tensor, kv: KVState, positions: torch.Tensor,
                attend: torch.Tensor | None = None, valid: torch.Tensor | None = None, *,
                hidden_layers: Sequence[int] = (), capture_routing: bool = False,
                cached_attend: torch.Tensor | None = None, logits_at: torch.Tensor | None = None) -> TargetOutput:
        b, n = input_ids.shape
        if attend is None or valid is None:
            causal, ones = _causal(b, n, input_ids.device)
            attend = causal if attend is None else attend
            valid = ones if valid is None else valid
        graph = self._graph
        out = graph(input_ids, positions, kv, attend, valid) \
            if graph is not None and graph.applies(kv, b * n, cached_attend) else None
        if out is not None:  # one compiled pass: hidden states, routing and the logits of every row
            last, states, routing, logits = out
            kv.append(positions, valid)
            if logits_at is not None:
                logits = logits.gather(1, logits_at[:, :, None].expand(-1, -1, logits.shape[-1]))
            hidden = self._hidden(states, hidden_layers) if hidden_layers else None
            return TargetOutput(logits=logits, hidden=hidden, routing=routing if capture_routing else None)
        mask = self._masks.build(kv, positions, attend, valid, self.dtype, cached_attend)
        self._capture = [] if capture_routing else None
        prompt = linear.shared_pass() if kv.num_slots == 0 else contextlib.nullcontext()
        try:
            with prompt:  # a prompt pass: the same for every method, its rows need not round as alone
                if self._lean is not None:
                    last, states = self._lean(input_ids, positions, kv.cache, mask, hidden_layers)
                else:
                    out = self.model.model(input_ids=input_ids, attention_mask=mask, position_ids=positions,
                                           cache=kv.cache, use_cache=True, output_hidden_states=bool(hidden_layers))
                    last, states = out.last_hidden_state, out.hidden_states
            routing = self._routing(b, n) if capture_routing else None
        finally:
            self._capture = None
        kv.append(positions, valid)
        if logits_at is not None:
            last = last.gather(1, logits_at.to(last.device)[:, :, None].expand(-1, -1, last.shape[-1]))
        head = self._lean.logits if self._lean is not None else self.model.get_output_embeddings()
        logits = self._home(head(last)).float()
        hidden = self._hidden(states, hidden_layers) if hidden_layers else None
        return TargetOutput(logits=logits, hidden=hidden, routing=routing)

    def new_standard_cache(self) -> Any:
        from transformers import DynamicCache

        return DynamicCache(config=self.model.config)

    @torch.no_grad()
    def forward_standard(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None, positions: torch.Tensor,
                         cache: Any = None, *, hidden_layers: Sequence[int] = (), capture_routing: bool = False,
                         compute_logits: bool = True, logits_to_keep: int = 0) -> TargetOutput:
        b, n = input_ids.shape
        net = self.model if compute_logits else self.model.model  # the decoder body has no LM head
        extra = {"logits_to_keep": logits_to_keep} if compute_logits else {}
        self._capture = [] if capture_routing else None
        try:
            out = net(input_ids=input_ids, attention_mask=attention_mask, position_ids=positions, cache=cache,
                      use_cache=cache is not None, output_hidden_states=bool(hidden_layers), **extra)
            routing = self._routing(b, n) if capture_routing else None
        finally:
            self._capture = None
        hidden = self._hidden(out.hidden_states, hidden_layers)
        return TargetOutput(logits=self._home(out.logits).float() if compute_logits else None, hidden=hidden,
                            routing=routing)
