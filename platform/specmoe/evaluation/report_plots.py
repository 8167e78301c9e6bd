# SPDX-License-Identifier: Apache-2.0
"""Analysis figures (paper Fig. 1(a), 1(b), 4, speedup vs γ) as matplotlib Figures (Agg canvas, no pyplot).

Step records are :class:`~specmoe.decoding.records.StepRecord` s or their ``to_dict()`` form.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping, Sequence

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from specmoe.decoding.records import StepRecord

__all__ = [
    "fig_latency_vs_experts",
    "fig_cumulative_experts",
    "fig_expert_heatmap",
    "fig_speedup_vs_gamma",
    "fig_cost_fit",
    "mean_cumulative_experts",
]

Records = Mapping[str, Sequence[Any]]


def _figure(width: float, height: float, ncols: int = 1, **kw: Any) -> tuple[Figure, Any]:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, ncols, **kw)
    return fig, axes


def _as_dict(rec: StepRecord | Mapping[str, Any]) -> dict[str, Any]:
    return rec if isinstance(rec, Mapping) else rec.to_dict()


def _unique_experts(d: Mapping[str, Any]) -> float:
    if d.get("unique_experts") is not None:
        return float(d["unique_experts"])
    per_layer = d["experts_per_layer"]
    return sum(per_layer) / max(len(per_layer), 1)


def _axis(metric: str, unit: str | None = None) -> str:
    """An axis label from the metrics registry: ``<description> (<label>[, unit])``."""
    from specmoe.metrics import get

    m = get(metric)
    return f"{m.description} ({m.label}{', ' + unit if unit else ''})"


def _color(i: int) -> str:
    return f"C{i % 10}"


def fig_latency_vs_experts(records: Records, title: str | None = None) -> Figure:
    """Paper Fig. 1(a): per-step verification latency vs unique experts per layer (E), one scatter per method,
    with a least-squares line over all steps; ``records``: method -> step records (``t_verify`` seconds,
    ``experts_per_layer`` / ``unique_experts``)."""
    fig, ax = _figure(6.0, 4.2)
    xs_all, ys_all = [], []
    for i, (method, recs) in enumerate(records.items()):
        ds = [_as_dict(r) for r in recs]
        xs = [_unique_experts(d) for d in ds]
        ys = [float(d["t_verify"]) * 1e3 for d in ds]
        ax.scatter(xs, ys, s=14, alpha=0.55, color=_color(i), label=method, edgecolors="none")
        xs_all += xs
        ys_all += ys
    if len(set(xs_all)) >= 2:
        n = len(xs_all)
        mx, my = sum(xs_all) / n, sum(ys_all) / n
        sxx = sum((x - mx) ** 2 for x in xs_all)
        slope = sum((x - mx) * (y - my) for x, y in zip(xs_all, ys_all)) / sxx
        lo, hi = min(xs_all), max(xs_all)
        ax.plot(
            [lo, hi],
            [my + slope * (lo - mx), my + slope * (hi - mx)],
            "k--",
            lw=1.2,
            label=f"fit: {slope:.3g} ms / expert",
        )
    ax.set_xlabel(_axis("E"))
    ax.set_ylabel(_axis("t_verify", "ms"))
    ax.set_title(title or "Verification latency vs active experts")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return fig


def mean_cumulative_experts(recs: Sequence[Any]) -> list[float]:
    """Element-wise mean of ``cumulative_experts`` over steps: entry k-1 averages the steps that verified
    at least k tokens."""
    sums: list[float] = []
    counts: list[int] = []
    for r in recs:
        cum = _as_dict(r).get("cumulative_experts") or []
        for k, v in enumerate(cum):
            if k == len(sums):
                sums.append(0.0)
                counts.append(0)
            sums[k] += float(v)
            counts[k] += 1
    return [s / c for s, c in zip(sums, counts)]


def fig_cumulative_experts(records: Records, top_k: int | None = None, title: str | None = None) -> Figure:
    """Paper Fig. 1(b): cumulative unique experts per layer vs verified tokens, one line per method of
    ``records`` (steps without ``cumulative_experts`` are ignored); ``top_k`` (the router's experts per token)
    is drawn as the one-token reference line."""
    fig, ax = _figure(6.0, 4.2)
    kmax = 1
    for i, (method, recs) in enumerate(records.items()):
        curve = mean_cumulative_experts(recs)
        if not curve:
            continue
        ks = list(range(1, len(curve) + 1))
        kmax = max(kmax, len(curve))
        ax.plot(ks, curve, marker="o", ms=4, color=_color(i), label=method)
    if top_k:
        ax.axhline(top_k, color="gray", ls=":", lw=1.2, label=f"Top-{top_k} (one token)")
    ax.set_xlabel("verified tokens (tree order)")
    ax.set_ylabel("cumulative unique experts per layer")
    ax.set_xticks(range(1, kmax + 1) if kmax <= 16 else ax.get_xticks())
    ax.set_xlim(0.7, kmax + 0.3)
    ax.set_title(title or "Expert footprint growth within a verification step")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return fig


def fig_expert_heatmap(expert_counts: Sequence[Sequence[float]], title: str | None = None) -> Figure:
    """Paper Fig. 4: expert activation heatmap (share of each layer's activations per expert) and the
    layer-wise load distribution (expert load / layer mean; box = quartiles, whiskers = 5th-95th percentile),
    from ``expert_counts``: ``[L][E]`` activation counts per MoE layer and expert."""
    from matplotlib.colors import PowerNorm
    from matplotlib.ticker import MaxNLocator

    rows = [[float(v) for v in layer] for layer in expert_counts]
    if not rows or not rows[0]:
        raise ValueError("expert_counts must be a non-empty [layers][experts] table")
    share = [[v / (sum(r) or 1.0) for v in r] for r in rows]
    load = [[v / ((sum(r) / len(r)) or 1.0) for v in r] for r in rows]
    n_layers, n_experts = len(rows), len(rows[0])
    fig, (ax_h, ax_b) = _figure(
        11.0, max(3.2, min(0.18 * n_layers + 1.6, 12.0)), ncols=2, width_ratios=[2.2, 1.0]
    )
    im = ax_h.imshow(
        share,
        aspect="auto",
        origin="lower",
        cmap="viridis",
        interpolation="nearest",
        norm=PowerNorm(gamma=0.5),
        extent=(-0.5, n_experts - 0.5, -0.5, n_layers - 0.5),
    )
    fig.colorbar(im, ax=ax_h, label="share of the layer's activations", pad=0.01)
    ax_h.set_xlabel("expert")
    ax_h.set_ylabel("MoE layer")
    ax_h.set_title("Activation heatmap")
    bp = ax_b.boxplot(
        load,
        positions=list(range(n_layers)),
        widths=0.6,
        whis=(5, 95),
        showfliers=False,
        patch_artist=True,
        medianprops={"color": "k"},
        **_horizontal(),
    )
    for patch in bp["boxes"]:
        patch.set_facecolor("C0")
        patch.set_alpha(0.5)
    ax_b.axvline(1.0, color="gray", ls=":", lw=1)
    ax_b.set_ylim(-0.5, n_layers - 0.5)
    for ax in (ax_h, ax_b):
        ax.yaxis.set_major_locator(MaxNLocator(integer=True, nbins=min(n_layers, 12)))
        ax.xaxis.set_major_locator(MaxNLocator(integer=ax is ax_h, nbins=10))
    ax_b.set_yticklabels([])
    ax_b.set_xlabel("expert load / layer mean")
    ax_b.set_title("Load distribution per layer")
    ax_b.grid(axis="x", alpha=0.3)
    if title:
        fig.suptitle(title)
    return fig


def _horizontal() -> dict[str, Any]:
    import matplotlib

    major, minor = (int(p) for p in matplotlib.__version__.split(".")[:2])
    return {"orientation": "horizontal"} if (major, minor) >= (3, 10) else {"vert": False}


def fig_speedup_vs_gamma(speedups: Mapping[str, Mapping[int, float]], title: str | None = None,
                         intervals: Mapping[str, Mapping[int, Sequence[float]]] | None = None) -> Figure:
    """Speedup over AR vs the verification budget γ, one line per method (paper Appendix C); ``speedups`` /
    ``intervals``: method -> {γ: speedup} / {γ: (lo, hi)}, the latter drawn as error bars where present."""
    fig, ax = _figure(5.5, 4.0)
    gammas: set[int] = set()
    bars = False
    for i, (method, by_gamma) in enumerate(speedups.items()):
        gs = sorted(by_gamma)
        gammas.update(gs)
        ys = [by_gamma[g] for g in gs]
        ax.plot(gs, ys, marker="o", color=_color(i), label=method)
        known = (intervals or {}).get(method, {})
        with_bar = [(g, y, known[g]) for g, y in zip(gs, ys) if g in known]
        if with_bar:
            bars = True
            ax.errorbar([g for g, _, _ in with_bar], [y for _, y, _ in with_bar],
                        yerr=[[y - b[0] for _, y, b in with_bar], [b[1] - y for _, y, b in with_bar]],
                        fmt="none", ecolor=_color(i), capsize=3, lw=1)
    ax.axhline(1.0, color="gray", ls=":", lw=1.2, label="AR")
    ax.set_xticks(sorted(gammas))
    ax.set_xlabel("verification budget γ (tokens per step, bonus included)")
    ax.set_ylabel(_axis("speedup"))
    ax.set_title((title or "Speedup vs verification budget") + (" (bars: 95 % intervals)" if bars else ""))
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return fig


def fig_cost_fit(predicted: Sequence[float], measured: Sequence[float], title: str | None = None) -> Figure:
    """A cost model's predicted vs measured T_verify (ms) over its window; the diagonal is a perfect fit."""
    fig, ax = _figure(4.2, 4.0)
    p = [1e3 * v for v in predicted]
    m = [1e3 * v for v in measured]
    ax.scatter(m, p, s=10, alpha=0.6, color=_color(0))
    hi = max([*p, *m, 1e-3])
    ax.plot([0, hi], [0, hi], color="0.5", linewidth=1, linestyle="--")
    ax.set_xlabel("measured T_verify (ms)")
    ax.set_ylabel("predicted T_verify (ms)")
    ax.set_title(title or "cost model: predicted vs measured")
    return fig
