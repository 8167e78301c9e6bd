# SPDX-License-Identifier: Apache-2.0
"""``hf``: any Hugging Face ``GptOssForCausalLM`` / ``Qwen3MoeForCausalLM`` / ``DeepseekV3ForCausalLM`` checkpoint
as a target, in one folder (the entry point ``specmoe_plugins.targets.hf:HFTarget`` names this package).

* ``target.py`` -- the ``hf`` target plugin: loading, routing hooks, tree-masked passes, ``device_map``.
* ``lean.py`` -- the decoding forward pass without ``transformers``' per-layer glue (``LeanDecoder``).
* ``graph.py`` -- that pass as one compiled graph on CPUs (``GraphDecoder``).
* ``expert_bytes.py`` -- bytes of one routed expert, as stored and as loaded.
"""

from __future__ import annotations

from specmoe_plugins.targets.hf.target import HFTarget, hf_expert_bytes

__all__ = ["HFTarget", "hf_expert_bytes"]
