# SPDX-License-Identifier: Apache-2.0
"""The union-of-experts verifiers: each expert the verified tokens route to is read once per MoE layer call.

One component, two backends and their shared parts:

* ``reference.py``: the PyTorch union experts (:func:`~.reference.union_experts_forward`, the specification the
  Triton kernels are tested against, and the graph form the compiled CPU pass runs); ``layout.py``: how a model's
  experts module stores its weights (the kernels' view of it);
* ``torch_verifier.py``: the ``torch_union`` verifier (runs ``reference.py``); ``triton_verifier.py``: the
  ``triton_union`` verifier, its kernels ``kernels.py`` and their ``routing_meta.py`` (the ``triton`` extra);
* ``bench.py``: ``platform bench verifier`` (the experts implementations on one MoE layer: time per call and
  achieved bandwidth against the device's).
"""
