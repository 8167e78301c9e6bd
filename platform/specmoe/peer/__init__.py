# SPDX-License-Identifier: Apache-2.0
"""Reading what the vLLM peer's benchmark logged (``compare``). The peer itself is the plugin folder
``specmoe_plugins/peers/vllm``; ``export`` and ``stage`` here are deprecated aliases of its modules."""
