# SPDX-License-Identifier: Apache-2.0
"""``learned``: the trained expert predictor of paper §4.1, in one folder.

* ``predictor.py`` -- the ``learned`` predictor plugin (inference; no Lightning): a KV cache of the committed
  tokens and one tree pass per step.
* ``model.py`` -- the network (target embedding -> projection -> small decoder -> routing head) and the loader of
  its exported directory.
* ``module.py`` -- the LightningModule (eq. 6 loss, held-out top-K accuracy) and the export from a checkpoint.
* ``stage.py`` -- the ``train_predictor`` stage.

Its data (routing-trace windows, :mod:`specmoe.training.predictor_data`), loss and accuracy
(:mod:`specmoe.training.routing_metrics`) and accuracy milestones are shared with ``draft_head`` and stay in core.
"""
