"""What a batch says about its rows, read from the values of its tensors (never from their names).

- packed rows: several examples in one row, told by position ids that restart (each run counts up by one and
  starts again at the row's first value), by cumulative sequence lengths (a 1-D integer tensor from 0 up to the
  number of tokens, as FlashAttention's `cu_seqlens` / transformers' `cu_seq_lens_q`), by segment ids (a row that
  counts 0, 0, 1, 1, 1, 2 ...), or by a block-diagonal 4-D mask;
- padding: a 0/1 tensor of the tokens' shape with zeros, so padded positions are never sampled;
- an all-ones 0/1 tensor of the tokens' shape (an attention mask that keeps everything).

Each finding is the batch entry it was read from (`where`: a path such as `kwargs.position_ids`), for the message.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

MIN_SEGMENT = 2  # a packed example of one token is no example to sample


def batch_entries(batch: Any, path: str = "batch", depth: int = 0) -> Iterator[tuple[str, torch.Tensor]]:
    """Every tensor of a batch (tensor, tuple/list, dict, (args, kwargs)), with its path."""
    if depth > 4:
        return
    if isinstance(batch, torch.Tensor):
        yield path, batch
    elif isinstance(batch, dict):
        for k, v in batch.items():
            yield from batch_entries(v, f"{path}.{k}" if path != "batch" else str(k), depth + 1)
    elif isinstance(batch, (tuple, list)):
        if (len(batch) == 2 and isinstance(batch[0], (tuple, list)) and isinstance(batch[1], dict) and depth == 0):
            for i, v in enumerate(batch[0]):
                yield from batch_entries(v, f"args[{i}]", depth + 1)
            yield from batch_entries(batch[1], "batch", depth)
            return
        for i, v in enumerate(batch):
            yield from batch_entries(v, f"{path}[{i}]", depth + 1)


@dataclass
class Segments:
    """Packed rows: `ids[b, t]` is the example that token t of row b belongs to (-1: padding, not sampled)."""

    ids: torch.Tensor  # (B, T) long
    how: str  # "position ids that restart", "cumulative sequence lengths", "segment ids", "a block-diagonal mask"
    where: str  # the batch entry it was read from
    spans: list[list[tuple[int, int]]] = field(default_factory=list)  # per row: (start, end) of each example

    @property
    def packed_rows(self) -> list[int]:
        return [b for b, row in enumerate(self.spans) if len(row) >= 2]

    def count(self) -> int:
        return sum(len(row) for row in self.spans)

    def describe(self) -> str:
        return f"{self.how} in `{self.where}`"


def _spans(ids: torch.Tensor) -> list[list[tuple[int, int]]]:
    out = []
    for row in ids.tolist():
        spans: list[tuple[int, int]] = []
        start = 0
        for t in range(1, len(row) + 1):
            if t == len(row) or row[t] != row[t - 1]:
                if row[start] >= 0 and t - start >= MIN_SEGMENT:
                    spans.append((start, t))
                start = t
        out.append(spans)
    return out


def _is_int(t: torch.Tensor) -> bool:
    return not t.is_floating_point() and not t.is_complex() and t.dtype != torch.bool


def _rows(t: torch.Tensor, B: int, T: int) -> torch.Tensor | None:
    """The tensor as (B, T) when it is laid out per token (a (1, T) tensor is broadcast over the rows)."""
    if t.dim() == 2 and t.shape[1] == T and t.shape[0] in (1, B):
        return t.expand(B, T)
    return None


def restarting_positions(t: torch.Tensor, keep: torch.Tensor | None) -> torch.Tensor | None:
    """Segment ids from position ids that restart: inside a row every step is +1, every other step goes back to the
    row's first value; at least one row restarts. Padded tokens (keep == 0) are -1."""
    if t.numel() == 0:
        return None
    first = t[:, :1]
    step = torch.diff(t, dim=-1)
    restart = step != 1
    if not bool(restart.any()):
        return None
    if not bool((t[:, 1:][restart] == first.expand_as(t[:, 1:])[restart]).all()):
        return None
    ids = torch.cat([torch.zeros_like(first), restart.long()], dim=-1).cumsum(-1)
    if keep is not None:
        ids = ids.cpu().masked_fill(keep == 0, -1)
    return ids


def _segment_ids(t: torch.Tensor, keep: torch.Tensor | None) -> torch.Tensor | None:
    """A row that counts examples: non-decreasing by steps of 0 or 1, at least three values (two values are as likely
    a padding mask or BERT's token types)."""
    step = torch.diff(t, dim=-1)
    if not bool(((step == 0) | (step == 1)).all()) or int((t.amax(-1) - t.amin(-1)).max()) < 2:
        return None
    ids = (t - t[:, :1]).cpu()
    return ids.masked_fill(keep == 0, -1) if keep is not None else ids


def _cumulative(t: torch.Tensor, B: int, T: int) -> torch.Tensor | None:
    """Cumulative sequence lengths of a flattened batch: 0, then strictly increasing up to B*T, at least 3 entries."""
    if t.dim() != 1 or t.numel() < 3 or int(t[0]) != 0 or int(t[-1]) != B * T or not bool((torch.diff(t) > 0).all()):
        return None
    flat = torch.zeros(B * T, dtype=torch.long)
    flat[t[1:-1].long().cpu()] = 1
    return flat.cumsum(0).view(B, T)


def _block_mask(t: torch.Tensor, B: int, T: int) -> torch.Tensor | None:
    """Segments from a 4-D (B, 1, T, T) or 3-D (B, T, T) mask that is block-diagonal (causal inside a block or not)."""
    m = t[:, 0] if t.dim() == 4 and t.shape[1] == 1 else t if t.dim() == 3 else None
    if m is None or tuple(m.shape) != (m.shape[0], T, T) or m.shape[0] not in (1, B):
        return None
    allowed = (m > -1e4) if m.is_floating_point() else m.bool()
    allowed = allowed.expand(B, T, T)
    sees_prev = torch.diagonal(allowed, offset=-1, dim1=1, dim2=2)  # token t sees t-1
    ids = torch.cat([torch.zeros(B, 1, dtype=torch.long), (~sees_prev).long().cpu()], dim=-1).cumsum(-1)
    same = ids.unsqueeze(2) == ids.unsqueeze(1)
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    block = same & causal if not bool(allowed.triu(1).any()) else same
    if int(ids.max()) < 1 or not torch.equal(block, allowed.cpu()):
        return None
    return ids


def find_padding(batch: Any, B: int, T: int) -> tuple[torch.Tensor | None, str | None, bool]:
    """(a 0/1 keep-mask of the tokens with zeros, its entry, whether an all-ones 0/1 tensor of that shape is there)."""
    all_ones = False
    for where, t in batch_entries(batch):
        r = _rows(t, B, T) if (_is_int(t) or t.dtype == torch.bool) else None
        if r is None or not bool(((r == 0) | (r == 1)).all()):
            continue
        if bool((r == 1).all()):
            all_ones = True
        elif bool((r[:, 0] == 1).all() or (r[:, -1] == 1).all()):  # a padding mask keeps one end of every row
            return r.long().cpu(), where, all_ones
    return None, None, all_ones


def find_segments(batch: Any, B: int, T: int, tokens: torch.Tensor | None = None) -> Segments | None:
    """Packed rows told by the batch's own values (see the module's docstring); `tokens` (the ids fed to the model's
    embedding) is never taken for position or segment ids."""
    keep, _, _ = find_padding(batch, B, T)
    for where, t in batch_entries(batch):
        if tokens is not None and t is tokens:
            continue
        if _is_int(t):
            r = _rows(t, B, T)
            found = [(restarting_positions(r, keep), "position ids that restart"),
                     (_segment_ids(r, keep), "segment ids")] if r is not None else []
            found.append((_cumulative(t, B, T), "cumulative sequence lengths"))
        else:
            found = [(_block_mask(t, B, T), "a block-diagonal mask")] if t.dim() in (3, 4) else []
        for ids, how in found:
            if ids is not None:
                ids = ids.cpu()
                seg = Segments(ids=ids, how=how, where=where, spans=_spans(ids))
                if seg.packed_rows:
                    return seg
    return None
