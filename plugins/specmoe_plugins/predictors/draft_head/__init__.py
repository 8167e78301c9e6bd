# SPDX-License-Identifier: Apache-2.0
"""``draft_head``: a routing head on the drafter's own node features, in one folder.

* ``predictor.py`` -- the ``draft_head`` predictor plugin (inference; no Lightning): one batched call per tree.
* ``model.py`` -- the head network (``lowrank``, ``mlp``, ``linear``), the per-tree prediction and the export
  format (save / load).
* ``module.py`` -- the LightningModule (node features computed online from the frozen target and drafter) and
  the export from a checkpoint.
* ``stage.py`` -- the ``train_draft_head`` stage.
* ``bench.py`` -- ``platform bench draft_head``: the head at GPT-OSS-120B dimensions, and against ``learned``
  (reached through the registry) at the demo's size.

The routing-trace data, loss, accuracy and milestones are shared with ``learned`` and stay in core
(:mod:`specmoe.training.predictor_data`, :mod:`specmoe.training.routing_metrics`).
"""
