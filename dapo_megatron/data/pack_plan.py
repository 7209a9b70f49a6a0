"""Which sequences go in which packed micro-batch, and on which data-parallel rank.

Plain Python (no torch): the controller deals rows to ranks with it. The tensors of a pack
are built in data/packing.py; the sequence-length multiple of the parallel layout, which
config validation also checks the token budget with, is in config/parallel.py.
"""

from __future__ import annotations

from collections.abc import Sequence

from dapo_megatron.config.parallel import padded_length

MAX_TOKENS_KEY = "policy.max_tokens_per_microbatch"


def plan_packs(lengths: Sequence[int], max_tokens: int, *, multiple: int) -> list[list[int]]:
    """Rows grouped into packs of at most ``max_tokens`` padded tokens.

    First-fit decreasing (longest row first, into the first pack with room): few packs, and
    deterministic. Rows of length 0 (batch padding) go in no pack. Each pack lists its rows
    in increasing index order.

    Raises:
        ValueError: a row longer than the budget, naming the knobs that fix it.
    """
    if max_tokens < multiple:
        raise ValueError(f"{MAX_TOKENS_KEY} = {max_tokens}: must be >= {multiple}")
    order = sorted((i for i, n in enumerate(lengths) if n > 0), key=lambda i: (-lengths[i], i))
    packs: list[list[int]] = []
    room: list[int] = []
    for i in order:
        need = padded_length(lengths[i], multiple)
        if need > max_tokens:
            raise ValueError(
                f"{MAX_TOKENS_KEY} = {max_tokens}: sequence {i} has {lengths[i]} tokens "
                f"({need} padded to a multiple of {multiple}); raise the budget to at least "
                f"data.max_prompt_length + generation.max_response_length (padded), or lower "
                f"those"
            )
        for p, free in enumerate(room):
            if need <= free:
                packs[p].append(i)
                room[p] -= need
                break
        else:
            packs.append([i])
            room.append(max_tokens - need)
    return [sorted(p) for p in packs]


def balance_by_tokens(lengths: Sequence[int], parts: int) -> list[list[int]]:
    """Rows dealt to ``parts`` data-parallel ranks so their TOKEN counts are even.

    Longest row first to the rank with the fewest tokens so far (ties: fewer rows, then the
    lower rank). Each part lists its rows in increasing index order.
    """
    if parts < 1:
        raise ValueError(f"parts = {parts}: must be >= 1")
    tokens = [0] * parts
    counts = [0] * parts
    out: list[list[int]] = [[] for _ in range(parts)]
    for i in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
        p = min(range(parts), key=lambda k: (tokens[k], counts[k], k))
        out[p].append(i)
        tokens[p] += lengths[i]
        counts[p] += 1
    return [sorted(p) for p in out]
