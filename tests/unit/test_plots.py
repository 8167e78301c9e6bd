# SPDX-License-Identifier: Apache-2.0
"""Analysis figures build from synthetic step records and save as PNG."""

from __future__ import annotations

import random

import pytest

from specmoe.decoding.records import StepRecord
from specmoe.evaluation.report_plots import (
    fig_cumulative_experts,
    fig_expert_heatmap,
    fig_latency_vs_experts,
    fig_speedup_vs_gamma,
    mean_cumulative_experts,
)

PNG = b"\x89PNG\r\n\x1a\n"


def _records(seed: int, spread: float, n: int = 40) -> list[StepRecord]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        m = rng.randint(1, 4)
        cum = [2.0]
        for _ in range(m - 1):
            cum.append(cum[-1] + spread * rng.random())
        per_layer = [round(cum[-1]) + rng.randint(0, 1) for _ in range(3)]
        e = sum(per_layer) / 3
        out.append(
            StepRecord(
                accepted=[rng.randint(1, m)],
                verified=[m],
                experts_per_layer=per_layer,
                t_verify=0.002 + 0.0005 * e + rng.random() * 1e-4,
                t_total=0.003,
                cumulative_experts=cum,
            )
        )
    return out


@pytest.fixture
def by_method() -> dict:
    # one method as StepRecord objects, one as their dict form (both accepted)
    return {"confidence": _records(0, 1.6), "ecospec": [r.to_dict() for r in _records(1, 0.6)]}


def _save(fig, path) -> bytes:
    fig.savefig(path, dpi=80)
    data = path.read_bytes()
    assert data.startswith(PNG) and len(data) > 5000
    return data


def test_mean_cumulative_experts_averages_by_k():
    recs = [
        {"cumulative_experts": [2.0, 3.0, 5.0]},
        {"cumulative_experts": [2.0, 4.0]},
        {"cumulative_experts": None},
    ]
    assert mean_cumulative_experts(recs) == [2.0, 3.5, 5.0]
    assert mean_cumulative_experts([]) == []


def test_latency_vs_experts(by_method, tmp_path):
    fig = fig_latency_vs_experts(by_method, title="tiny")
    ax = fig.axes[0]
    assert len(ax.collections) == 2  # one scatter per method
    fit = [ln for ln in ax.get_lines() if ln.get_label().startswith("fit")]
    assert len(fit) == 1
    slope = float(fit[0].get_label().split()[1])
    assert slope == pytest.approx(0.5, rel=0.2)  # 0.5 ms per expert in the synthetic data
    _save(fig, tmp_path / "fig1a.png")


def test_cumulative_experts(by_method, tmp_path):
    fig = fig_cumulative_experts(by_method, top_k=2)
    lines = {ln.get_label(): ln for ln in fig.axes[0].get_lines()}
    assert set(lines) == {"confidence", "ecospec", "Top-2 (one token)"}
    expected = mean_cumulative_experts(by_method["ecospec"])
    assert list(lines["ecospec"].get_ydata()) == pytest.approx(expected)
    assert list(lines["ecospec"].get_xdata()) == list(range(1, len(expected) + 1))
    # the faster-scattering selector ends higher
    assert lines["confidence"].get_ydata()[-1] > lines["ecospec"].get_ydata()[-1]
    _save(fig, tmp_path / "fig1b.png")


def test_expert_heatmap(tmp_path):
    rng = random.Random(0)
    counts = [[rng.randint(0, 50) * (3 if e == layer % 16 else 1) for e in range(16)] for layer in range(6)]
    fig = fig_expert_heatmap(counts, title="tiny qwen3-moe")
    ax_h = fig.axes[0]
    shares = ax_h.images[0].get_array()
    assert shares.shape == (6, 16)
    assert list(shares.sum(axis=1)) == pytest.approx([1.0] * 6)
    _save(fig, tmp_path / "fig4.png")
    with pytest.raises(ValueError):
        fig_expert_heatmap([])


def test_speedup_vs_gamma(tmp_path):
    fig = fig_speedup_vs_gamma(
        {"eagle3": {3: 1.25, 4: 1.31, 5: 1.15, 6: 1.02}, "ecospec": {6: 1.09, 3: 1.28, 4: 1.39, 5: 1.25}}
    )
    lines = {ln.get_label(): ln for ln in fig.axes[0].get_lines()}
    assert list(lines["ecospec"].get_xdata()) == [3, 4, 5, 6]
    assert list(lines["ecospec"].get_ydata()) == [1.28, 1.39, 1.25, 1.09]
    assert "AR" in lines
    _save(fig, tmp_path / "speedup_gamma.png")


def test_speedup_vs_gamma_error_bars(tmp_path):
    """Points with a confidence interval get an error bar from lo to hi; points without get none."""
    fig = fig_speedup_vs_gamma({"eagle3": {3: 1.25, 4: 1.31}, "ecospec": {3: 1.28, 4: 1.39}},
                               intervals={"ecospec": {3: (1.20, 1.33), 4: (1.30, 1.50)}})
    ax = fig.axes[0]
    bars = [c for c in ax.collections if c.get_segments()]
    assert len(bars) == 1  # only ecospec has intervals
    segments = sorted((float(s[0][0]), float(s[0][1]), float(s[1][1])) for s in bars[0].get_segments())
    assert segments == [pytest.approx((3.0, 1.20, 1.33)), pytest.approx((4.0, 1.30, 1.50))]
    assert "95 % intervals" in ax.get_title()
    _save(fig, tmp_path / "speedup_gamma_bars.png")


def test_old_tracking_plots_module_gives_the_moved_names_with_a_warning():
    import importlib

    from specmoe.evaluation import report_plots

    old = importlib.import_module("specmoe.tracking.plots")
    for name in report_plots.__all__:
        with pytest.warns(DeprecationWarning, match=f"specmoe.evaluation.report_plots.{name}"):
            assert getattr(old, name) is getattr(report_plots, name)
