# SPDX-License-Identifier: Apache-2.0
"""``gto``: Group Tree Optimization (arXiv 2509.22134) of an EAGLE-3 draft, in one folder.

The network, drafting and the TTT loss are EAGLE-3's, reached through the registry (``drafters.get("eagle3")``,
``stages.get("train_eagle3")``), never by importing the ``eagle3`` folder.

* ``drafter.py`` -- the ``gto`` drafter plugin.
* ``objective.py`` -- tree reward, group advantages, clipped surrogate.
* ``module.py`` -- the LightningModule (EAGLE-3 loss + GTO objective).
* ``stage.py`` -- the ``train_gto`` stage.
"""
