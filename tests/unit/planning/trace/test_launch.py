"""Rank roles and the one-line failure of a trace."""

from __future__ import annotations

from dapo_megatron.config.parallel import ParallelDims
from dapo_megatron.planning.trace.launch import failure_line, roles


def _dims(tp: int, pp: int, cp: int, dp: int, ep: int = 1) -> ParallelDims:
    return ParallelDims(tp=tp, pp=pp, cp=cp, dp=dp, ep=ep, sequence_parallel=tp > 1)


def test_one_role_per_stage_at_its_first_rank() -> None:
    # Llama-3.1-70B: TP8 PP4 CP2 DP2 = 128 ranks; the stage is the outermost coordinate of
    # Megatron's tp-cp-ep-dp-pp order, so stage k starts at k x 128 / 4.
    got = roles(_dims(8, 4, 2, 2))
    assert [(r.rank, r.stage) for r in got] == [(0, 0), (32, 1), (64, 2), (96, 3)]
    assert got[0].name == "stage 0 (CP rank 0)"
    moe = roles(_dims(2, 1, 1, 16, ep=4))
    assert [(r.rank, r.name) for r in moe] == [(0, "stage 0 (EP rank 0)")]


def test_failure_line_names_the_error_and_the_innermost_megatron_frame() -> None:
    stderr = """\
[rank0]: Traceback (most recent call last):
[rank0]:   File "/work/main/dapo_megatron/megatron/policy.py", line 92, in __init__
[rank0]:     self.optimizer = build_optimizer(
[rank0]:   File "/x/site-packages/megatron/core/optimizer/optimizer.py", line 907, in __init__
[rank0]:     self._scale = torch.tensor([1.0], device='cuda')
[rank0]:   File "/x/site-packages/torch/_ops.py", line 875, in __call__
[rank0]: NotImplementedError: Could not run 'aten::empty_strided' with arguments from 'CUDA'
"""
    line = failure_line(stderr)
    assert line.startswith("NotImplementedError: Could not run 'aten::empty_strided'")
    assert line.endswith("at megatron/core/optimizer/optimizer.py:907 (__init__)")
    assert "\n" not in line
