"""Every NeMo RL file of tests/data/foreign/nemo-rl (SOURCES.md) through dapo-import-config:
its outcome, the features a refusal names, and the run-changing values it carries.

The expectations are read from the raw YAML here, independently of the importer: a plain
yaml.safe_load of the file and its `defaults:` parents, merged (a child's key replaces its
parent's), with OmegaConf's `${a.b}` / `${.b}` references followed by hand. What each value
means in NeMo RL was read from its code at 7ea279ab (cited at each rule). NeMo-B's layout
keys (cluster, parallelism, engine) are checked in their own tests; here a file's outcome
only needs that every feature below is named, and that each of the keys this table owns
that blocks names one of them.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from dapo_megatron.migrate.foreign_source import read_source, resolve_interpolations
from dapo_megatron.migrate.import_config import main as import_main
from dapo_megatron.migrate.import_config import translate

DATA = Path(__file__).resolve().parents[2] / "data" / "foreign" / "nemo-rl"
FILES = sorted(str(p.relative_to(DATA)) for p in DATA.rglob("*.yaml"))

# Keys of NeMo RL's layout (nemo_layout.py, checked in its own tests)
LAYOUT = re.compile(
    r"^(cluster\.|policy\.megatron_cfg\.(?!optimizer\.|scheduler\.)|policy\.dtensor_cfg\.|"
    r"policy\.dynamic_batching\.|policy\.sequence_packing\.|data_plane\.|policy\.precision|"
    r"policy\.generation\.(backend|colocated|vllm_cfg|vllm_kwargs|mcore_generation_config|"
    r"refit|trtllm)|policy\.make_sequence_length|policy\.hf_config|policy\.offload|"
    r"policy\.(train|logprob)_micro|policy\.logprob_batch|policy\.refit)"
)


# ---------------------------------------------------------------------------------------
# An independent reading of the raw YAML


def _merge(base: dict[str, Any], child: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in child.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out


def _tree(path: Path) -> dict[str, Any]:
    data = yaml.safe_load(path.read_text()) or {}
    parents = data.pop("defaults", None) or []
    base: dict[str, Any] = {}
    for parent in [parents] if isinstance(parents, str) else parents:
        base = _merge(base, _tree((path.parent / parent).resolve()))
    return _merge(base, data)


_REF = re.compile(r"^\$\{(\.*)([\w.]+)\}$")


def _get(tree: dict[str, Any], key: str, default: Any = None) -> Any:
    node: Any = tree
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            return default
        node = node[part]
    if isinstance(node, str) and (m := _REF.match(node)):
        dots, target = m.groups()
        if dots:  # relative: `${.x}` is a sibling
            target = ".".join([*key.split(".")[: -len(dots)], target])
        return _get(tree, target, default)
    return node


# ---------------------------------------------------------------------------------------
# What a NeMo RL config needs that dapo-megatron lacks, by hand from NeMo RL's code


def expected_features(t: dict[str, Any]) -> set[str]:
    """Phrases the refusal must contain, one per feature this file needs."""
    g = lambda k, d=None: _get(t, k, d)  # noqa: E731
    need: set[str] = set()
    train, val = g("data.train.dataset_name"), g("data.validation.dataset_name")
    # response_datasets/__init__.py: only these two load our hub datasets (dapo_math.py)
    if train != "DAPOMath17K":
        need.add(f"NeMo RL's {train} dataset")
    if val not in (None, "DAPOMath17K", "DAPOMathAIME2024"):
        need.add(f"NeMo RL's {val} dataset")
    if train == "OpenMathInstruct-2" and g("data.train.split_validation_size", 0.05):
        need.add("a validation split held out of the training data")  # openmathinstruct2.py
    if g("data.default.prompt_file") is not None:  # processors.py: prompt.format(problem)
        need.add("a custom prompt template")
    if g("data.validation.repeat", 1) != 1:  # aime.py: dataset.repeat(repeat)
        need.add("a validation set repeated")
    kl = g("loss_fn.reference_policy_kl_penalty", 0.01)
    # utils.py calculate_kl: kl.clamp(-out, out) when output_clamp_value is set
    if kl and g("loss_fn.kl_output_clamp_value", 10.0) is not None:
        need.add("a clamp of the per-token KL estimate")
    if kl and g("loss_fn.use_on_policy_kl_approximation"):
        need.add("an importance-weighted on-policy KL estimate")
    # the engine's context less the prompt caps a response (vllm_worker.py)
    prompt, response = g("data.max_input_seq_length"), g("policy.generation.max_new_tokens")
    if prompt - 1 + response > g("policy.max_total_sequence_length"):
        need.add("a per-prompt response cap")
    if g("loss_fn.use_importance_sampling_correction"):
        kind = g("loss_fn.truncated_importance_sampling_type")
        if kind is None or g("loss_fn.truncated_importance_sampling_ratio") is None:
            need.add("an uncapped importance-sampling correction")
        elif kind != "tis" or g("loss_fn.truncated_importance_sampling_ratio_min") not in (None, 0):
            need.add(f"NeMo RL's {kind}")
    for key, phrase in (
        ("loss_fn.force_on_policy_ratio", "a ratio forced to 1"),
        ("loss_fn.use_cispo", "the CISPO loss"),
        ("loss_fn.sequence_level_importance_ratios", "sequence-level importance ratios"),
        ("loss_fn.disable_ppo_ratio", "a REINFORCE loss"),
        ("grpo.async_grpo.enabled", "NeMo RL's async GRPO"),
        ("policy.draft.enabled", "speculative-decoding draft model"),
        ("policy.generation.real_quant", "ModelOpt quantisation"),
    ):
        if g(key) is True:
            need.add(phrase)
    if g("policy.quant_cfg") is not None or g("policy.generation.quant_cfg") is not None:
        need.add("ModelOpt quantisation")
    sampler = g("async_rl.sampler.name")
    if sampler is not None and not (
        sampler == "in_order" and g("async_rl.sampler.max_lookahead_versions", 0) == 0
    ):
        need.add("single-controller asynchronous rollouts")
    if g("policy.tokenizer.chat_template_kwargs.enable_thinking") is False:
        need.add("arguments to the chat template")
    if g("policy.generation.val_top_k") not in (None, 0, -1):
        need.add("top-k sampling in validation")
    # reward_functions.py: the penalty's Lmax apart from the engine's cap
    if (
        g("grpo.reward_shaping.enabled")
        and g("grpo.reward_shaping.max_response_length") != response
    ):
        need.add("an overlong-penalty length")
    ds = g("grpo.use_dynamic_sampling") is True
    if ds and g("grpo.use_leave_one_out_baseline"):  # grpo.py: a per-sample LOO std filter
        need.add("per-sample leave-one-out dynamic-sampling filter")
    if g("grpo.adv_estimator.name", "grpo") != "grpo":
        need.add("advantage estimator")
    if not _epochs_end_after_the_steps(t):
        need.add("a stop after max_num_epochs passes")
    return need


def _epochs_end_after_the_steps(t: dict[str, Any]) -> bool:
    """grpo.py ends the run after max_num_epochs passes over the data or max_num_steps
    steps, whichever comes first; with the row counts of the datasets (DAPO-Math-17k's
    parquet ~1.79M rows, OpenMathInstruct-2's train_1M less 5%), the steps surely come
    first when even the most prompts they can draw fit in the epochs."""
    if _get(t, "data.use_multiple_dataloader"):
        return True
    rows = {"DAPOMath17K": 1_700_000, "OpenMathInstruct-2": 900_000}.get(
        _get(t, "data.train.dataset_name")
    )
    if rows is None:
        return False
    prompts, steps = _get(t, "grpo.num_prompts_per_step"), _get(t, "grpo.max_num_steps")
    rounds = 1
    if _get(t, "grpo.use_dynamic_sampling"):
        rounds = _get(t, "grpo.dynamic_sampling_max_gen_batches", 10) + 1
        prompts = int(prompts * _get(t, "grpo.batch_multiplier", 1))
    return steps * rounds * prompts <= _get(t, "grpo.max_num_epochs", 1) * rows - prompts


_FAMILY = ("nemotron", "moonlight", "deepseek", "gpt-oss", "glm", "qwen3.5")


def _family(t: dict[str, Any]) -> str | None:
    """The family of a model we cannot build that the file names (config/model_arch.py
    builds Qwen2/2.5, Llama 3, Qwen3 and Qwen3-MoE; DeepSeek-R1-Distill-Qwen is a Qwen2),
    "prose" for a sentence in place of a name, else None."""
    model = str(_get(t, "policy.model_name")).lower()
    if model.startswith("follow instructions"):
        return "prose"
    model = model.rsplit("/", 1)[-1]
    if "distill-qwen" in model:
        return None
    return next((f for f in _FAMILY if f in model), None)


def _plans(t: dict[str, Any]) -> bool:
    """No feature this table owns blocks (the model's family included)."""
    return not expected_features(t) and _family(t) is None


# The outcome of each file: "plans", or the features it needs that we lack, by tag (TAGS),
# plus "model:<family>" where its model is a family we cannot build (or prose, not a name).
# Every NeMo RL file kept needs at least one: NeMo RL's default training set and prompt
# (OpenMathInstruct-2 with examples/prompts/cot.txt and a 5% held-out split), its clamped
# KL term, its response cap per prompt (max_total_sequence_length shared by the prompt and
# the response) and its stop at the end of an epoch are the common ones. The table is
# checked against expected_features (the rules above), both from the raw YAML; a file that
# would plan but for NeMo-B's layout keys would say so here.
TAGS = {
    "omi": "NeMo RL's OpenMathInstruct-2 dataset",
    "aime2024": "NeMo RL's AIME2024 dataset",
    "deepscaler": "NeMo RL's DeepScaler dataset",
    "split": "a validation split held out of the training data",
    "prompt": "a custom prompt template",
    "kl-clamp": "a clamp of the per-token KL estimate",
    "cap": "a per-prompt response cap",
    "epochs": "a stop after max_num_epochs passes",
    "uncapped-is": "an uncapped importance-sampling correction",
    "ratio-1": "a ratio forced to 1",
    "cispo": "the CISPO loss",
    "async": "NeMo RL's async GRPO",
    "sc-async": "single-controller asynchronous rollouts",
    "draft": "speculative-decoding draft model",
    "quant": "ModelOpt quantisation",
    "thinking-off": "arguments to the chat template",
    "val-top-k": "top-k sampling in validation",
    "penalty-length": "an overlong-penalty length",
    "on-policy-kl": "an importance-weighted on-policy KL estimate",
    "val-repeat": "a validation set repeated",
}
OUTCOMES: dict[str, str] = {
    "grpo_math_1B.yaml": "cap epochs kl-clamp omi prompt split",
    "grpo_math_1B_megatron.yaml": "cap epochs kl-clamp omi prompt split",
    "grpo_math_1B_megatron_single_controller.yaml": (
        "cap epochs kl-clamp omi prompt sc-async split"
    ),
    "grpo_math_1B_trtllm.yaml": "cap epochs kl-clamp omi prompt split",
    "grpo_math_70B_megatron.yaml": "cap epochs kl-clamp omi prompt split",
    "grpo_math_70B_megatron_fp8.yaml": "cap epochs kl-clamp omi prompt split uncapped-is",
    "grpo_math_8B_megatron.yaml": "cap epochs kl-clamp omi prompt split",
    "grpo_math_8B_megatron_fp8.yaml": "cap epochs kl-clamp omi prompt split uncapped-is",
    "grpo_math_8B_megatron_nixl.yaml": "cap epochs kl-clamp omi prompt split",
    "grpo_math_qwen30ba3b_megatron.yaml": "cap epochs kl-clamp omi prompt split",
    "recipes/llm/dapo-qwen2.5-7b-16n4g-fsdp2cp2.v2.yaml": "cap epochs penalty-length",
    "recipes/llm/dapo-qwen2.5-7b.v2.yaml": "cap epochs penalty-length",
    "recipes/llm/grpo-cispo-mm1-async-lag1-highoffpolicy-qwen3-30ba3b-3n8g-megatron-cispo.yaml": (
        "async cap cispo omi prompt split uncapped-is"
    ),
    "recipes/llm/grpo-dapomath17k-dsv3-32n4g-megatron.yaml": (
        "cap epochs kl-clamp on-policy-kl uncapped-is model:prose"
    ),
    "recipes/llm/grpo-dapomath17k-dsv3-megatron.yaml": (
        "cap epochs kl-clamp on-policy-kl uncapped-is model:prose"
    ),
    "recipes/llm/grpo-dapomath17k-nanov3-30BA3B-8n4g-megatron-trtllm.yaml": (
        "uncapped-is model:nemotron"
    ),
    "recipes/llm/grpo-deepscaler-1.5b-8K.yaml": "aime2024 cap deepscaler epochs prompt val-repeat",
    "recipes/llm/grpo-glm5.1-64n8g-megatron.yaml": (
        "cap kl-clamp omi prompt split uncapped-is model:glm"
    ),
    "recipes/llm/grpo-gptoss-20b-8n4g-megatron.yaml": (
        "cap epochs kl-clamp omi prompt split uncapped-is model:gpt-oss"
    ),
    "recipes/llm/grpo-gptoss-20b-8n8g-megatron.yaml": (
        "cap epochs kl-clamp omi prompt split uncapped-is model:gpt-oss"
    ),
    "recipes/llm/grpo-llama3.1-8b-instruct-1n8g-megatron-fp8-rollouts.v3-tq_simple.yaml": (
        "cap kl-clamp omi prompt split uncapped-is"
    ),
    "recipes/llm/grpo-llama3.1-8b-instruct-1n8g-megatron-fp8-rollouts.v3.yaml": (
        "cap kl-clamp omi prompt split uncapped-is"
    ),
    "recipes/llm/grpo-llama3.1-8b-instruct-2n4g-async-1off-single-controller-streaming2.yaml": (
        "cap kl-clamp omi prompt ratio-1 sc-async split uncapped-is"
    ),
    "recipes/llm/grpo-llama3.1-8b-instruct-2n8g-async-1off-single-controller-streaming2.yaml": (
        "cap kl-clamp omi prompt ratio-1 sc-async split uncapped-is"
    ),
    "recipes/llm/grpo-llama3.1-8b-instruct-2n8g-megatron-fp8-e2e-tq_mooncake.yaml": (
        "cap kl-clamp omi prompt split uncapped-is"
    ),
    "recipes/llm/grpo-llama3.1-8b-instruct-2n8g-megatron-fp8-e2e.yaml": (
        "cap kl-clamp omi prompt split uncapped-is"
    ),
    "recipes/llm/grpo-llama3.1-8b-instruct-2n8g-ready-first-single-controller.yaml": (
        "cap omi prompt sc-async split uncapped-is"
    ),
    "recipes/llm/grpo-llama3.2-1b-instruct-1n4g-megatron.yaml": "cap kl-clamp omi prompt split",
    "recipes/llm/grpo-llama3.2-1b-instruct-1n4g-megatron_generation.yaml": (
        "cap kl-clamp omi prompt split"
    ),
    "recipes/llm/grpo-llama3.2-1b-instruct-1n8g-megatron-temp0.8-topp0.9-topk50-tq_mooncake.yaml": (
        "cap kl-clamp omi prompt split val-top-k"
    ),
    "recipes/llm/grpo-llama3.2-1b-instruct-1n8g-megatron-temp0.8-topp0.9-topk50.yaml": (
        "cap kl-clamp omi prompt split val-top-k"
    ),
    "recipes/llm/grpo-llama3.2-1b-instruct-1n8g-megatron-tq_simple.yaml": (
        "cap kl-clamp omi prompt split"
    ),
    "recipes/llm/grpo-llama3.2-1b-instruct-1n8g-megatron.yaml": "cap kl-clamp omi prompt split",
    "recipes/llm/grpo-llama3.2-1b-instruct-1n8g-megatron_generation-tq_mooncake.yaml": (
        "cap kl-clamp omi prompt split"
    ),
    "recipes/llm/grpo-llama3.2-1b-instruct-1n8g-megatron_generation.yaml": (
        "cap kl-clamp omi prompt split"
    ),
    "recipes/llm/grpo-llama3.2-1b-instruct-2n8g-megatron_generation-noncolocated.yaml": (
        "cap kl-clamp omi prompt split"
    ),
    "recipes/llm/grpo-math-qwen3-30ba3b-megatron-tp4-32k.yaml": "cap kl-clamp omi prompt split",
    "recipes/llm/grpo-moonlight-16ba3b-4n4g-megatron.yaml": (
        "cap epochs kl-clamp omi prompt split model:moonlight"
    ),
    "recipes/llm/grpo-moonlight-16ba3b-4n8g-megatron-fp8-e2e.yaml": (
        "cap epochs kl-clamp omi prompt split uncapped-is model:moonlight"
    ),
    "recipes/llm/grpo-moonlight-16ba3b-4n8g-megatron-tq_simple.yaml": (
        "cap epochs kl-clamp omi prompt split model:moonlight"
    ),
    "recipes/llm/grpo-moonlight-16ba3b-4n8g-megatron.yaml": (
        "cap epochs kl-clamp omi prompt split model:moonlight"
    ),
    "recipes/llm/grpo-nano-v2-12b-1n4g-megatron.yaml": (
        "cap kl-clamp omi prompt split model:nemotron"
    ),
    "recipes/llm/grpo-nano-v2-12b-1n8g-megatron.yaml": (
        "cap kl-clamp omi prompt split model:nemotron"
    ),
    "recipes/llm/grpo-nanov3-30BA3B-2n8g-megatron-lora.yaml": (
        "cap epochs kl-clamp omi prompt split model:nemotron"
    ),
    "recipes/llm/grpo-nanov3-30BA3B-2n8g-megatron-pack-cp-tq_simple.yaml": (
        "cap epochs kl-clamp omi prompt split model:nemotron"
    ),
    "recipes/llm/grpo-nanov3-30BA3B-2n8g-megatron-pack-cp.yaml": (
        "cap epochs kl-clamp omi prompt split model:nemotron"
    ),
    "recipes/llm/grpo-nanov3-30BA3B-2n8g-megatron_generation.yaml": (
        "cap epochs kl-clamp omi prompt split model:nemotron"
    ),
    "recipes/llm/grpo-nanov3-30BA3B-4n4g-megatron_async_colocated.yaml": (
        "async cap epochs kl-clamp omi prompt split uncapped-is model:nemotron"
    ),
    "recipes/llm/grpo-nanov3-30BA3B-4n4g-megatron_colocated_reshard.yaml": (
        "cap kl-clamp omi prompt split model:nemotron"
    ),
    "recipes/llm/grpo-nanov3-30BA3B-4n4g-megatron_sync_colocated.yaml": (
        "cap epochs kl-clamp omi prompt split uncapped-is model:nemotron"
    ),
    "recipes/llm/grpo-nemotron3-super-120BA12B-16n4g-megatron-qa-bf16-300step.yaml": (
        "omi split thinking-off model:nemotron"
    ),
    "recipes/llm/grpo-nemotron3-super-120BA12B-16n4g-megatron-qa-nvfp4-w4a16-real-300step.yaml": (
        "omi quant split thinking-off model:nemotron"
    ),
    "recipes/llm/grpo-nemotron3-super-120BA12B-16n4g-megatron-qa-nvfp4-w4a4-real-300step.yaml": (
        "omi quant split thinking-off model:nemotron"
    ),
    "recipes/llm/grpo-nemotron3-super-120BA12B-16n8g-megatron.yaml": (
        "cap epochs kl-clamp omi prompt split model:nemotron"
    ),
    "recipes/llm/grpo-nemotron3-super-120BA12B-8n4g-megatron.yaml": (
        "cap epochs kl-clamp omi prompt split model:nemotron"
    ),
    "recipes/llm/grpo-qwen2.5-0.5b-1n4g-megatron-trtllm-noncolocated-async.yaml": (
        "async cap epochs kl-clamp omi prompt split"
    ),
    "recipes/llm/grpo-qwen2.5-1.5B-4n8g-megatron-yarn-256k.yaml": "cap kl-clamp omi prompt split",
    "recipes/llm/grpo-qwen2.5-7b-instruct-4n4g-megatron.yaml": "cap kl-clamp omi prompt split",
    "recipes/llm/grpo-qwen2.5-7b-instruct-4n8g-megatron.yaml": "cap kl-clamp omi prompt split",
    "recipes/llm/grpo-qwen2.5-math-1.5b-instruct-1n4g-megatron-single-controller-sync.yaml": (
        "cap kl-clamp omi prompt split"
    ),
    "recipes/llm/grpo-qwen2.5-math-1.5b-instruct-1n8g-fsdp2tp1.v3.yaml": (
        "cap kl-clamp omi prompt split"
    ),
    "recipes/llm/grpo-qwen2.5-math-1.5b-instruct-1n8g-megatron-single-controller-sync.yaml": (
        "cap kl-clamp omi prompt split"
    ),
    "recipes/llm/grpo-qwen3-1.7b-1n4g-megatron-eagle3.yaml": "cap draft kl-clamp omi prompt split",
    "recipes/llm/grpo-qwen3-1.7b-1n8g-megatron-eagle3-tq_mooncake.yaml": (
        "cap draft kl-clamp omi prompt split"
    ),
    "recipes/llm/grpo-qwen3-1.7b-1n8g-megatron-eagle3.yaml": "cap draft kl-clamp omi prompt split",
    "recipes/llm/grpo-qwen3-30ba3b-10n8g-megatron-cp2-r3-async-single-controller.yaml": (
        "epochs kl-clamp omi prompt sc-async split uncapped-is"
    ),
    "recipes/llm/grpo-qwen3-30ba3b-10n8g-megatron-cp2-r3-async.yaml": (
        "async epochs kl-clamp omi prompt split uncapped-is"
    ),
    "recipes/llm/grpo-qwen3-30ba3b-2n8g-megatron_fused_linear_logprobs.yaml": (
        "cap omi prompt split"
    ),
    "recipes/llm/grpo-qwen3-30ba3b-4n8g-megatron-zmq-deltaweight-noncolocated.yaml": (
        "cap kl-clamp omi prompt ratio-1 split"
    ),
    "recipes/llm/grpo-qwen3-30ba3b-8n4g-megatron.yaml": "cap epochs kl-clamp omi prompt split",
    "recipes/llm/grpo-qwen3-30ba3b-8n8g-megatron-cp2-r3-tq_simple.yaml": (
        "epochs kl-clamp omi prompt split"
    ),
    "recipes/llm/grpo-qwen3-30ba3b-8n8g-megatron-cp2-r3.yaml": "epochs kl-clamp omi prompt split",
    "recipes/llm/grpo-qwen3-30ba3b-8n8g-megatron.yaml": "cap epochs kl-clamp omi prompt split",
    "recipes/llm/grpo-qwen3-8b-base-1n8g-fp8-kvcache-megatron.yaml": (
        "cap epochs kl-clamp uncapped-is"
    ),
    "recipes/llm/grpo-qwen3-8b-base-1n8g-megatron-lora.yaml": (
        "cap epochs kl-clamp omi prompt split"
    ),
    "recipes/llm/grpo-qwen3-8b-base-dapo-2n8g-long-megatron-qa-nvfp4-w4a16.yaml": (
        "quant uncapped-is"
    ),
    "recipes/llm/grpo-qwen3.5-35ba3b-2n8g-megatron-ep16tp2-fp8.yaml": (
        "cap epochs kl-clamp omi prompt split model:qwen3.5"
    ),
    "recipes/llm/grpo-qwen3.5-35ba3b-2n8g-megatron-ep16tp2cp2.yaml": (
        "cap epochs kl-clamp omi prompt split model:qwen3.5"
    ),
    "recipes/llm/grpo-qwen3.5-397ba17b-32n8g-megatron.v2.yaml": "cap prompt model:qwen3.5",
    "recipes/llm/grpo-qwen3.5-9b-1n8g-megatron-fp8.yaml": (
        "cap epochs kl-clamp omi prompt split model:qwen3.5"
    ),
    "recipes/llm/grpo-qwen3.5-9b-1n8g-megatron.yaml": (
        "cap epochs kl-clamp omi prompt split model:qwen3.5"
    ),
    "recipes/llm/performance/grpo-llama3.1-8b-instruct-2n8g-async-1off.yaml": (
        "async cap kl-clamp omi prompt ratio-1 split uncapped-is"
    ),
    "recipes/llm/performance/grpo-llama3.1-8b-instruct-2n8g.yaml": (
        "cap kl-clamp omi prompt ratio-1 split uncapped-is"
    ),
    "recipes/llm/performance/grpo-qwen3-30ba3b-4n8g.yaml": (
        "cap epochs kl-clamp omi prompt ratio-1 split"
    ),
}
PLANS = frozenset(name for name, outcome in OUTCOMES.items() if outcome == "plans")


def _outcome(name: str) -> tuple[set[str], str | None]:
    """(the features a file's refusal names, its model family or None) from OUTCOMES."""
    tags = OUTCOMES[name].split()
    family = next((t.split(":", 1)[1] for t in tags if t.startswith("model:")), None)
    return {TAGS[t] for t in tags if not t.startswith("model:")}, family


def test_every_file_has_an_outcome():
    assert sorted(OUTCOMES) == FILES


@pytest.mark.parametrize("name", FILES)
def test_the_outcome_table_matches_the_rules(name):
    t = _tree(DATA / name)
    need, family = _outcome(name)
    assert need == expected_features(t)
    assert family == _family(t)
    assert (name in PLANS) == _plans(t)


def _flat(name: str) -> dict[str, Any]:
    flat = read_source(DATA / name, {})
    resolve_interpolations(flat)
    return flat


@pytest.mark.parametrize("name", FILES)
def test_outcome_names_each_missing_feature(tmp_path, capsys, name):
    need, family = _outcome(name)
    out = tmp_path / "r.yaml"
    rc = import_main(["--from", "nemo-rl", str(DATA / name), "-o", str(out)])
    printed = capsys.readouterr()
    err = printed.err
    if name in PLANS:
        assert rc == 0, err
        return
    assert rc == 2 and not out.exists(), err
    if family is not None:
        # a model we cannot build stops the import first, naming it (import_config.py)
        assert "policy.model_name" in err
        return
    for phrase in need:
        # what is learned: in the refusal; speed only (a draft model): in the key listing
        assert phrase in err or phrase in printed.out, phrase
    # each of this table's keys that blocks names one of those features (or the model)
    result = translate("nemo-rl", _flat(name))
    for s in result.blocking:
        if LAYOUT.match(s.key):
            continue
        if s.key == "policy.model_name":
            continue  # a family we cannot build: dialects.UNSUPPORTED_FAMILIES
        assert any(p in s.reason for p in need), (s.key, s.reason)


# ---------------------------------------------------------------------------------------
# The run-changing values carried, against the raw YAML


def expected_values(t: dict[str, Any]) -> dict[str, Any]:
    g = lambda k, d=None: _get(t, k, d)  # noqa: E731
    megatron = g("policy.megatron_cfg.enabled") is True
    ds = g("grpo.use_dynamic_sampling") is True
    loo = g("grpo.adv_estimator.use_leave_one_out_baseline")
    v: dict[str, Any] = {
        "dapo.num_prompts_per_step": g("grpo.num_prompts_per_step"),
        "dapo.num_generations_per_prompt": g("grpo.num_generations_per_prompt"),
        "dapo.max_num_steps": g("grpo.max_num_steps"),
        "dapo.loss.clip_ratio_low": g("loss_fn.ratio_clip_min"),
        "dapo.loss.clip_ratio_high": g("loss_fn.ratio_clip_max"),
        "dapo.loss.clip_ratio_c": g("loss_fn.ratio_clip_c"),
        "dapo.loss.kl_coef": g("loss_fn.reference_policy_kl_penalty"),
        "dapo.loss.loss_agg_mode": "token-mean" if g("loss_fn.token_level_loss") else "seq-mean-token-mean",
        "dapo.dynamic_sampling.enabled": ds,
        # advantage_estimator.py GRPOAdvantageEstimator: / (std + 1e-6), LOO over the others
        "dapo.advantage.norm_by_std": g("grpo.adv_estimator.normalize_rewards"),
        "dapo.advantage.eps": 1e-6,
        "dapo.advantage.leave_one_out": loo,
        "dapo.advantage.std_over": "others" if loo else "group",
        "generation.temperature": g("policy.generation.temperature"),
        "generation.top_p": g("policy.generation.top_p"),
        "generation.max_response_length": g("policy.generation.max_new_tokens"),
        "data.max_prompt_length": g("data.max_input_seq_length") - 1,
        "validation.num_samples_per_prompt": g("grpo.val_num_generations_per_prompt"),
        "validation.temperature": g("policy.generation.val_temperature"),
        "policy.train_global_batch_size": g("policy.train_global_batch_size"),
        "run.seed": g("grpo.seed"),
    }  # fmt: skip
    if ds:  # grpo.py dynamic_sampling(): the batch is sliced, the surplus dropped
        v["dapo.dynamic_sampling.surplus"] = "discard"
        v["dapo.dynamic_sampling.metric"] = "score"  # the filter reads unshaped_total_reward
        v["dapo.dynamic_sampling.max_gen_batches"] = g("grpo.dynamic_sampling_max_gen_batches") + 1
    if megatron:
        v["policy.optimizer.lr"] = g("policy.megatron_cfg.optimizer.lr")
        v["policy.optimizer.clip_grad"] = g("policy.megatron_cfg.optimizer.clip_grad")
        # Megatron's scheduler sets the weight decay it trains with (constant style)
        v["policy.optimizer.weight_decay"] = g("policy.megatron_cfg.scheduler.end_weight_decay")
    else:
        v["policy.optimizer.lr"] = g("policy.optimizer.kwargs.lr")
        v["policy.optimizer.clip_grad"] = g("policy.max_grad_norm")
    if g("data.train.dataset_name") == "DAPOMath17K":
        v["data.train_path"] = "hf://BytedTsinghua-SIA/DAPO-Math-17k"
        v["data.format"] = "dapo_math"
    if g("data.validation.dataset_name") == "DAPOMathAIME2024":
        v["data.val_path"] = "hf://BytedTsinghua-SIA/AIME-2024"
    if "validation" in t.get("data", {}) and t["data"]["validation"] is None:
        v["data.val_path"] = None  # no validation file: never our default one
    return v


@pytest.mark.parametrize("name", FILES)
def test_carried_values_match_the_yaml(name):
    t = _tree(DATA / name)
    got = {s.key: s.value for s in translate("nemo-rl", _flat(name)).settings}
    for key, want in expected_values(t).items():
        assert key in got, key
        assert got[key] == want and type(got[key]) is type(want), (key, got[key], want)


def test_dapo_recipe_by_hand():
    """dapo-qwen2.5-7b.v2.yaml over grpo_math_1B.yaml, read by eye: 512 prompts x 16, DS on
    with batch_multiplier 3, use_leave_one_out_baseline false (so the estimator's too),
    clip 0.2 / 0.28 / c 10, no KL, DAPOMath17K + DAPOMathAIME2024, prompts < 2048 tokens."""
    v = {
        s.key: s.value
        for s in translate("nemo-rl", _flat("recipes/llm/dapo-qwen2.5-7b.v2.yaml")).settings
    }
    assert (v["dapo.num_prompts_per_step"], v["dapo.num_generations_per_prompt"]) == (512, 16)
    assert v["dapo.dynamic_sampling.batch_multiplier"] == 3.0
    assert (v["dapo.dynamic_sampling.enabled"], v["dapo.dynamic_sampling.surplus"]) == (
        True,
        "discard",
    )
    assert (v["dapo.advantage.leave_one_out"], v["dapo.advantage.std_over"]) == (False, "group")
    assert (
        v["dapo.loss.clip_ratio_high"],
        v["dapo.loss.clip_ratio_c"],
        v["dapo.loss.kl_coef"],
    ) == (0.28, 10, 0.0)
    assert v["data.train_path"] == "hf://BytedTsinghua-SIA/DAPO-Math-17k"
    assert v["data.val_path"] == "hf://BytedTsinghua-SIA/AIME-2024"
    assert v["data.max_prompt_length"] == 2047
    # LinearLR from 1e-8 x 1e-6 over 10 GRPO steps (DTensor: policy.scheduler is live)
    assert (v["policy.scheduler.lr_warmup_steps"], v["policy.scheduler.unit"]) == (10, "train_step")
    assert v["policy.scheduler.lr_warmup_init"] == pytest.approx(1e-14)
    assert v["validation.max_prompts"] == 960  # 960 // 960 batches of 960
    assert v["reward.verifier"] == "math"  # env.math.math_verify_impl dapo_math_verify


def test_grpo_megatron_recipe_by_hand():
    """grpo-llama3.2-1b-instruct-1n8g-megatron.yaml over grpo_math_1B.yaml: the base's
    leave-one-out GRPO estimator, Megatron's optimizer (lr 5e-6 base? the recipe's), the
    scheduler's weight decay, and the features it needs named."""
    name = "recipes/llm/grpo-llama3.2-1b-instruct-1n8g-megatron.yaml"
    t = _tree(DATA / name)
    v = {s.key: s.value for s in translate("nemo-rl", _flat(name)).settings}
    assert (v["dapo.advantage.leave_one_out"], v["dapo.advantage.std_over"]) == (True, "others")
    assert v["dapo.advantage.norm_by_std"] is True
    assert v["dapo.dynamic_sampling.enabled"] is False and "dapo.dynamic_sampling.surplus" not in v
    assert v["policy.optimizer.lr"] == t["policy"]["megatron_cfg"]["optimizer"]["lr"]
    assert v["policy.optimizer.weight_decay"] == 0.01  # base scheduler end_weight_decay
    assert v["validation.temperature"] == v["generation.temperature"]  # ${.temperature}
    assert v["dapo.loss.kl_estimator"] == "k3"
    need = expected_features(t)
    assert {"NeMo RL's OpenMathInstruct-2 dataset", "a custom prompt template"} <= need
    assert "a clamp of the per-token KL estimate" in need  # kl 0.01 with the +-10 clamp
