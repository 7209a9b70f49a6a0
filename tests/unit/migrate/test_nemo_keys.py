"""NeMo RL's learning-rate warm-up and sequence lengths (migrate/nemo_keys.py).

What NeMo RL does was read from its code at the commit of tests/data/foreign/README.md:
both policy workers step the lr schedule once per train() call, i.e. once per GRPO step
(megatron_policy_worker.py `scheduler.step(increment=gbs)` against Megatron Bridge's
lr_warmup_steps = lr_warmup_iters x global batch; dtensor_policy_worker(_v2).py
`scheduler.step()` after the loop over global batches), and its engine ends a response at
vLLM's max_model_len (by default policy.max_total_sequence_length) less the prompt
(vllm_worker.py, vllm_worker_async.py). The real configs are read as the command reads them
(interpolations resolved); the expected values are worked out by hand in the comments.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from dapo_megatron.migrate.dialect_keys import foreign_key
from dapo_megatron.migrate.dialects import Untranslatable
from dapo_megatron.migrate.foreign_source import (
    apply_foreign_overrides,
    read_source,
    resolve_interpolations,
)
from dapo_megatron.migrate.import_config import ImportResult, translate
from dapo_megatron.migrate.import_config import main as import_main

DATA = Path(__file__).resolve().parents[2] / "data" / "foreign" / "nemo-rl"
LLM = "recipes/llm/"
TOTAL = "policy.max_total_sequence_length"
WARMUP = "policy.scheduler.lr_warmup_steps"
INIT = "policy.scheduler.lr_warmup_init"
STYLE = "policy.scheduler.lr_decay_style"


def _import(name: str, *overrides: str) -> tuple[dict[str, Any], dict[str, str]]:
    """(our settings, skipped source key -> reason) of a real NeMo RL config, as
    dapo-import-config reads it (overrides applied, then interpolations resolved)."""
    flat = read_source(DATA / name, {})
    apply_foreign_overrides(flat, list(overrides))
    resolve_interpolations(flat)
    result: ImportResult = translate("nemo-rl", flat)
    return {s.key: s.value for s in result.settings}, {s.key: s.reason for s in result.skipped}


# ---------------------------------------------------------------------------------------
# Warm-up on the real files


def test_dtensor_linear_warmup_of_the_base_config():
    # grpo_math_1B.yaml: DTensor (megatron_cfg.enabled false), LinearLR(0.1 -> 1.0 over 50)
    # then ConstantLR(1.0), milestone 50; 32 prompts x 16 samples = 512 = one global batch:
    # one optimizer step per GRPO step, so 50 steps from 0.1 x 5e-6.
    v, skipped = _import("grpo_math_1B.yaml")
    assert (v[WARMUP], v[INIT], v[STYLE]) == (50, 0.1 * 5.0e-6, "constant")
    # Megatron's schedule is not live there: listed, not translated
    assert skipped["policy.megatron_cfg.scheduler.lr_warmup_iters"].startswith("not live")


@pytest.mark.parametrize(
    "name, warmup, init",
    [
        # lr_warmup_iters 50 (recipe), lr_warmup_init 5e-7 (base); 32 x 16 = 512 = one batch
        ("grpo-llama3.2-1b-instruct-1n8g-megatron.yaml", 50, 5.0e-7),
        # lr_warmup_iters 13 (base), lr_warmup_init 5e-8 (recipe); 32 x 16 = 512
        ("grpo-dapomath17k-dsv3-megatron.yaml", 13, 5.0e-8),
    ],
)
def test_megatron_warmup_iters_are_optimizer_steps_at_one_batch_per_step(name, warmup, init):
    v, skipped = _import(LLM + name)
    assert (v[WARMUP], v[INIT], v[STYLE]) == (warmup, init, "constant")
    # constant lr: lr_decay_iters (1000) is not read, and is not left over either
    assert "policy.megatron_cfg.scheduler.lr_decay_iters" not in skipped
    assert skipped["policy.scheduler"].startswith("not live")  # the DTensor list


@pytest.mark.parametrize(
    "name, key, k, iters",
    [
        # Megatron, 64 prompts x 32 samples / 512 = 4 optimizer steps per GRPO step; 50 iters
        ("grpo-qwen2.5-7b-instruct-4n8g-megatron.yaml", "policy.megatron_cfg.scheduler.lr_warmup_iters", 4, 50),
        # DTensor, 512 x 16 / 512 = 16; LinearLR over 10 GRPO steps
        ("dapo-qwen2.5-7b.v2.yaml", "policy.scheduler", 16, 10),
        ("dapo-qwen2.5-7b-16n4g-fsdp2cp2.v2.yaml", "policy.scheduler", 16, 10),
        # DTensor, 128 x 8 / 64 = 16; the base's LinearLR over 50
        ("grpo-deepscaler-1.5b-8K.yaml", "policy.scheduler", 16, 50),
    ],
)  # fmt: skip
def test_warmup_counts_grpo_steps_when_a_step_is_several_optimizer_steps(name, key, k, iters):
    # NeMo RL steps its scheduler once per GRPO step: the count carries over unchanged with
    # policy.scheduler.unit train_step (one lr over each GRPO step's k optimizer steps)
    v, skipped = _import(LLM + name)
    assert key not in skipped
    assert (v[WARMUP], v["policy.scheduler.unit"]) == (iters, "train_step")


def test_translated_warmup_gives_nemo_rls_lr_at_every_step():
    """grpo_math_1B's torch schedule, built as NeMo RL builds it (SequentialLR over its list,
    stepped once per GRPO step), against ours built from the translation (Megatron's
    scheduler, stepped once per optimizer step): one optimizer step per GRPO step."""
    torch = pytest.importorskip("torch")
    from dapo_megatron.config.schema_policy import OptimizerConfig, SchedulerConfig
    from dapo_megatron.megatron.optimizer import build_scheduler

    flat = read_source(DATA / "grpo_math_1B.yaml", {})
    resolve_interpolations(flat)
    v = {s.key: s.value for s in translate("nemo-rl", flat).settings}
    lr = flat["policy.optimizer.kwargs.lr"]
    theirs_opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=lr)
    lrs = torch.optim.lr_scheduler
    chain, milestones = [], []
    for entry in flat["policy.scheduler"]:
        if "milestones" in entry:
            milestones = entry["milestones"]
        else:
            cls = getattr(lrs, entry["name"].rsplit(".", 1)[-1])
            chain.append(cls(theirs_opt, **entry["kwargs"]))
    theirs = lrs.SequentialLR(theirs_opt, chain, milestones)

    ours_opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=lr)
    opt = OptimizerConfig("adam", v["policy.optimizer.lr"], 0.0, 0.0, 0.9, 0.999, 1e-8, 1.0)
    sched = SchedulerConfig(v[WARMUP], v[INIT], v[STYLE], None)
    ours = build_scheduler(ours_opt, opt, sched, total_optimizer_steps=200)
    for step in range(120):
        got, want = ours_opt.param_groups[0]["lr"], theirs_opt.param_groups[0]["lr"]
        assert got == pytest.approx(want, rel=1e-12), step
        theirs_opt.step()
        theirs.step()
        ours.step(increment=1)


# ---------------------------------------------------------------------------------------
# Warm-up: small inline cases


ONE_BATCH = {
    "grpo.num_prompts_per_step": 32,
    "grpo.num_generations_per_prompt": 16,
    "policy.train_global_batch_size": 512,
    "policy.optimizer.kwargs.lr": 1.0e-6,
}


def _linear(start: float, end: float, iters: int, milestone: int) -> list[dict[str, Any]]:
    return [
        {"name": "torch.optim.lr_scheduler.LinearLR",
         "kwargs": {"start_factor": start, "end_factor": end, "total_iters": iters}},
        {"name": "torch.optim.lr_scheduler.ConstantLR", "kwargs": {"factor": 1.0, "total_iters": 10**10}},
        {"milestones": [milestone]},
    ]  # fmt: skip


def test_a_later_milestone_keeps_the_same_schedule():
    # LinearLR stays at end_factor 1 after its 10 steps, so switching at 20 changes nothing
    fk = foreign_key("policy.scheduler", "nemo-rl")
    assert fk is not None
    got = dict(fk.convert(_linear(0.5, 1.0, 10, 20), ONE_BATCH).settings)
    assert got == {WARMUP: 10, INIT: 0.5e-6, STYLE: "constant"}
    constant = [
        {"name": "torch.optim.lr_scheduler.ConstantLR", "kwargs": {"factor": 1.0}},
        {"milestones": []},
    ]
    assert dict(fk.convert(constant, ONE_BATCH).settings) == {WARMUP: 0, STYLE: "constant"}


@pytest.mark.parametrize(
    "schedule, phrase",
    [
        (_linear(0.1, 1.0, 10, 5), "milestone 5 ends the 10-step LinearLR early"),
        (_linear(0.1, 0.5, 10, 10), "end_factor 1"),
        ([{"name": "torch.optim.lr_scheduler.CosineAnnealingLR", "kwargs": {"T_max": 100}}, {"milestones": []}],
         "only a LinearLR warm-up"),
        (_linear(0.1, 1.0, 10, 10)[:2], "SequentialLR needs 1"),
        ([{"name": "torch.optim.lr_scheduler.ConstantLR", "kwargs": {"factor": 0.5, "total_iters": 5}}, {"milestones": []}],
         "ConstantLR(factor 0.5)"),
        ({"name": "torch.optim.lr_scheduler.LinearLR"}, "only NeMo RL's list"),
    ],
)  # fmt: skip
def test_other_torch_schedules_are_refused(schedule, phrase):
    fk = foreign_key("policy.scheduler", "nemo-rl")
    assert fk is not None
    with pytest.raises(Untranslatable) as info:
        fk.convert(schedule, ONE_BATCH)
    assert phrase in str(info.value)


def test_megatron_warmup_refusals_and_no_warmup():
    fk = foreign_key("policy.megatron_cfg.scheduler.lr_warmup_iters", "nemo-rl")
    assert fk is not None
    four = {**ONE_BATCH, "grpo.num_prompts_per_step": 128}  # 128 x 16 / 512 = 4
    assert dict(fk.convert(0, four).settings) == {WARMUP: 0}  # no warm-up: same at any k
    cases = [
        (50, {**ONE_BATCH, "policy.megatron_cfg.scheduler.lr_warmup_fraction": 0.1}, "lr_warmup_fraction"),
        (50, {**ONE_BATCH, "policy.megatron_cfg.scheduler.lr_decay_iters": 50}, "shortens"),
        (50, {"grpo.num_prompts_per_step": 32}, "converting needs"),
        (50, {**ONE_BATCH, "policy.train_global_batch_size": 300}, "not a whole number"),
    ]  # fmt: skip
    for value, ctx, phrase in cases:
        with pytest.raises(Untranslatable) as info:
            fk.convert(value, ctx)
        assert phrase in str(info.value)
    style = foreign_key("policy.megatron_cfg.scheduler.lr_decay_style", "nemo-rl")
    iters = foreign_key("policy.megatron_cfg.scheduler.lr_decay_iters", "nemo-rl")
    assert style is not None and iters is not None
    with pytest.raises(Untranslatable, match="only constant"):
        style.convert("cosine", {})
    linear = {"policy.megatron_cfg.scheduler.lr_decay_style": "linear"}
    with pytest.raises(Untranslatable, match="not carried"):
        iters.convert(1000, linear)


# ---------------------------------------------------------------------------------------
# Lengths. NeMo RL's vLLM engine runs with max_model_len (by default the total length) and
# max_tokens = max_new_tokens, so a response stops at min(max_new_tokens, total - prompt):
# a cap per prompt, our generation.response_cap context, and max_new_tokens is carried as
# is (a cap up to the total is legal there; it is also the overlong penalty's Lmax). Each
# row: the total, max_input_seq_length and max_new_tokens read from the file by eye, then
# by hand max_prompt_length = prompt - 1 and the response cap (= max_new_tokens).


@pytest.mark.parametrize(
    "name, total, prompt, response, cap",
    [
        # grpo_math_1B.yaml: all three `${policy.max_total_sequence_length}` = 512:
        # 511 + 512 = 1023 > 512, so context, and the cap max_new_tokens = 512
        ("grpo_math_1B.yaml", 512, 512, 512, 512),
        (LLM + "grpo-llama3.2-1b-instruct-1n8g-megatron.yaml", 512, 512, 512, 512),
        (LLM + "grpo-qwen2.5-7b-instruct-4n8g-megatron.yaml", 4096, 4096, 4096, 4096),
        # prompts < 2048 tokens, max_new_tokens 16384 = the total: 2047 + 16384 > 16384
        (LLM + "dapo-qwen2.5-7b.v2.yaml", 16384, 2048, 16384, 16384),
        (LLM + "grpo-deepscaler-1.5b-8K.yaml", 8192, 8192, 8192, 8192),
        (LLM + "grpo-dapomath17k-dsv3-megatron.yaml", 16384, 16384, 16384, 16384),
    ],
)
def test_lengths_beyond_the_total_carry_the_per_prompt_cap(name, total, prompt, response, cap):
    v, skipped = _import(name)
    assert TOTAL not in skipped and "policy.generation.max_new_tokens" not in skipped
    assert prompt - 1 + response > total  # the file's lengths do exceed the total
    assert v[TOTAL] == total
    assert v["data.max_prompt_length"] == prompt - 1
    assert v["generation.max_response_length"] == cap == response
    assert v["generation.response_cap"] == "context"


def test_lengths_made_to_fit_import_as_nemo_rl_runs_them():
    # The DAPO recipe with lengths that fit: prompts of up to 2047 tokens + 14336 <= 16384, so
    # every response stops at 14336 there as here (one cap: no response_cap set), and
    # reward_shaping.max_response_length (14336) agrees.
    v, skipped = _import(LLM + "dapo-qwen2.5-7b.v2.yaml", "policy.generation.max_new_tokens=14336")
    assert (v[TOTAL], v["data.max_prompt_length"], v["generation.max_response_length"]) == (
        16384, 2047, 14336,
    )  # fmt: skip
    assert TOTAL not in skipped and "policy.generation.max_new_tokens" not in skipped
    assert "generation.response_cap" not in v
    # the base config: its lengths are interpolations of max_total_sequence_length
    v, skipped = _import(
        "grpo_math_1B.yaml", "data.max_input_seq_length=256", "policy.generation.max_new_tokens=256"
    )
    assert (v[TOTAL], v["data.max_prompt_length"], v["generation.max_response_length"]) == (
        512, 255, 256,
    )  # fmt: skip
    assert "generation.response_cap" not in v
    # a cap below the total is kept as it is too: 255 + 300 > 512, cap 300
    v, _ = _import(
        "grpo_math_1B.yaml", "data.max_input_seq_length=256", "policy.generation.max_new_tokens=300"
    )
    assert (v["generation.max_response_length"], v["generation.response_cap"]) == (300, "context")


def test_an_engine_context_other_than_the_total_is_still_refused():
    # vllm_cfg.max_model_len 1024 with a total of 512: NeMo RL's responses stop at 1024 less
    # the prompt, ours at 512 less it; refused naming the engine's context.
    _, skipped = _import("grpo_math_1B.yaml", "policy.generation.vllm_cfg.max_model_len=1024")
    reason = skipped[TOTAL]
    assert "needs an engine context (1024 tokens) other than the training length (512)" in reason
    assert "which dapo-megatron lacks" in reason
    # equal to the total (the base's `${policy.max_total_sequence_length}`): carried
    v, skipped = _import("grpo_math_1B.yaml", "policy.generation.vllm_cfg.max_model_len=512")
    assert TOTAL not in skipped and v["generation.response_cap"] == "context"


def test_the_megatron_engines_context_is_its_own():
    # backend megatron: megatron_worker.py builds the engine with max_sequence_length =
    # mcore_generation_config.max_model_len; vllm_cfg is not read. A context of 1024 there
    # differs from the total (512): refused as with vLLM; vllm_cfg's 1024 changes nothing.
    name = LLM + "grpo-llama3.2-1b-instruct-1n8g-megatron_generation.yaml"
    mcore = "policy.generation.mcore_generation_config.max_model_len=1024"
    _, skipped = _import(name, mcore)
    assert "engine context (1024 tokens)" in skipped.get(TOTAL, "")
    v, skipped = _import(name, "policy.generation.vllm_cfg.max_model_len=1024")
    assert TOTAL not in skipped and v["generation.response_cap"] == "context"


def test_lengths_inline_and_on_the_command_line(tmp_path, capsys):
    fk = foreign_key(TOTAL, "nemo-rl")
    assert fk is not None
    fits = {"data.max_input_seq_length": 1024, "policy.generation.max_new_tokens": 3072}
    assert dict(fk.convert(4096, fits).settings) == {TOTAL: 4096}
    assert dict(fk.convert(4096, {}).settings) == {TOTAL: 4096}  # lengths not given: as is
    assert dict(fk.convert(4095, fits).settings) == {TOTAL: 4095}  # 1023 + 3072
    beyond = {**fits, "policy.generation.max_new_tokens": 4096}  # 1023 + 4096 = 5119 > 4096
    assert dict(fk.convert(4096, beyond).settings) == {
        TOTAL: 4096,
        "generation.response_cap": "context",
    }
    context = {**beyond, "policy.generation.vllm_cfg.max_model_len": 8192}
    with pytest.raises(Untranslatable, match=r"engine context \(8192 tokens\)"):
        fk.convert(4096, context)

    source = tmp_path / "grpo.yaml"
    source.write_text(
        "policy:\n  max_total_sequence_length: 4096\n  generation: {max_new_tokens: 4096}\n"
        "data: {max_input_seq_length: 1024}\n"
    )
    out = tmp_path / "r.yaml"
    import_main(["--from", "nemo-rl", str(source), "-o", str(out)])
    capsys.readouterr()
    written = yaml.safe_load(out.read_text())
    # 1023 + 4096 > 4096: the cap per prompt, the response cap max_new_tokens = 4096
    assert written["generation"]["response_cap"] == "context"
    assert written["generation"]["max_response_length"] == 4096
    assert written["policy"]["max_total_sequence_length"] == 4096
    assert written["data"]["max_prompt_length"] == 1023


# ---------------------------------------------------------------------------------------
# The prompt limit. NeMo RL's data processors (processors.py, math_hf_data_processor and the
# others) turn a prompt of `length >= max_seq_length` (data.max_input_seq_length) tokens into
# a stub with loss_multiplier 0: generated from, never trained. Ours drops a prompt longer
# than data.max_prompt_length (data/datasets.py encode_prompts).

PROMPT = "data.max_input_seq_length"


@pytest.mark.parametrize(
    "name, limit",
    [
        ("grpo_math_1B.yaml", 512),  # `${policy.max_total_sequence_length}`
        (LLM + "dapo-qwen2.5-7b.v2.yaml", 2048),
        (LLM + "grpo-qwen2.5-7b-instruct-4n8g-megatron.yaml", 4096),
    ],
)
def test_prompt_limit_of_the_real_files_is_the_longest_prompt_nemo_rl_trains(name, limit):
    flat = read_source(DATA / name, {})
    resolve_interpolations(flat)
    result = translate("nemo-rl", flat)
    setting = next(s for s in result.settings if s.key == "data.max_prompt_length")
    assert (setting.source, setting.value) == (PROMPT, limit - 1)
    assert "the number of prompts used can differ" in setting.note  # said, not hidden
    assert f"keeps a prompt of {limit} tokens or more in its data as a stub" in setting.note


class _WordTokenizer:
    """One token per word: enough for encode_prompts' length rule."""

    def __call__(self, texts: list[str], add_special_tokens: bool) -> dict[str, Any]:
        return {"input_ids": [[1] * len(t.split()) for t in texts]}


def test_translated_limit_keeps_exactly_the_prompts_nemo_rl_trains():
    from dapo_megatron.data.datasets import encode_prompts
    from dapo_megatron.data.records import PromptRecord

    fk = foreign_key(PROMPT, "nemo-rl")
    assert fk is not None
    for limit in (2, 6, 9):
        ours = dict(fk.convert(limit, {}).settings)["data.max_prompt_length"]
        records = [PromptRecord(" ".join(["w"] * n), "") for n in range(1, 12)]
        kept = encode_prompts(
            records, _WordTokenizer(), apply_chat_template=False, max_prompt_length=ours
        )  # type: ignore[arg-type]
        trained_there = [r for r in records if not len(r.text.split()) >= limit]
        assert kept.records == trained_there, limit
    for bad in (1, 0, -5):
        with pytest.raises(Untranslatable, match="stub it never trains"):
            fk.convert(bad, {})


# ---------------------------------------------------------------------------------------
# The advantage estimator and dynamic sampling (nemo_algo.py), from NeMo RL's grpo.py and
# advantage_estimator.py at 7ea279ab


def _inline(flat: dict[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
    result = translate("nemo-rl", dict(flat))
    return {s.key: s.value for s in result.settings}, {s.key: s.reason for s in result.skipped}


def test_dynamic_sampling_discards_the_surplus_and_is_off_without_it():
    # grpo.py dynamic_sampling(): `filtered_repeated_batch.slice(0, train_prompts_size)` once
    # enough groups are cached: the rest is dropped, never carried to the next step
    v, _ = _inline({"grpo.use_dynamic_sampling": True, "grpo.use_leave_one_out_baseline": False})
    assert (v["dapo.dynamic_sampling.enabled"], v["dapo.dynamic_sampling.surplus"]) == (
        True,
        "discard",
    )
    # off: every generated group trains; the legacy leave-one-out flag only shaped the
    # filter's std (grpo.py calculate_baseline_and_std_per_prompt before dynamic_sampling)
    v, skipped = _inline({"grpo.use_dynamic_sampling": False, "grpo.use_leave_one_out_baseline": True,
                          "grpo.batch_multiplier": 1})  # fmt: skip
    assert v["dapo.dynamic_sampling.enabled"] is False and "dapo.dynamic_sampling.surplus" not in v
    assert skipped["grpo.use_leave_one_out_baseline"].startswith("not live")
    assert skipped["grpo.batch_multiplier"].startswith("not live")


def test_dynamic_sampling_with_the_leave_one_out_filter_is_refused():
    # with it on, NeMo RL's std is each sample's N - 1 others': `std != 0` keeps samples,
    # not groups (a lone correct answer among wrong ones is dropped)
    _, skipped = _inline(
        {"grpo.use_dynamic_sampling": True, "grpo.use_leave_one_out_baseline": True}
    )
    assert (
        "per-sample leave-one-out dynamic-sampling filter"
        in skipped["grpo.use_leave_one_out_baseline"]
    )


def test_the_live_estimator_keys_are_translated_and_the_legacy_ones_are_not_read():
    flat = {
        "grpo.normalize_rewards": True,
        "grpo.adv_estimator.name": "grpo",
        "grpo.adv_estimator.normalize_rewards": False,
        "grpo.adv_estimator.use_leave_one_out_baseline": True,
        "grpo.adv_estimator.minus_baseline": True,
    }
    v, skipped = _inline(flat)
    assert v["dapo.advantage.norm_by_std"] is False  # the live key, not grpo.normalize_rewards
    assert (v["dapo.advantage.leave_one_out"], v["dapo.advantage.std_over"]) == (True, "others")
    assert v["dapo.advantage.eps"] == 1e-6  # advantage_estimator.py `epsilon = 1e-6`
    assert "grpo.adv_estimator.normalize_rewards" in skipped["grpo.normalize_rewards"]
    assert skipped["grpo.adv_estimator.minus_baseline"].startswith("not live")  # Reinforce++'s
    _, skipped = _inline({**flat, "grpo.adv_estimator.name": "reinforce_plus_plus"})
    assert "needs the reinforce_plus_plus advantage estimator" in skipped["grpo.adv_estimator.name"]


def test_megatron_weight_decay_is_the_schedulers():
    # Megatron's OptimizerParamScheduler writes end_weight_decay into every group each step
    # (constant style); NeMo RL builds it from megatron_cfg.scheduler (models/megatron/setup.py)
    flat = {
        "policy.megatron_cfg.enabled": True,
        "policy.megatron_cfg.optimizer.weight_decay": 0.1,
        "policy.megatron_cfg.scheduler.start_weight_decay": 0.01,
        "policy.megatron_cfg.scheduler.end_weight_decay": 0.01,
        "policy.megatron_cfg.scheduler.weight_decay_incr_style": "constant",
    }
    v, skipped = _inline(flat)
    assert v["policy.optimizer.weight_decay"] == 0.01
    assert skipped["policy.megatron_cfg.optimizer.weight_decay"].startswith("not live")
    ramp = {**flat, "policy.megatron_cfg.scheduler.start_weight_decay": 0.0,
            "policy.megatron_cfg.scheduler.weight_decay_incr_style": "linear"}  # fmt: skip
    _, skipped = _inline(ramp)
    assert (
        "needs a weight-decay schedule" in skipped["policy.megatron_cfg.scheduler.end_weight_decay"]
    )


def test_validation_sampling_follows_the_relative_references():
    # grpo_math_1B.yaml: val_temperature: ${.temperature} (OmegaConf's sibling reference)
    v, skipped = _import("grpo_math_1B.yaml")
    assert v["validation.temperature"] == v["generation.temperature"] == 1.0
    assert v["validation.top_p"] == v["generation.top_p"] == 1.0
    assert v["validation.num_samples_per_prompt"] == 1  # grpo.val_num_generations_per_prompt
    assert v["validation.max_prompts"] == 256  # 256 // 256 batches of val_batch_size 256
    assert "policy.generation.val_top_k" not in skipped  # null: as here
