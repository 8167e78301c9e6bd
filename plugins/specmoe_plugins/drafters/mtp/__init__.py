# SPDX-License-Identifier: Apache-2.0
"""``mtp``: DeepSeek-V3 style multi-token-prediction drafting and training, in one folder.

* ``drafter.py`` -- the ``mtp`` drafter plugin (inference; no Lightning).
* ``model.py`` -- the MTP head (a decoder layer of the target's own architecture).
* ``checkpoint.py`` -- reading / writing MTP weights (DeepSeek-V3 checkpoints and trained heads).
* ``module.py`` -- the LightningModule (training only).
* ``stage.py`` -- the ``train_mtp`` stage.
"""
