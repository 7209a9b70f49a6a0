"""Megatron dist checkpoints of the policy (dapo_megatron/megatron/checkpoint.py), on gloo:
bit-exact resume and resharding. Crash safety and a full disk: test_checkpoint_failures.py.

A tiny Qwen2 (HF config built here, random weights, fp32) is trained with Megatron's
pipeline schedule, DDP, ``build_optimizer`` and ``build_scheduler`` (checkpoint_ranks.py):

* bit-exact resume (DP2, plain and distributed optimizer): 4 steps in one go == 2 steps,
  save, 2 more steps in NEW processes after loading (also from a checkpoint taken before
  the first step); == the saving run carrying on after its save (saving does not disturb
  training); the RNG streams resume where they were;
* resharding: checkpoints saved at TP2 and TP2xPP2 load into TP1 with exactly the saved
  weights, and the (plain) optimizer state carries over: one more step at TP1 matches the
  saving layout's next step; weights-only loads; a format mismatch is a clear error.

Megatron is imported inside the rank functions only (the pytest process never needs it).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import torch
from checkpoint_ranks import (
    SAVE_AT,
    TOTAL_STEPS,
    RankPolicy,
    TinyModel,
    init_ranks,
    layout,
    make_tiny_model,
    rng_draws,
    scramble_rng,
)
from launch import run_distributed

from dapo_megatron.config.parallel import ParallelDims
from dapo_megatron.storage.checkpoint_dirs import (
    latest_checkpoint,
)

pytestmark = pytest.mark.distributed


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> TinyModel:
    return make_tiny_model(tmp_path_factory.mktemp("hf"))


# ----------------------------------------------------------------- bit-exact resume

# kind -> (DistributedOptimizer, optimizer name). SGD: Megatron gives it no state
# initialiser, which every load needs (megatron/optimizer.py: init_sgd_state).
OPTIMIZER_KINDS = {"plain": (False, "adam"), "distributed": (True, "adam"), "sgd": (False, "sgd")}


def _save(policy: RankPolicy, directory: Path, step: int, note: str) -> Path:
    from dapo_megatron.megatron.checkpoint import save_checkpoint

    return save_checkpoint(
        directory,
        model=policy.model,
        optimizer=policy.optimizer,
        scheduler=policy.scheduler,
        extra_state={"step": step, "note": note},
        step=step,
    )


def _train_and_save_worker(tiny: TinyModel, root: str) -> dict:
    """Per optimizer kind: 4 uninterrupted steps; then save, 2 steps, save, 2 more steps."""
    from dapo_megatron.megatron.checkpoint_state import capture_rng_state, restore_rng_state
    from dapo_megatron.megatron.distributed import destroy_parallel

    init_ranks(layout(dp=2))
    start_rng = capture_rng_state()
    results = {}
    for kind, (distributed, optimizer_name) in OPTIMIZER_KINDS.items():
        # Both runs start from the same RNG state, as two fresh processes would.
        restore_rng_state(start_rng)
        policy = RankPolicy(tiny, layout(dp=2), distributed, optimizer_name)
        reference = [policy.train_step(s) for s in range(1, TOTAL_STEPS + 1)]
        reference_weights = policy.hf_weights()

        restore_rng_state(start_rng)
        policy = RankPolicy(tiny, layout(dp=2), distributed, optimizer_name)
        # Before any step the optimizer has no state yet: a checkpoint must still work.
        _save(policy, Path(root) / f"{kind}-step0", 0, kind)
        losses = [policy.train_step(s) for s in range(1, SAVE_AT + 1)]
        started = time.monotonic()
        path = _save(policy, Path(root) / kind, SAVE_AT, kind)
        save_seconds = time.monotonic() - started
        draws = rng_draws()
        losses += [policy.train_step(s) for s in range(SAVE_AT + 1, TOTAL_STEPS + 1)]
        results[kind] = dict(
            reference=reference,
            reference_weights=reference_weights,
            losses=losses,
            weights=policy.hf_weights(),
            draws=draws,
            path=str(path),
            save_seconds=save_seconds,
        )
    destroy_parallel()
    return results


def _resume_worker(tiny: TinyModel, root: str) -> dict:
    """Per checkpoint, in fresh processes: build, load, train up to TOTAL_STEPS."""
    from dapo_megatron.megatron.checkpoint import load_checkpoint
    from dapo_megatron.megatron.distributed import destroy_parallel

    init_ranks(layout(dp=2))
    results = {}
    for kind, (distributed, optimizer_name) in OPTIMIZER_KINDS.items():
        for name in (kind, f"{kind}-step0"):
            # The HF weights, not the checkpoint's: a load that misses something shows.
            policy = RankPolicy(tiny, layout(dp=2), distributed, optimizer_name)
            scramble_rng()
            path = latest_checkpoint(Path(root) / name)
            started = time.monotonic()
            extra = load_checkpoint(
                path, model=policy.model, optimizer=policy.optimizer, scheduler=policy.scheduler
            )
            load_seconds = time.monotonic() - started
            draws = rng_draws()
            losses = [policy.train_step(s) for s in range(extra["step"] + 1, TOTAL_STEPS + 1)]
            results[name] = dict(
                extra=extra,
                losses=losses,
                weights=policy.hf_weights(),
                draws=draws,
                path=str(path),
                load_seconds=load_seconds,
            )
    destroy_parallel()
    return results


def _assert_same_weights(
    ours: dict[str, torch.Tensor], expected: dict[str, torch.Tensor], what: str
) -> None:
    assert list(ours) == list(expected), what
    differ = [name for name in ours if not torch.equal(ours[name], expected[name])]
    assert not differ, f"{what}: {len(differ)} tensors differ, e.g. {differ[:3]}"


def _assert_same_draws(ours: dict, expected: dict) -> None:
    assert ours["python"] == expected["python"]
    assert (ours["numpy"] == expected["numpy"]).all()
    assert torch.equal(ours["torch"], expected["torch"])
    assert ours["tracker"].keys() == expected["tracker"].keys()
    assert all(torch.equal(ours["tracker"][k], expected["tracker"][k]) for k in ours["tracker"])


def test_resume_is_bit_exact(tiny: TinyModel, tmp_path: Path) -> None:
    saved = run_distributed(_train_and_save_worker, 2, tiny, str(tmp_path))
    resumed = run_distributed(_resume_worker, 2, tiny, str(tmp_path))
    for kind in OPTIMIZER_KINDS:
        for rank in range(2):
            s, r, r0 = saved[rank][kind], resumed[rank][kind], resumed[rank][f"{kind}-step0"]
            # Saving mid-run does not disturb the run that saved.
            assert s["losses"] == s["reference"], (kind, rank)
            _assert_same_weights(s["weights"], s["reference_weights"], f"{kind} saver")
            # Fresh processes resume exactly: data position, schedule, optimizer, RNG.
            assert r["extra"] == {"step": SAVE_AT, "note": kind}
            assert r["path"] == s["path"] and r["path"].endswith("step_000002")
            assert r["losses"] == s["reference"][SAVE_AT:], (kind, rank, r["losses"])
            _assert_same_weights(r["weights"], s["reference_weights"], f"{kind} resumed")
            _assert_same_draws(r["draws"], s["draws"])
            # From the checkpoint taken before the first step (no optimizer state yet).
            assert r0["losses"] == s["reference"], (kind, rank, r0["losses"])
            _assert_same_weights(r0["weights"], s["reference_weights"], f"{kind} from step 0")
        # The weights moved: equality above is not two untrained models agreeing.
        assert saved[0][kind]["reference"][0] != saved[0][kind]["reference"][-1]
        print(
            f"[{kind}] losses {saved[0][kind]['reference']} save "
            f"{saved[0][kind]['save_seconds']:.2f} s load {resumed[0][kind]['load_seconds']:.2f} s"
        )


# --------------------------------------------------------------------- resharding


def _save_layout_worker(tiny: TinyModel, dims: ParallelDims, root: str) -> dict:
    """1 step, save, 1 more step: the weights at save time and after the next step."""
    from dapo_megatron.megatron.checkpoint import save_checkpoint
    from dapo_megatron.megatron.distributed import destroy_parallel

    init_ranks(dims)
    policy = RankPolicy(tiny, dims, distributed_optimizer=False)
    policy.train_step(1)
    save_checkpoint(
        root,
        model=policy.model,
        optimizer=policy.optimizer,
        scheduler=policy.scheduler,
        extra_state={"step": 1},
        step=1,
    )
    saved = policy.hf_weights()
    policy.train_step(2)
    after = policy.hf_weights()
    destroy_parallel()
    return {"saved": saved, "after": after}


def _load_tp1_worker(tiny: TinyModel, paths: list[str]) -> list[dict]:
    from dapo_megatron.megatron.checkpoint import load_checkpoint
    from dapo_megatron.megatron.distributed import destroy_parallel

    init_ranks(layout())
    results = []
    for path in paths:
        policy = RankPolicy(tiny, layout(), distributed_optimizer=False)
        extra = load_checkpoint(
            path, model=policy.model, optimizer=policy.optimizer, scheduler=policy.scheduler
        )
        loaded = policy.hf_weights()
        policy.train_step(extra["step"] + 1)
        result = {"loaded": loaded, "after": policy.hf_weights()}
        # Weights only (e.g. for evaluation or a new optimizer), and a clear refusal to put
        # per-parameter optimizer state into a DistributedOptimizer.
        other = RankPolicy(tiny, layout(), distributed_optimizer=True)
        load_checkpoint(path, model=other.model, optimizer=None, scheduler=None)
        result["weights_only"] = other.hf_weights()
        try:
            load_checkpoint(path, model=other.model, optimizer=other.optimizer, scheduler=None)
        except ValueError as e:
            result["mismatch_error"] = str(e)
        results.append(result)
    destroy_parallel()
    return results


@pytest.fixture(scope="module")
def layout_checkpoints(tiny: TinyModel, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """Checkpoints saved at TP2 (2 ranks) and TP2xPP2 (4 ranks), with their weights."""
    root = tmp_path_factory.mktemp("layouts")
    result = {}
    for name, dims in {"tp2": layout(tp=2), "tp2xpp2": layout(tp=2, pp=2)}.items():
        per_rank = run_distributed(
            _save_layout_worker, dims.world_size, tiny, dims, str(root / name), timeout=240
        )
        result[name] = {"path": str(root / name / "step_000001"), **per_rank[0]}
    return result


def test_checkpoint_reshards_into_tp1(tiny: TinyModel, layout_checkpoints: dict) -> None:
    names = list(layout_checkpoints)
    (loaded,) = run_distributed(
        _load_tp1_worker, 1, tiny, [layout_checkpoints[n]["path"] for n in names]
    )
    for name, ours in zip(names, loaded, strict=True):
        saved = layout_checkpoints[name]
        marker = json.loads((Path(saved["path"]) / "complete.json").read_text())
        assert marker["layout"]["tp"] == 2 and marker["step"] == 1
        _assert_same_weights(ours["loaded"], saved["saved"], f"{name} -> tp1")
        _assert_same_weights(ours["weights_only"], saved["saved"], f"{name} -> tp1 weights")
        assert "per_parameter optimizer state" in ours["mismatch_error"]
        # Optimizer state (Adam moments, step) and schedule were resharded too: the next
        # step agrees with the saving layout's up to fp32 reduction order.
        worst = max(
            (ours["after"][k] - saved["after"][k]).abs().max().item() for k in saved["after"]
        )
        moved = max(
            (saved["after"][k] - saved["saved"][k]).abs().max().item() for k in saved["after"]
        )
        print(f"[{name} -> tp1] max |next-step weight diff| {worst:.2e} (step moved {moved:.2e})")
        assert worst < 1e-5 < moved
