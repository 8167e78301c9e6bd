# SPDX-License-Identifier: Apache-2.0
"""Draft <-> target vocabulary maps of EAGLE-3 (``d2t`` / ``t2d``) built from token frequencies.

The draft vocabulary is the ``draft_vocab_size`` most frequent target tokens of the training targets
(loss-masked tokens), ties and unseen fill-ins by ascending id, sorted ascending into ``used``. Then::

    d2t[i] = used[i] - i        (an offset: target id = i + d2t[i])
    t2d[v] = v in used          (bool over the target vocabulary)

so ``nonzero(t2d) == d2t + arange(draft_vocab_size)`` (the consistency check SpecForge runs).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch

__all__ = ["build_vocab_map", "check_vocab_map", "identity_vocab_map", "token_counts"]


def token_counts(sequences: Iterable[Sequence[int]], vocab_size: int) -> torch.Tensor:
    """``[V]`` int64 occurrence counts of the ids in ``sequences`` (ids outside ``[0, V)`` are an error)."""
    counts = torch.zeros(vocab_size, dtype=torch.long)
    for seq in sequences:
        if len(seq) == 0:
            continue
        ids = torch.as_tensor(list(seq), dtype=torch.long)
        if int(ids.min()) < 0 or int(ids.max()) >= vocab_size:
            raise ValueError(f"token id outside the vocabulary [0, {vocab_size}) in the training data")
        counts += torch.bincount(ids, minlength=vocab_size)
    return counts


def build_vocab_map(counts: torch.Tensor, draft_vocab_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(d2t [Vd] int64, t2d [V] bool)`` keeping the ``draft_vocab_size`` most frequent ids.

    Args:
        counts: ``[V]`` token counts (see :func:`token_counts`).
        draft_vocab_size: ``Vd <= V``.
    """
    v = counts.numel()
    if not 0 < draft_vocab_size <= v:
        raise ValueError(f"draft_vocab_size must be in [1, {v}], got {draft_vocab_size}")
    ids = torch.arange(v)
    # sort by count descending, then id ascending (stable sort on the negated counts keeps id order)
    order = torch.sort(-counts.to(torch.long), stable=True).indices
    used = torch.sort(ids[order[:draft_vocab_size]]).values
    d2t = used - torch.arange(draft_vocab_size)
    t2d = torch.zeros(v, dtype=torch.bool)
    t2d[used] = True
    return d2t, t2d


def identity_vocab_map(vocab_size: int, draft_vocab_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The map of the first ``draft_vocab_size`` ids (what an untrained drafter starts with)."""
    return build_vocab_map(torch.zeros(vocab_size, dtype=torch.long), draft_vocab_size)


def check_vocab_map(d2t: torch.Tensor, t2d: torch.Tensor) -> None:
    """Raise ``ValueError`` unless ``nonzero(t2d) == d2t + arange`` (sorted, in range, consistent)."""
    used = d2t.long().cpu() + torch.arange(d2t.numel())
    if used.numel() and (int(used.min()) < 0 or int(used.max()) >= t2d.numel()):
        raise ValueError("d2t maps draft ids outside the target vocabulary")
    nz = t2d.cpu().nonzero().squeeze(1)
    if nz.shape != used.shape or not bool((nz == used).all()):
        raise ValueError(f"d2t and t2d disagree: t2d has {nz.numel()} ids, d2t maps {used.numel()}; "
                         f"nonzero(t2d) must equal d2t + arange(draft_vocab_size)")
