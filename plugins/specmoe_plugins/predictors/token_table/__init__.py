# SPDX-License-Identifier: Apache-2.0
"""``token_table``: the zero-parameter baseline, in one folder.

* ``predictor.py`` -- the ``token_table`` predictor plugin: one lookup per node.
* ``table.py`` -- the table (per token id the most frequent experts per layer, a global fallback), its build from
  routing traces and its files (``token_table.safetensors`` + ``token_table.json``).
* ``stage.py`` -- the ``build_token_table`` stage.
"""
