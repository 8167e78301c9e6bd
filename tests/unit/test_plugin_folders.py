# SPDX-License-Identifier: Apache-2.0
"""Adding a trained component is one folder plus entry points (issue 24.1): a throw-away distribution in a
temporary directory ships a trained expert predictor (its training stage beside it) or a trained target (a
pretraining stage whose export the ``hf`` target loads); both are found through the registries and run: the
predictor inside a speculative decode (greedy output equal to AR), the target through AR decoding."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
import torch

from specmoe.decoding.ar import ar_generate
from specmoe.decoding.engine import SpeculativeEngine
from specmoe.decoding.stopping import StopRule
from specmoe.interfaces.stage import StageContext
from specmoe.registry import drafters, predictors, selectors, stages, targets
from specmoe.traces.format import TraceReader

#: a trained predictor's folder: per layer the K experts the router chose most often on the traces' train split
PREDICTOR_FOLDER = {
    "__init__.py": '"""Most frequent experts per layer (a throw-away trained predictor)."""\n',
    "stage.py": '''
        import json
        from dataclasses import dataclass

        import torch

        from specmoe.plugin_api import Stage
        from specmoe.traces.format import TraceReader


        class TrainFrequent(Stage):
            description = "count the router's choices per layer"

            @dataclass
            class Config:
                traces: str = ""

            def run(self, out_dir, ctx):
                reader = TraceReader(self.config.traces)
                m = reader.meta
                counts = torch.zeros(m.num_layers, m.num_experts, dtype=torch.long)
                for _, cols in reader.iter_shards("train"):
                    routing = cols["routing"].long()  # [T, L, K]
                    for layer in range(m.num_layers):
                        counts[layer] += torch.bincount(routing[:, layer].reshape(-1), minlength=m.num_experts)
                top = torch.sort(counts, dim=-1, descending=True, stable=True).indices[:, :m.top_k]
                out_dir.mkdir(parents=True, exist_ok=True)
                (out_dir / "frequent.json").write_text(json.dumps({"experts": top.tolist()}))
                return {"tokens": int(counts[0].sum()) // m.top_k}
    ''',
    "predictor.py": '''
        import json
        from dataclasses import dataclass
        from pathlib import Path

        import torch

        from specmoe.plugin_api import Predictor


        class Frequent(Predictor):
            description = "the most frequent experts of each layer, for every node"

            @dataclass
            class Config:
                path: str = ""

            def setup(self, target):
                top = torch.tensor(json.loads((Path(self.config.path) / "frequent.json").read_text())["experts"])
                self.sets = torch.zeros(target.num_moe_layers, target.num_experts, dtype=torch.bool)
                self.sets[torch.arange(len(top))[:, None], top] = True
                self.calls = 0

            def predict(self, state, tree):
                self.calls += 1
                b, n = tree.tokens.shape
                return self.sets.to(tree.tokens.device).expand(b, n, -1, -1) & tree.valid[:, :, None, None]
    ''',
}

#: a trained target's folder: a tiny MoE causal LM trained a few steps on seeded tokens, exported for ``hf``
TARGET_FOLDER = {
    "__init__.py": '"""A tiny MoE target trained here (a throw-away trained target)."""\n',
    "stage.py": '''
        from dataclasses import dataclass

        import torch
        import transformers

        from specmoe.models.tiny import tiny_config
        from specmoe.plugin_api import Stage


        class PretrainToy(Stage):
            description = "a few steps of next-token training of a tiny MoE LM"

            @dataclass
            class Config:
                arch: str = "qwen3_moe"
                steps: int = 4
                seed: int = 0

            def run(self, out_dir, ctx):
                cfg = self.config
                torch.manual_seed(cfg.seed)
                model = transformers.AutoModelForCausalLM.from_config(tiny_config(cfg.arch), dtype=torch.float32)
                ids = torch.randint(0, model.config.vocab_size, (4, 24))
                opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
                losses = []
                for _ in range(cfg.steps):
                    loss = model(input_ids=ids, labels=ids).loss
                    opt.zero_grad()
                    loss.backward()
                    opt.step()
                    losses.append(float(loss.detach()))
                model.save_pretrained(out_dir)
                return {"losses": losses}
    ''',
}


def _install(site: Path, package: str, files: dict[str, str], entry_points: dict[str, dict[str, str]]) -> None:
    """The folder ``site/<package>/`` and a ``.dist-info`` declaring its entry points (an installed package)."""
    folder = site / package
    folder.mkdir(parents=True)
    for name, source in files.items():
        (folder / name).write_text(textwrap.dedent(source))
    info = site / f"{package}-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {package}\nVersion: 0.1\n")
    (info / "top_level.txt").write_text(f"{package}\n")
    (info / "entry_points.txt").write_text("".join(
        f"[{group}]\n" + "".join(f"{k} = {v}\n" for k, v in eps.items()) for group, eps in entry_points.items()))


@pytest.fixture
def site(tmp_path, monkeypatch):
    root = tmp_path / "site"
    root.mkdir()
    monkeypatch.syspath_prepend(str(root))
    # the registries as they were (plugins registered by decorator at import, e.g. the tests' fixture stages,
    # are not rediscovered after a clear), restored once the throw-away packages are off sys.path
    saved = [(r, r._snapshot()) for r in (stages, predictors)]
    yield root
    for registry, snap in saved:
        registry._restore(snap)


def test_a_trained_predictor_is_one_folder_plus_entry_points(site, tmp_path, qwen3_traces, make_target):
    _install(site, "lab_frequent", PREDICTOR_FOLDER,
             {"specmoe.stages": {"lab_train_frequent": "lab_frequent.stage:TrainFrequent"},
              "specmoe.predictors": {"lab_frequent": "lab_frequent.predictor:Frequent"}})
    stages._clear()
    predictors._clear()
    assert "lab_train_frequent" in stages.names() and "lab_frequent" in predictors.names()
    assert stages.distribution("lab_train_frequent") == ("lab_frequent", "0.1")

    out = tmp_path / "trained"
    summary = stages.get("lab_train_frequent")(traces=str(qwen3_traces)).run(out, StageContext())
    reader = TraceReader(qwen3_traces)
    assert summary["tokens"] == sum(r.length for r in reader.samples("train")) > 0

    target = make_target("qwen3_moe")
    pred = predictors.get("lab_frequent")(path=str(out))
    pred.setup(target)
    assert (pred.sets.sum(-1) == target.top_k).all()
    drafter = drafters.get("eagle3")(init={"seed": 0})
    drafter.setup(target)
    engine = SpeculativeEngine(target, drafter, selectors.get("ecospec")(), pred)
    gen = torch.Generator().manual_seed(3)
    prompts = [torch.randint(0, target.vocab_size, (n,), generator=gen).tolist() for n in (5, 9)]
    stop = StopRule(8)
    out_sd = engine.generate(prompts, budget=3, steps=2, top_k=2, temperature=0.0, stop=stop)
    assert out_sd.tokens == ar_generate(target, prompts, temperature=0.0, stop=stop).tokens
    assert pred.calls >= 1  # the selector asked this predictor for every step's expert sets


def test_a_trained_target_is_one_folder_plus_entry_points(site, tmp_path):
    _install(site, "lab_toy_target", TARGET_FOLDER,
             {"specmoe.stages": {"lab_pretrain_toy": "lab_toy_target.stage:PretrainToy"}})
    stages._clear()
    assert "lab_pretrain_toy" in stages.names()

    out = tmp_path / "toy"
    losses = stages.get("lab_pretrain_toy")(steps=4).run(out, StageContext())["losses"]
    assert losses[-1] < losses[0]  # it trained
    target = targets.get("hf")(path=str(out), dtype="float32")
    assert target.num_moe_layers >= 1 and target.num_experts > 1
    prompts = [[1, 2, 3, 4], [5, 6]]
    first = ar_generate(target, prompts, temperature=0.0, stop=StopRule(6)).tokens
    assert all(1 <= len(t) <= 6 for t in first)
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    with torch.no_grad():  # the exported weights are the ones decoded: the first greedy token agrees
        nxt = [int(model(input_ids=torch.tensor([p])).logits[0, -1].argmax()) for p in prompts]
    assert [t[0] for t in first] == nxt
