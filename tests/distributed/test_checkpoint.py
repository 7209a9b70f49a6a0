"""Megatron dist checkpoints of the policy (dapo_megatron/megatron/checkpoint.py), on gloo.

A tiny Qwen2 (HF config built here, random weights, fp32) is trained with Megatron's
pipeline schedule, DDP, ``build_optimizer`` and ``build_scheduler``:

* bit-exact resume (DP2, plain and distributed optimizer): 4 steps in one go == 2 steps,
  save, 2 more steps in NEW processes after loading (also from a checkpoint taken before
  the first step); == the saving run carrying on after its save (saving does not disturb
  training); the RNG streams resume where they were;
* resharding: checkpoints saved at TP2 and TP2xPP2 load into TP1 with exactly the saved
  weights, and the (plain) optimizer state carries over: one more step at TP1 matches the
  saving layout's next step; weights-only loads; a format mismatch is a clear error;
* crash safety: a rank SIGKILLed in the middle of writing a checkpoint leaves the previous
  one as ``latest_checkpoint``, loadable (there: DistributedOptimizer state saved at DP2
  into DP1); ``prune_checkpoints`` keeps the newest K and removes the leftovers;
* verified checkpoints: the marker lists every file's size and SHA-256 (hashed by both
  ranks), and the checkpoint verifies;
* a full disk (a real tiny tmpfs when this runs as root, else ENOSPC injected into the
  shard writers) makes the save raise one line, ``saving checkpoint to <path> failed:
  [Errno 28] No space left on device``, and leaves no ``.tmp`` directory.

Megatron is imported inside the rank functions only (the pytest process never needs it).
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import io
import json
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch
from launch import run_distributed

from dapo_megatron.checkpoint_dirs import (
    checkpoint_files,
    latest_checkpoint,
    prune_checkpoints,
    publish,
    read_marker,
    temporary_sibling,
    verify_checkpoint,
)
from dapo_megatron.config.model_arch import ModelArch, arch_from_hf_config
from dapo_megatron.config.parallel import ParallelDims
from dapo_megatron.config.schema import OptimizerConfig, SchedulerConfig

pytestmark = pytest.mark.distributed

SEQ, MICRO_BATCHES = 16, 2
TOTAL_STEPS, SAVE_AT = 4, 2
OPTIMIZER = OptimizerConfig(
    name="adam",
    lr=3e-3,
    min_lr=3e-4,
    weight_decay=0.01,
    adam_beta1=0.9,
    adam_beta2=0.95,
    adam_eps=1e-8,
    clip_grad=1.0,
)
# Warm-up then cosine decay: the resumed run must also restore the schedule's position.
SCHEDULER = SchedulerConfig(
    lr_warmup_steps=2, lr_warmup_init=3e-4, lr_decay_style="cosine", lr_decay_steps=None
)


def _layout(tp: int = 1, pp: int = 1, dp: int = 1) -> ParallelDims:
    return ParallelDims(tp=tp, pp=pp, cp=1, dp=dp, sequence_parallel=False)


@dataclasses.dataclass(frozen=True)
class TinyModel:
    hf_dir: str
    arch: ModelArch


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> TinyModel:
    # Imported here: the rank processes import this module too and never need it.
    import transformers

    config = transformers.Qwen2Config(
        vocab_size=160,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    model = transformers.Qwen2ForCausalLM(config)
    with torch.no_grad():
        for name, param in model.named_parameters():
            # HF inits biases to 0 and norms to 1: random values exercise every mapping.
            if name.endswith("norm.weight"):
                param.copy_(1.0 + 0.2 * torch.randn_like(param))
            else:
                param.normal_(0.0, 0.1)
    hf_dir = tmp_path_factory.mktemp("hf") / "qwen2"
    model.save_pretrained(hf_dir)
    return TinyModel(str(hf_dir), arch_from_hf_config(config.to_dict(), "test qwen2"))


# --------------------------------------------------------------- rank-side helpers


class _Policy:
    """One rank's DDP model, optimizer and scheduler, built from the HF checkpoint."""

    def __init__(
        self,
        tiny: TinyModel,
        dims: ParallelDims,
        distributed_optimizer: bool,
        optimizer_name: str = "adam",
    ):
        from dapo_megatron.megatron.hf_weights import load_hf_checkpoint
        from dapo_megatron.megatron.model import build_model
        from dapo_megatron.megatron.optimizer import build_optimizer, build_scheduler, wrap_ddp

        self.tiny, self.dims = tiny, dims
        module = build_model(tiny.arch, dims, "fp32")
        load_hf_checkpoint(module, tiny.hf_dir, tiny.arch, dims)
        self.model = [
            wrap_ddp(module, module.config, use_distributed_optimizer=distributed_optimizer)
        ]
        self.optimizer = build_optimizer(
            self.model,
            dataclasses.replace(OPTIMIZER, name=optimizer_name),
            precision="fp32",
            use_distributed_optimizer=distributed_optimizer,
        )
        self.scheduler = build_scheduler(
            self.optimizer, OPTIMIZER, SCHEDULER, total_optimizer_steps=TOTAL_STEPS
        )

    def train_step(self, step: int) -> float | None:
        """One optimizer step on the batch of ``step``; the mean loss on the last stage."""
        from megatron.core import parallel_state, tensor_parallel
        from megatron.core.distributed import finalize_model_grads
        from megatron.core.pipeline_parallel import get_forward_backward_func

        def forward_step(
            data: Iterator[torch.Tensor], model: torch.nn.Module
        ) -> tuple[torch.Tensor, Callable]:
            tokens = next(data)
            inputs, labels = tokens[:, :-1], tokens[:, 1:]
            positions = torch.arange(inputs.shape[1]).expand_as(inputs)
            logits = model(inputs, positions, None)

            def loss_func(output: torch.Tensor) -> tuple[torch.Tensor, dict]:
                loss = tensor_parallel.vocab_parallel_cross_entropy(output.float(), labels).mean()
                return loss, {"loss": loss.detach()}

            return logits, loss_func

        for chunk in self.model:
            chunk.zero_grad_buffer()
        self.optimizer.zero_grad()
        outputs = get_forward_backward_func()(
            forward_step_func=forward_step,
            data_iterator=iter(_batch(step).split(1)),
            model=self.model,
            num_microbatches=MICRO_BATCHES,
            seq_length=SEQ,
            micro_batch_size=1,
            forward_only=False,
        )
        finalize_model_grads(self.model)
        updated, _, _ = self.optimizer.step()
        assert updated
        self.scheduler.step(increment=1)
        if not parallel_state.is_pipeline_last_stage():
            return None
        return torch.stack([o["loss"] for o in outputs]).mean().item()

    def hf_weights(self) -> dict[str, torch.Tensor]:
        from dapo_megatron.megatron.hf_weights import export_hf_weights

        return dict(export_hf_weights(self.model[0], self.tiny.arch, self.dims))


def _batch(step: int) -> torch.Tensor:
    """[micro-batches, SEQ + 1] tokens of this DP rank for ``step``: the data stream.

    A function of (step, DP rank) only, like a dataloader restored to its position: a
    resumed run and a run on another layout see the same samples.
    """
    from megatron.core import parallel_state

    generator = torch.Generator().manual_seed(1000 * step + parallel_state.get_data_parallel_rank())
    return torch.randint(0, 160, (MICRO_BATCHES, SEQ + 1), generator=generator)


def _rng_draws() -> dict[str, object]:
    """One draw from each RNG stream a checkpoint restores (Megatron's tracker: its states,
    since a draw inside ``fork()`` on CPU trips Megatron's CPU-RNG-changed warning)."""
    import random

    import numpy as np
    from megatron.core.tensor_parallel import get_cuda_rng_tracker

    tracker = get_cuda_rng_tracker().get_states()
    return {
        "python": random.random(),
        "numpy": np.random.rand(3),
        "torch": torch.rand(3),
        "tracker": {name: state.clone() for name, state in tracker.items()},
    }


def _scramble_rng() -> None:
    """Move every RNG stream elsewhere: only a restore brings them back to the saved ones."""
    import random

    import numpy as np
    from megatron.core.tensor_parallel import model_parallel_cuda_manual_seed

    random.seed(99)
    np.random.seed(99)
    torch.manual_seed(99)
    model_parallel_cuda_manual_seed(99)


def _init(dims: ParallelDims) -> None:
    from dapo_megatron.megatron.distributed import initialize_parallel

    initialize_parallel(dims, seed=1234)


# ----------------------------------------------------------------- bit-exact resume

# kind -> (DistributedOptimizer, optimizer name). SGD: Megatron gives it no state
# initialiser, which every load needs (megatron/optimizer.py: init_sgd_state).
OPTIMIZER_KINDS = {"plain": (False, "adam"), "distributed": (True, "adam"), "sgd": (False, "sgd")}


def _save(policy: _Policy, directory: Path, step: int, note: str) -> Path:
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

    _init(_layout(dp=2))
    start_rng = capture_rng_state()
    results = {}
    for kind, (distributed, optimizer_name) in OPTIMIZER_KINDS.items():
        # Both runs start from the same RNG state, as two fresh processes would.
        restore_rng_state(start_rng)
        policy = _Policy(tiny, _layout(dp=2), distributed, optimizer_name)
        reference = [policy.train_step(s) for s in range(1, TOTAL_STEPS + 1)]
        reference_weights = policy.hf_weights()

        restore_rng_state(start_rng)
        policy = _Policy(tiny, _layout(dp=2), distributed, optimizer_name)
        # Before any step the optimizer has no state yet: a checkpoint must still work.
        _save(policy, Path(root) / f"{kind}-step0", 0, kind)
        losses = [policy.train_step(s) for s in range(1, SAVE_AT + 1)]
        started = time.monotonic()
        path = _save(policy, Path(root) / kind, SAVE_AT, kind)
        save_seconds = time.monotonic() - started
        draws = _rng_draws()
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

    _init(_layout(dp=2))
    results = {}
    for kind, (distributed, optimizer_name) in OPTIMIZER_KINDS.items():
        for name in (kind, f"{kind}-step0"):
            # The HF weights, not the checkpoint's: a load that misses something shows.
            policy = _Policy(tiny, _layout(dp=2), distributed, optimizer_name)
            _scramble_rng()
            path = latest_checkpoint(Path(root) / name)
            started = time.monotonic()
            extra = load_checkpoint(
                path, model=policy.model, optimizer=policy.optimizer, scheduler=policy.scheduler
            )
            load_seconds = time.monotonic() - started
            draws = _rng_draws()
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

    _init(dims)
    policy = _Policy(tiny, dims, distributed_optimizer=False)
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

    _init(_layout())
    results = []
    for path in paths:
        policy = _Policy(tiny, _layout(), distributed_optimizer=False)
        extra = load_checkpoint(
            path, model=policy.model, optimizer=policy.optimizer, scheduler=policy.scheduler
        )
        loaded = policy.hf_weights()
        policy.train_step(extra["step"] + 1)
        result = {"loaded": loaded, "after": policy.hf_weights()}
        # Weights only (e.g. for evaluation or a new optimizer), and a clear refusal to put
        # per-parameter optimizer state into a DistributedOptimizer.
        other = _Policy(tiny, _layout(), distributed_optimizer=True)
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
    for name, dims in {"tp2": _layout(tp=2), "tp2xpp2": _layout(tp=2, pp=2)}.items():
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


# ------------------------------------------------------------------- crash safety


def _crash_worker(tiny: TinyModel, root: str) -> None:
    """DP2, distributed optimizer: save step 1; then rank 1 is SIGKILLed after writing its
    step-2 shards, before the checkpoint's metadata, marker and rename."""
    from megatron.core.dist_checkpointing.strategies.torch import (
        TorchDistSaveShardedStrategy,
    )

    from dapo_megatron.megatron.checkpoint import save_checkpoint

    dims = _layout(dp=2)
    _init(dims)
    policy = _Policy(tiny, dims, distributed_optimizer=True)
    policy.train_step(1)
    save_checkpoint(
        root,
        model=policy.model,
        optimizer=policy.optimizer,
        scheduler=policy.scheduler,
        extra_state={"step": 1},
        step=1,
    )
    policy.train_step(2)
    original = TorchDistSaveShardedStrategy.save

    def save_then_die(self: object, *args: object, **kwargs: object) -> None:
        original(self, *args, **kwargs)
        if torch.distributed.get_rank() == 1:
            os.kill(os.getpid(), signal.SIGKILL)

    TorchDistSaveShardedStrategy.save = save_then_die
    save_checkpoint(
        root,
        model=policy.model,
        optimizer=policy.optimizer,
        scheduler=policy.scheduler,
        extra_state={"step": 2},
        step=2,
    )


def _load_after_crash_worker(tiny: TinyModel, root: str) -> dict:
    from dapo_megatron.megatron.checkpoint import load_checkpoint
    from dapo_megatron.megatron.distributed import destroy_parallel

    _init(_layout())
    # Saved at DP2: the distributed optimizer's state reshards over DP.
    policy = _Policy(tiny, _layout(), distributed_optimizer=True)
    path = latest_checkpoint(root)
    extra = load_checkpoint(
        path, model=policy.model, optimizer=policy.optimizer, scheduler=policy.scheduler
    )
    adam = policy.optimizer.chained_optimizers[0].optimizer
    steps = sorted({float(state["step"]) for state in adam.state.values()})
    destroy_parallel()
    return {"path": str(path), "extra": extra, "adam_steps": steps}


def test_kill_during_save_keeps_previous_checkpoint(tiny: TinyModel, tmp_path: Path) -> None:
    root = tmp_path / "run"
    with pytest.raises(Exception, match="(?i)signal|exit|SIGKILL|terminated"):
        run_distributed(_crash_worker, 2, tiny, str(root), timeout=120)
    leftovers = sorted(p.name for p in root.iterdir())
    assert leftovers[0] == "step_000001" and leftovers[1].startswith("step_000002.tmp-")
    assert len(leftovers) == 2, leftovers
    partial = root / leftovers[1]
    assert any(partial.iterdir()) and not (partial / "complete.json").exists()
    # A step directory without marker (e.g. a copy interrupted by hand) is not a checkpoint.
    (root / "step_000003").mkdir()
    (root / "step_000003" / "common.pt").write_bytes(b"partial")
    assert latest_checkpoint(root) == root / "step_000001"
    # Saved by two ranks, each hashing a share of the files: the marker lists them all.
    marker = read_marker(root / "step_000001")
    assert sorted(marker["files"]) == checkpoint_files(root / "step_000001")
    assert any(name.endswith(".distcp") for name in marker["files"])
    assert verify_checkpoint(root / "step_000001") is None

    result = run_distributed(_load_after_crash_worker, 1, tiny, str(root))[0]
    assert result == {"path": str(root / "step_000001"), "extra": {"step": 1}, "adam_steps": [1.0]}

    deleted = prune_checkpoints(root, keep_last=1)
    assert sorted(p.name for p in deleted) == sorted([leftovers[1], "step_000003"])
    assert [p.name for p in root.iterdir()] == ["step_000001"]


def _fake_checkpoint(root: Path, step: int) -> Path:
    path = root / f"step_{step:06d}"
    path.mkdir(parents=True)
    (path / "complete.json").write_text(json.dumps({"step": step}))
    return path


def test_latest_and_prune_keep_the_newest_complete(tmp_path: Path) -> None:
    assert latest_checkpoint(tmp_path / "missing") is None
    for step in (5, 10, 100, 1_000_000):  # numeric order, not name order beyond 6 digits
        _fake_checkpoint(tmp_path, step)
    (tmp_path / "step_000200.tmp-0badc0de").mkdir()
    (tmp_path / "step_000300").mkdir()  # no marker
    (tmp_path / "notes").mkdir()  # not ours: never touched
    assert latest_checkpoint(tmp_path) == tmp_path / "step_1000000"
    prune_checkpoints(tmp_path, keep_last=2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes", "step_000100", "step_1000000"]
    with pytest.raises(ValueError, match="keep_last"):
        prune_checkpoints(tmp_path, keep_last=0)


def test_publish_replaces_a_checkpoint_of_the_same_step(tmp_path: Path) -> None:
    old = _fake_checkpoint(tmp_path, 7)
    new = temporary_sibling(old)
    new.mkdir()
    (new / "complete.json").write_text(json.dumps({"step": 7, "new": True}))
    assert latest_checkpoint(tmp_path) == old  # the .tmp- one is not a checkpoint yet
    publish(new, old)
    assert [p.name for p in tmp_path.iterdir()] == ["step_000007"]
    assert read_marker(old) == {"step": 7, "new": True}


# ------------------------------------------------------------------------ full disk

ENOSPC_LINE = "failed: [Errno 28] No space left on device"


class _FullDiskFile(io.FileIO):
    """A file on a disk with no space left: every write fails as the OS would fail it."""

    def write(self, data: object) -> int:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), self.name)


def _full_disk_worker(tiny: TinyModel, root: str, inject: bool) -> dict:
    """One rank saves into ``root``, on a full file system (or one faked full)."""
    from dapo_megatron.checkpoint_dirs import CheckpointSaveError
    from dapo_megatron.megatron.checkpoint import save_checkpoint
    from dapo_megatron.megatron.distributed import destroy_parallel

    _init(_layout())
    policy = _Policy(tiny, _layout(), distributed_optimizer=False)
    if inject:
        # The shard writers (forked from this process) open their files with the module's
        # `open`: shadow the builtin there.
        from megatron.core.dist_checkpointing.strategies import filesystem_async

        filesystem_async.open = _FullDiskFile
    try:
        save_checkpoint(
            root,
            model=policy.model,
            optimizer=policy.optimizer,
            scheduler=policy.scheduler,
            extra_state={"step": 1},
            step=1,
        )
    except CheckpointSaveError as e:
        error = e
    else:
        raise AssertionError("the save into a full file system succeeded")
    destroy_parallel()
    return {"message": str(error), "errno": error.errno, "left": sorted(os.listdir(root))}


@contextlib.contextmanager
def _tiny_tmpfs(mount_point: Path, size: str) -> Iterator[bool]:
    """A tmpfs of ``size`` at ``mount_point`` if this process may mount one (root)."""
    mount_point.mkdir()
    if os.geteuid() != 0:
        yield False
        return
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mount_point)],
        capture_output=True,
    )
    try:
        yield mounted.returncode == 0
    finally:
        if mounted.returncode == 0:
            subprocess.run(["umount", str(mount_point)], check=True)


# 256k: common.pt and metadata.json fit, the ~2 MB of shards do not (the forked writers get
# ENOSPC). "full": the disk is full before the save, so its first file, common.pt, fails:
# torch.save reports that as a RuntimeError without errno, which the saver tells apart
# from a bug by a write of its own.
@pytest.mark.parametrize("disk", ["256k", "full"])
def test_full_disk_is_a_one_line_error_without_leftovers(
    tiny: TinyModel, tmp_path: Path, disk: str
) -> None:
    with _tiny_tmpfs(tmp_path / "disk", "256k" if disk == "256k" else "4k") as real:
        if not real and disk == "full":
            pytest.skip("mounting a tmpfs needs root; the injected case covers the shards")
        if disk == "full":
            (tmp_path / "disk" / "filler").write_bytes(bytes(4096))
        root = tmp_path / "disk" / "checkpoints"
        result = run_distributed(_full_disk_worker, 1, tiny, str(root), not real, timeout=120)[0]
    assert result == {
        "message": f"saving checkpoint to {root / 'step_000001'} {ENOSPC_LINE}",
        "errno": errno.ENOSPC,
        "left": [],  # the failed save's .tmp directory is gone
    }
