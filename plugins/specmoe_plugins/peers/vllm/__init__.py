# SPDX-License-Identifier: Apache-2.0
"""vLLM as the peer engine (one folder, found through entry points; the core names none of it):

* ``bench.py``: ``platform bench peer`` (entry-point group ``specmoe.benches``), both engines on the same
  checkpoints and prompts in one run;
* ``stage.py``: the ``vllm_peer`` stage (``specmoe.stages``), the same on a GPU recipe;
* ``export.py``: ``platform peer export-policy`` (``specmoe.commands``), the specmoe_vllm plugin's policy file;
* ``headroom.py``: the bench's replay of vLLM's fixed-chain steps (what any per-step draft count could gain);
* ``vllm_runner.py``: the script run by vLLM's own python (it imports vLLM and the standard library only).

``platform compare`` shows the bench runs' engine rows through :mod:`specmoe.peer.compare` (core: it reads the
runs' MLflow artifact, and names no plugin)."""
