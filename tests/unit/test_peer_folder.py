# SPDX-License-Identifier: Apache-2.0
"""The vLLM peer as one plugin folder (issue 24): ``platform bench peer``, the ``vllm_peer`` stage and ``platform
peer export-policy`` come from its entry points (the core names none of it), and the modules that moved keep
their old paths as deprecation aliases for one minor version."""

from __future__ import annotations

import importlib

import pytest


def test_bench_stage_and_command_come_from_the_plugin_folder():
    from specmoe.cli.main import SUBCOMMANDS, build_parser
    from specmoe.registry import benches, commands, stages

    assert "peer" not in SUBCOMMANDS and not hasattr(importlib.import_module("specmoe.bench"), "BENCHES")
    assert benches.get("peer").__name__ == "specmoe_plugins.peers.vllm.bench"
    assert commands.get("peer").__name__ == "specmoe_plugins.peers.vllm.export"
    assert stages.get("vllm_peer").__module__ == "specmoe_plugins.peers.vllm.stage"
    parser = build_parser()
    args = parser.parse_args(["peer", "export-policy", "--out", "p.json"])
    assert args.func is commands.get("peer").run


@pytest.mark.parametrize("old,new", [("specmoe.bench.peer", "specmoe_plugins.peers.vllm.bench"),
                                     ("specmoe.peer.export", "specmoe_plugins.peers.vllm.export"),
                                     ("specmoe.peer.stage", "specmoe_plugins.peers.vllm.stage")])
def test_old_peer_modules_give_the_moved_names_with_a_warning(old, new):
    alias, module = importlib.import_module(old), importlib.import_module(new)
    assert alias.__all__ == module.__all__
    for name in module.__all__:
        with pytest.warns(DeprecationWarning, match=f"{new}.{name}"):
            assert getattr(alias, name) is getattr(module, name)
    with pytest.raises(AttributeError, match="deprecated alias"):
        alias.not_a_name  # noqa: B018
