# SPDX-License-Identifier: Apache-2.0
"""Reading what the vLLM peer's benchmark logged (``compare``: its engine rows in ``platform compare``). The peer
itself (the bench, the ``vllm_peer`` stage, ``platform peer export-policy``, the script vLLM runs) is the plugin
folder ``specmoe_plugins/peers/vllm``; ``export`` and ``stage`` here are deprecated aliases of its modules."""
