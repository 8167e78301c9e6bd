# SPDX-License-Identifier: Apache-2.0
"""The trained tiny target, in one folder: a small MoE causal LM pretrained here on local text and exported as a
Hugging Face checkpoint, which the ``hf`` target loads (``target: {name: hf, path: stage:<id>}``).

* ``stage.py`` -- the ``pretrain_target`` stage: tokenizer, training, export, evaluation summary.
* ``module.py`` -- the LightningModule (next-token loss + router losses, the training experts kernel).
* ``text_data.py`` -- packed causal-LM blocks from JSONL text (GSM8K train by default).
* ``tokenizer.py`` -- the byte-level BPE tokenizer and its chat template (the pretraining document format).
* ``router_balance.py`` -- expert load counting, balancing losses / router-bias balancing, the collapse check.

Training only (Lightning): no inference code lives here; the exported checkpoint runs through ``hf``.
"""
