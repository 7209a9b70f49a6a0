"""The batch format exchanged between the controller and the policy workers.

Every per-token tensor is TOKEN-ALIGNED: ``[B, S]`` over the right-padded prompt+response
sequence, and entry ``[b, t]`` belongs to token ``input_ids[b, t]`` (its logprob is
``log p(token t | tokens < t)``; position 0 has none and is never in a loss mask). Keeping
one convention on the wire avoids the classic off-by-one between "logprob of the next
token" and "logprob of this token"; the workers shift internally.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import torch


@dataclass
class PolicyBatch:
    """B samples for the policy, right-padded to a common length S."""

    input_ids: torch.Tensor
    """[B, S] int64 prompt + response tokens, right-padded (pad value irrelevant)."""
    loss_mask: torch.Tensor
    """[B, S] 1 for tokens whose logprob is trained (response tokens not filtered out)."""
    advantages: torch.Tensor | None = None
    """[B] per-sample or [B, S] per-token advantages (DAPO training)."""
    old_logprobs: torch.Tensor | None = None
    """[B, S] logprobs under the policy before this step's updates (the PPO ratio's base)."""
    rollout_logprobs: torch.Tensor | None = None
    """[B, S] logprobs the generation engine reported (rollout/train mismatch correction)."""
    ref_logprobs: torch.Tensor | None = None
    """[B, S] logprobs under the reference policy (KL penalty)."""
    lengths: torch.Tensor | None = None
    """[B] int64 real tokens of each row (prompt + response); None = the whole row. Packed
    micro-batches (data/packing.py) keep only these tokens."""
    routed_experts: torch.Tensor | None = None
    """[B, S, layers, k] routing replay: the experts the rollout engine routed token t to
    in each MoE layer (``Sample.routed_experts``); 0 where no engine forward read the token
    (a row's last token, padding)."""

    def __post_init__(self) -> None:
        if self.input_ids.dim() != 2:
            raise ValueError(f"input_ids must be [B, S], got shape {tuple(self.input_ids.shape)}")
        shape = self.input_ids.shape
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if value is None or field.name == "input_ids":
                continue
            if field.name == "lengths":
                ok = value.shape == shape[:1]
            elif field.name == "routed_experts":
                ok = value.dim() == 4 and value.shape[:2] == shape
            else:
                ok = value.shape == shape or (
                    field.name == "advantages" and value.shape == shape[:1]
                )
            if not ok:
                expected = {
                    "lengths": "[B]",
                    "routed_experts": f"{tuple(shape)} + [layers, k]",
                }.get(field.name, str(tuple(shape)))
                raise ValueError(
                    f"{field.name} has shape {tuple(value.shape)}; expected {expected}"
                    + (" or [B]" if field.name == "advantages" else "")
                )
        if self.lengths is not None and bool((self.lengths > shape[1]).any()):
            raise ValueError(f"lengths exceed the row length {shape[1]}")

    def __len__(self) -> int:
        return self.input_ids.shape[0]

    @property
    def seq_len(self) -> int:
        return self.input_ids.shape[1]

    def select(self, index: slice | torch.Tensor) -> PolicyBatch:
        """The samples at `index` (a slice or a 1-D index tensor)."""
        # Any: the fields differ (Tensor / Tensor | None); __post_init__ checks the result.
        fields: dict[str, Any] = {
            f.name: None if getattr(self, f.name) is None else getattr(self, f.name)[index]
            for f in dataclasses.fields(self)
        }
        return PolicyBatch(**fields)

    def pad_to(self, num_samples: int, seq_len: int) -> PolicyBatch:
        """Append samples (copies of padding with an empty loss mask) and columns.

        Pipeline schedules need every micro-batch to have the same shape, so a short batch
        is filled with samples that contribute nothing to any loss.
        """
        if num_samples < len(self) or seq_len < self.seq_len:
            raise ValueError(
                f"pad_to({num_samples}, {seq_len}) cannot shrink a batch of {len(self)} x "
                f"{self.seq_len}"
            )
        out: dict[str, Any] = {}  # field name -> value, as in select()
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if value is None:
                out[f.name] = None
                continue
            rows = num_samples - value.shape[0]
            padded = torch.cat([value, value.new_zeros((rows, *value.shape[1:]))])
            if padded.dim() >= 2:  # per-token: [B, S] or [B, S, layers, k]
                columns = (num_samples, seq_len - padded.shape[1], *padded.shape[2:])
                padded = torch.cat([padded, padded.new_zeros(columns)], dim=1)
            out[f.name] = padded
        return PolicyBatch(**out)
