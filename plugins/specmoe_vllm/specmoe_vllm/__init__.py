# SPDX-License-Identifier: Apache-2.0
"""specmoe inside vLLM: the expert-aware, AR-floored verification budget as a vLLM plugin.

``specmoe_vllm.policy`` (pure Python) decides per step how many draft tokens each request verifies;
``specmoe_vllm.scheduler.SpecMoEScheduler`` (vLLM's ``scheduler_cls``) applies it. :func:`register` is the
``vllm.general_plugins`` entry point: vLLM calls it in every process it starts; it checks, where the policy
file is named by ``$SPECMOE_VLLM_POLICY``, that the file reads, so a bad file stops vLLM with one message
before any weight loads, and it puts ``specmoe_vllm.drafter``'s proposer in place of vLLM's EAGLE proposer
(inactive unless the plugin's options are given: steps that propose nothing then skip the drafter).
"""

from __future__ import annotations

__version__ = "0.1.0"
__all__ = ["register", "__version__"]


def register() -> None:
    import os

    from specmoe_vllm.drafter import install

    install()
    path = os.environ.get("SPECMOE_VLLM_POLICY")
    if path:
        from specmoe_vllm.policy import load_policy

        load_policy(path)
