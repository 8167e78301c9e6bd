# SPDX-License-Identifier: Apache-2.0
"""``eagle3``: EAGLE-3 drafting and training, in one folder.

* ``drafter.py`` -- the ``eagle3`` drafter plugin (inference; no Lightning).
* ``model.py`` -- the one-layer draft network and its config (the released checkpoint layout).
* ``checkpoint.py`` -- loading / saving the released EAGLE-3 format.
* ``vocab_map.py`` -- draft <-> target vocabulary maps (``d2t`` / ``t2d``).
* ``tree.py`` -- EAGLE-2/3 tree expansion over a draft KV context.
* ``ttt.py`` -- the training-time-test unroll and its loss.
* ``module.py`` -- the LightningModule (training only).
* ``stage.py`` -- the ``train_eagle3`` stage.
"""
