# SPDX-License-Identifier: Apache-2.0
"""Draft-model internals shared by the drafter plugins, their training modules and stages.

EAGLE-3 / GTO:

* :mod:`specmoe.drafting.eagle3_model` -- the one-layer EAGLE-3 draft network and its config.
* :mod:`specmoe.drafting.eagle3_io` -- loading / saving the released EAGLE-3 checkpoint format.
* :mod:`specmoe.drafting.eagle3_tree` -- EAGLE-2/3 tree expansion over a draft KV context.
* :mod:`specmoe.drafting.eagle3_ttt` -- the training-time-test unroll and its loss.
* :mod:`specmoe.drafting.vocab_map` -- draft <-> target vocabulary maps (``d2t`` / ``t2d``).
* :mod:`specmoe.drafting.gto` -- Group Tree Optimization reward / advantage / surrogate math.

DeepSeek-V3 style MTP:

* :mod:`specmoe.drafting.mtp_model` -- the multi-token-prediction head.
* :mod:`specmoe.drafting.mtp_io` -- reading / writing MTP weights.

Importing this package imports nothing heavy; import the submodules you need.
"""

__all__: list[str] = []
