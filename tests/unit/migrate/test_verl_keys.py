"""verl's learning-rate warm-up (migrate/verl_keys.py).

What verl does was read from its code (volcengine/verl at the commit of
tests/data/foreign/README.md, and verl-recipe's dapo_ray_trainer.py): every actor worker
steps the lr schedule once per `update_actor` call, i.e. once per trainer step, after the
step's optimizer steps, one per mini-batch (fsdp_workers.py and megatron_workers.py
`update_actor` after `update_policy`; engine_workers.py `update_actor` only on the last
mini-batch). The warm-up is linear from 0 to lr over N scheduler steps (Megatron's
OptimizerParamScheduler with lr_warmup_init 0; torch_functional.py
get_constant_schedule_with_warmup: min(1, step / N)). The expected values are worked out by
hand in the comments.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from dapo_megatron.migrate.dialect_keys import explain_foreign, foreign_key
from dapo_megatron.migrate.dialects import Untranslatable
from dapo_megatron.migrate.foreign_source import apply_foreign_overrides, read_source
from dapo_megatron.migrate.import_config import translate

DATA = Path(__file__).resolve().parents[2] / "data" / "foreign" / "verl"
ACTOR = "actor_rollout_ref.actor"
STEPS = f"{ACTOR}.optim.lr_warmup_steps"
RATIO = f"{ACTOR}.optim.lr_warmup_steps_ratio"
MINI = f"{ACTOR}.ppo_mini_batch_size"
WARMUP = "policy.scheduler.lr_warmup_steps"
# Every verl-recipe DAPO script: lr_warmup_steps=10, train_prompt_bsz=512,
# train_prompt_mini_bsz=32 (ppo_epochs: verl's default 1).
DAPO_SCRIPTS = [
    "run_dapo_qwen2.5_32b.sh",
    "run_dapo_wo_ds_qwen2.5_32b.sh",
    "run_dapo_early_qwen2.5_32b.sh",
    "run_dapo_qwen2.5_32b_rollout_corr.sh",
    "test_dapo_7b_math.sh",
    "test_dapo_7b_math_megatron.sh",
    "test_dapo_qwen3_30b_math.sh",
]


def _import(name: str, *overrides: str) -> tuple[dict[str, Any], dict[str, str]]:
    """(our settings, skipped source key -> reason) of a real verl script, as
    dapo-import-config reads it (HOME=/home/u, overrides applied)."""
    flat = read_source(DATA / name, {"HOME": "/home/u"})
    apply_foreign_overrides(flat, list(overrides))
    result = translate("verl", flat)
    return {s.key: s.value for s in result.settings}, {s.key: s.reason for s in result.skipped}


# ---------------------------------------------------------------------------------------
# The real scripts


@pytest.mark.parametrize("name", DAPO_SCRIPTS)
def test_dapo_scripts_warmup_is_carried_per_trainer_step(name):
    # 512 / 32 = 16 optimizer steps per trainer step: verl holds each lr over 16; ours does
    # too with policy.scheduler.unit train_step, so the count 10 carries over unchanged
    v, skipped = _import(name)
    assert v[WARMUP] == 10 and v["policy.scheduler.unit"] == "train_step"
    assert v["policy.optimizer.lr"] == 1e-6
    assert STEPS not in skipped and RATIO not in skipped


def test_warmup_note_counts_the_trained_batch():
    # filter_groups on: train_batch_size 512 is trained (gen_batch_size 1536 only generated)
    result = translate("verl", read_source(DATA / "run_dapo_qwen2.5_32b.sh", {"HOME": "/h"}))
    note = next(s.note for s in result.settings if s.key == WARMUP)
    assert "10 trainer steps of 16 optimizer steps each" in note
    assert "train_batch_size 512 (filter_groups on) / ppo_mini_batch_size 32" in note
    # filter_groups off with gen_batch_size 1536: the whole generated batch is trained,
    # 1536 / 32 = 48 optimizer steps per trainer step (dapo_ray_trainer.py fit)
    flat = read_source(DATA / "run_dapo_qwen2.5_32b.sh", {"HOME": "/h"})
    apply_foreign_overrides(flat, ["algorithm.filter_groups.enable=false"])
    result = translate("verl", flat)
    note = next(s.note for s in result.settings if s.key == WARMUP)
    assert "of 48 optimizer steps each" in note and "gen_batch_size 1536" in note


def test_grpo_example_without_warmup_imports_no_warmup():
    # run_qwen2-7b_math_megatron.sh sets no warm-up (verl's -1 and ratio 0.0): none, as here,
    # whatever the mini-batches (1024 / 256 = 4 optimizer steps per trainer step)
    v, skipped = _import("run_qwen2-7b_math_megatron.sh")
    assert v[WARMUP] == 0
    assert STEPS not in skipped and RATIO not in skipped


@pytest.mark.parametrize(
    "overrides",
    [
        # one mini-batch of all 512 prompts: one optimizer step per trainer step
        (f"{MINI}=512",),
        # the ratio form: int(0.05 x trainer.total_training_steps 200) = 10
        (f"{MINI}=512", f"{STEPS}=-1", f"{RATIO}=0.05"),
    ],
)
def test_one_optimizer_step_per_trainer_step_keeps_the_count(overrides):
    v, _ = _import("test_dapo_7b_math.sh", *overrides)
    assert v[WARMUP] == 10
    assert v["policy.train_global_batch_size"] == 512 * 16


def _verl_lrs(lr: float, warmup: int, trainer_steps: int, k: int, megatron: bool) -> list[float]:
    """verl's lr at each optimizer step: its schedule, stepped once per trainer step (after
    the step's k optimizer steps), as its Megatron worker builds it (OptimizerParamScheduler,
    init 0, constant) or as its FSDP worker does (LambdaLR of min(1, step / warmup))."""
    torch = pytest.importorskip("torch")
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=lr)
    if megatron:
        from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler

        sched: Any = OptimizerParamScheduler(
            opt, init_lr=0.0, max_lr=lr, min_lr=0.0, lr_warmup_steps=warmup,
            lr_decay_steps=trainer_steps, lr_decay_style="constant", start_wd=0.0,
            end_wd=0.0, wd_incr_steps=trainer_steps, wd_incr_style="constant",
        )  # fmt: skip
        tick = lambda: sched.step(1)  # noqa: E731
    else:
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, s / max(1, warmup)))
        tick = sched.step
    out = []
    for _ in range(trainer_steps):
        for _ in range(k):
            out.append(opt.param_groups[0]["lr"])
            opt.step()
        tick()
    return out


def _our_lrs(v: dict[str, Any], optimizer_steps: int) -> list[float]:
    """Ours at each optimizer step, built from the translation, stepped once per step."""
    torch = pytest.importorskip("torch")
    from dapo_megatron.config.schema_policy import OptimizerConfig, SchedulerConfig
    from dapo_megatron.megatron.optimizer import build_scheduler

    lr = v["policy.optimizer.lr"]
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=lr)
    o = OptimizerConfig("adam", lr, 0.0, 0.0, 0.9, 0.999, 1e-8, 1.0)
    s = SchedulerConfig(v[WARMUP], 0.0, "constant", None)  # our default lr_warmup_init: 0.0
    sched = build_scheduler(opt, o, s, total_optimizer_steps=optimizer_steps)
    out = []
    for _ in range(optimizer_steps):
        out.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step(increment=1)
    return out


@pytest.mark.parametrize("megatron", [True, False])
def test_translated_warmup_gives_verls_lr_at_every_step(megatron):
    v, _ = _import("test_dapo_7b_math.sh", f"{MINI}=512")  # k = 1, warm-up 10
    theirs = _verl_lrs(1e-6, 10, 40, 1, megatron)
    assert _our_lrs(v, 40) == pytest.approx(theirs, rel=1e-12)


def test_several_optimizer_steps_per_trainer_step_are_a_staircase():
    """Why k = 16 needs our train_step unit: verl holds each lr for 16 optimizer steps; a
    ramp over 160 optimizer steps meets it only at the first optimizer step of each trainer
    step."""
    theirs = _verl_lrs(1e-6, 10, 12, 16, megatron=True)
    ramp = _our_lrs({"policy.optimizer.lr": 1e-6, WARMUP: 160}, 12 * 16)
    assert theirs[16:32] == [theirs[16]] * 16 and theirs[16] == pytest.approx(1e-7)
    assert [ramp[i] for i in range(0, 12 * 16, 16)] == pytest.approx(theirs[::16])
    assert ramp[17] > theirs[17]  # within a trainer step ours has moved on, verl has not


# ---------------------------------------------------------------------------------------
# Small inline cases

BATCH = {"data.train_batch_size": 64, MINI: 64, f"{ACTOR}.ppo_epochs": 1}


def _refusal(key: str, value: Any, ctx: dict[str, Any]) -> str:
    fk = foreign_key(key, "verl")
    assert fk is not None
    with pytest.raises(Untranslatable) as info:
        fk.convert(value, ctx)
    return str(info.value)


def test_ratio_cases():
    fk = foreign_key(RATIO, "verl")
    assert fk is not None
    total = {**BATCH, STEPS: -1, "trainer.total_training_steps": 300}
    assert dict(fk.convert(0.1, total).settings) == {WARMUP: 30}
    assert dict(fk.convert(0.0, total).settings) == {WARMUP: 0}
    assert dict(fk.convert(0.001, total).settings) == {WARMUP: 0}  # int(0.3): none in verl
    assert fk.convert(0.1, {**total, STEPS: 5}).settings == ()  # not read
    assert dict(fk.convert(0.1, {**total, STEPS: None}).settings) == {WARMUP: 30}  # Megatron
    cases = [
        ({**total, STEPS: 0}, "legacy FSDP worker then has no warm-up"),
        ({**total, f"{ACTOR}.optim.lr_decay_steps": 100}, "lr_decay_steps is set"),
        ({**BATCH, STEPS: -1}, "trainer.total_training_steps is not set"),
    ]
    for ctx, phrase in cases:
        assert phrase in _refusal(RATIO, 0.1, ctx)
    two = fk.convert(0.1, {**total, "data.train_batch_size": 128})  # 2 optimizer steps each
    assert dict(two.settings) == {WARMUP: 30} and "of 2 optimizer steps each" in two.note
    assert "expected a fraction" in _refusal(RATIO, 2, total)


def test_steps_cases():
    fk = foreign_key(STEPS, "verl")
    assert fk is not None
    assert dict(fk.convert(7, BATCH).settings) == {WARMUP: 7}
    assert fk.convert(-1, BATCH).settings == ()  # the ratio's row decides
    epochs = {**BATCH, f"{ACTOR}.ppo_epochs": 2}  # 2 passes: 2 optimizer steps per step
    assert dict(fk.convert(7, epochs).settings) == {WARMUP: 7}  # 7 trainer steps of 2
    assert "not a whole number" in _refusal(STEPS, 7, {**BATCH, MINI: 48})
    assert "converting needs" in _refusal(STEPS, 7, {})
    # the loader's one-line hint reads the key alone: refused there too, never a number
    hint = explain_foreign({STEPS: 10}, "recipe.yaml")
    assert hint is not None and "no exact equivalent" in hint and "converting needs" in hint
