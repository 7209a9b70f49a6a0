"""Every RLinf config in tests/data/foreign/rlinf (SOURCES.md there): its outcome, and the
run-changing values it carries, against the YAML's own text.

Expected values come from reading the YAML with PyYAML here (not the importer's reader) and
RLinf's code at a3816b59 where it decides: rlinf/workers/actor/megatron_actor_worker.py
(the loss per micro-batch, use_valid_token_scale), rlinf/config.py validate_reasoning_cfg
(the mini-batch), reasoning_runner.py (no dynamic sampling). Every shipped config is refused
(placeholder model paths, a dataset we cannot identify, SGLang, ...), each feature named.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from dapo_megatron.migrate.foreign_source import read_source
from dapo_megatron.migrate.import_config import lacking_features, translate
from dapo_megatron.migrate.import_config import main as import_main

DATA = Path(__file__).resolve().parents[2] / "data" / "foreign" / "rlinf"


def raw(name: str) -> dict[str, Any]:
    return yaml.safe_load((DATA / name).read_text())


def expected(name: str) -> dict[str, Any]:
    """Our values, from the YAML text and RLinf's code (see the module docstring)."""
    y = raw(name)
    alg, model, runner = y["algorithm"], y["actor"]["model"], y["runner"]
    eps = alg["ratio_clip_eps"]
    group, prompts = alg["group_size"], y["data"]["rollout_batch_size"]
    out: dict[str, Any] = {
        "policy.megatron.tensor_model_parallel_size": model["tensor_model_parallel_size"],
        "policy.megatron.pipeline_model_parallel_size": model["pipeline_model_parallel_size"],
        "policy.megatron.sequence_parallel": model["sequence_parallel"],
        "cluster.num_nodes": y["cluster"]["num_nodes"],
        "dapo.num_generations_per_prompt": group,
        "dapo.num_prompts_per_step": prompts,
        # validate_reasoning_cfg: global_batch_size = rollout_batch_size x group // n_minibatches
        "policy.train_global_batch_size": prompts * group // alg.get("n_minibatches", 1),
        "policy.train_micro_batch_size": alg.get("training_batch_size_per_gpu", 1),
        "policy.optimizer.lr": float(y["actor"]["optim"]["lr"]),
        "policy.optimizer.clip_grad": y["actor"]["optim"]["clip_grad"],
        "dapo.loss.clip_ratio_low": alg.get("clip_ratio_low") or eps,
        "dapo.loss.clip_ratio_high": alg.get("clip_ratio_high") or eps,
        "policy.max_total_sequence_length": runner["seq_length"],
        "data.max_prompt_length": y["data"]["max_prompt_length"],
        "generation.engine.tensor_parallel_size": y["rollout"]["tensor_parallel_size"],
        "generation.engine.gpu_memory_utilization": y["rollout"]["gpu_memory_utilization"],
        # reasoning_runner.py filters no group; no length penalty; truncated responses train
        "dapo.dynamic_sampling.enabled": False,
        "dapo.overlong_buffer.enabled": False,
        "dapo.overlong_filtering": False,
        # reasoning_runner.py drops check_progress's validation flag: it never validates
        "validation.val_period": 0,
    }
    tokenizer = y["actor"]["tokenizer"]["tokenizer_model"]
    if not tokenizer.startswith("/path/to/"):
        out["policy.tokenizer_name_or_path"] = tokenizer
    if str(alg["sampling_params"]["max_new_tokens"]).startswith("${subtract"):
        out["generation.max_response_length"] = (
            runner["seq_length"] - y["data"]["max_prompt_length"]
        )
    placement = y["cluster"]["component_placement"]
    pipelined = "actor" in placement
    dynamic = runner.get("enable_dynamic_batch_size") is True
    if alg["loss_agg_func"] == "token-mean":
        if alg["use_valid_token_scale"] and not pipelined:
            out["dapo.loss.loss_agg_mode"] = "token-mean"  # scaled to the mini-batch's tokens
        elif (
            not alg["use_valid_token_scale"]
            and not dynamic
            and out["policy.train_micro_batch_size"] == 1
        ):
            out["dapo.loss.loss_agg_mode"] = "seq-mean-token-mean"  # one sample per micro-batch
    return out


SGLANG = "the sglang engine"
DATASET = "is a dataset file we cannot identify"
PLACEHOLDER = "is a placeholder path"
BLOCK = "recompute full/block/"
FP16 = "a static fp16 loss scale"
SPLIT = "a placement per component (disaggregated)"
ETP = "an expert tensor-parallel size (1) apart from TP"
OLD = "the engine's log-probs as the old policy"
REFUSED: dict[str, tuple[str, ...]] = {
    "moonlight-16b-grpo-megatron.yaml": (
        PLACEHOLDER, DATASET, SGLANG, ETP, "multi-head latent attention",
        "the DeepSeek-V3 architecture", "a precision-aware optimizer",
        "a token-mean per token-packed micro-batch",
    ),
    "qwen2.5-1.5b-grpo-megatron-dynamic.yaml": (
        PLACEHOLDER, DATASET, SGLANG, SPLIT, BLOCK, FP16, "RLinf's auto-scheduler",
        "a token mean over an estimated token count",
    ),
    "qwen2.5-1.5b-grpo-megatron-pipeline.yaml": (
        PLACEHOLDER, DATASET, SGLANG, SPLIT, BLOCK, FP16,
        "a token mean over an estimated token count",
    ),
    "qwen2.5-1.5b-grpo-megatron.yaml": (PLACEHOLDER, DATASET, SGLANG, BLOCK, FP16),
    "qwen2.5-1.5b-single-gpu.yaml": (PLACEHOLDER, DATASET, SGLANG, BLOCK, FP16),
    "qwen2.5-32b-grpo-megatron.yaml": (PLACEHOLDER, DATASET, SGLANG, BLOCK, OLD),
    "qwen2.5-7b-grpo-megatron.yaml": (PLACEHOLDER, DATASET, SGLANG, BLOCK, OLD),
    "qwen3-30b-grpo-megatron.yaml": (PLACEHOLDER, DATASET, SGLANG, ETP),
}  # fmt: skip


def test_every_config_has_an_outcome_and_a_source_row():
    files = sorted(p.name for p in DATA.glob("*.yaml"))
    assert files == sorted(REFUSED)
    sources = (DATA / "SOURCES.md").read_text()
    for name in files:
        assert f"| {name} |" in sources


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_refused_configs_name_each_missing_feature(tmp_path, capsys, name):
    """Exit 2, and each feature the file needs that we lack is named: the error names the
    first tier that stops the import (a model we cannot build, else the keys that change
    what is learned, else the recipe's validation), and the import's untranslated list
    (lacking_features of translate()) names every one."""
    out = tmp_path / "r.yaml"
    rc = import_main(["--from", "rlinf", str(DATA / name), "-o", str(out)])
    err = capsys.readouterr().err
    assert rc == 2, err
    result = translate("rlinf", read_source(DATA / name, {}))
    named = lacking_features(result.blocking)
    for feature in REFUSED[name]:
        assert feature in named, feature
    algorithm = [s for s in result.blocking if s.impact == "algorithm"]
    if "was not carried" not in err and algorithm:
        assert "nothing written" in err and not out.exists()
        assert lacking_features(algorithm) in err
    assert "no counterpart here" not in named


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_carried_values_match_the_config(name):
    result = translate("rlinf", read_source(DATA / name, {}))
    got = {s.key: s.value for s in result.settings}
    want = expected(name)
    for key, value in want.items():
        if key == "dapo.loss.loss_agg_mode":
            continue
        assert got.get(key) == value, key
    assert got.get("dapo.loss.loss_agg_mode") == want.get("dapo.loss.loss_agg_mode")
    assert "policy.model_name_or_path" not in got  # placeholders are never carried
    # Megatron-LM: warm-up = lr_warmup_fraction x lr_decay_iters optimizer steps (in samples)
    sched = raw(name)["actor"]["lr_sched"]
    span = sched["lr_warmup_fraction"] * sched["lr_decay_iters"]  # 0.01 x 10 = 0.1
    assert got["policy.scheduler.lr_warmup_steps"] == (1 if 0 < span <= 1 else span)
    assert not [s for s in result.skipped if s.reason == "no counterpart here"]


@pytest.mark.parametrize(
    "scale, micro, dynamic, agg",
    [
        (True, 1, False, "token-mean"),  # mask.sum() / global_valid_token x DP x micro-batches
        (False, 1, False, "seq-mean-token-mean"),  # masked_mean of one sample, averaged
        (False, 2, False, None),  # a token mean per 2-sample micro-batch: refused
        (False, 1, True, None),  # per token-packed micro-batch: refused
    ],
)
def test_token_mean_follows_the_micro_batch(scale, micro, dynamic, agg):
    """megatron_actor_worker.py loss_func: loss_agg_func runs per micro-batch; Megatron
    averages micro-batches and DP ranks; use_valid_token_scale rescales to a global token
    mean."""
    flat = {
        "algorithm.loss_agg_func": "token-mean",
        "algorithm.use_valid_token_scale": scale,
        "algorithm.training_batch_size_per_gpu": micro,
        "runner.enable_dynamic_batch_size": dynamic,
    }
    result = translate("rlinf", flat)
    v = {s.key: s.value for s in result.settings}
    assert v.get("dapo.loss.loss_agg_mode") == agg
    if agg is None:
        assert any(s.key == "algorithm.loss_agg_func" and s.blocking for s in result.skipped)


def test_dapo_guide_keys_are_not_live():
    """safe_length, len_reward_penalty and max_resample are read by no RLinf code at
    a3816b59 (only docs/.../algorithms/dapo.rst names them): listed as not live, and
    RLinf's runner has neither dynamic sampling nor a length penalty."""
    flat = {
        "algorithm.safe_length": 16384,
        "algorithm.max_length": 20480,
        "algorithm.max_resample": 5,
        "algorithm.len_reward_penalty": 0.1,
        "reward.reward_type": "math",
    }
    result = translate("rlinf", flat)
    v = {s.key: s.value for s in result.settings}
    assert (v["dapo.dynamic_sampling.enabled"], v["dapo.overlong_buffer.enabled"]) == (False, False)
    dead = {s.key for s in result.skipped if s.reason.startswith("not live")}
    assert {
        "algorithm.safe_length",
        "algorithm.max_resample",
        "algorithm.len_reward_penalty",
    } <= dead


@pytest.mark.parametrize(
    "fraction, decay, steps",
    [(0.01, 10, 1), (0.1, 100, 10), (0.015, 100, None), (0.01, None, 1000)],
)
def test_warmup_fraction_is_a_span_of_optimizer_steps(fraction, decay, steps):
    """Megatron-LM's get_optimizer_param_scheduler: fraction x lr_decay_iters (train_iters,
    100000 in RLinf's config.py, when null) iterations, stepped in samples per optimizer
    step: 0.1 of a step leaves step 0 at lr_warmup_init and the rest at lr, as a 1-step
    warm-up here; 1.5 steps has no counterpart."""
    flat = {"actor.lr_sched.lr_warmup_fraction": fraction, "actor.lr_sched.lr_warmup_iters": 0}
    if decay is not None:
        flat["actor.lr_sched.lr_decay_iters"] = decay
    result = translate("rlinf", flat)
    v = {s.key: s.value for s in result.settings}
    assert v.get("policy.scheduler.lr_warmup_steps") == steps
