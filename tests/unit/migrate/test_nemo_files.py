"""Every NeMo RL file of tests/data/foreign/nemo-rl (SOURCES.md) through dapo-import-config:
its outcome (plans, written but does not fit, refused naming each feature, or written but
does not validate), checked by running the importer, and the run-changing values it
carries.

The expectations are read from the raw YAML here, independently of the importer: a plain
yaml.safe_load of the file and its `defaults:` parents, merged (a child's key replaces its
parent's), with OmegaConf's `${a.b}` / `${.b}` references followed by hand. What each value
means in NeMo RL was read from its code at 7ea279ab (cited at each rule). NeMo RL's layout
keys (cluster, parallelism, engine, kernels, LoRA, FP8, ...) are checked in
test_nemo_layout.py; here a refused file's outcome only needs that every feature below is
named, and that each blocking key this table owns names one of them.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from dapo_megatron.data.prompt_template import NEMO_COT_TEMPLATE
from dapo_megatron.migrate.foreign_source import read_source, resolve_interpolations
from dapo_megatron.migrate.import_config import main as import_main
from dapo_megatron.migrate.import_config import translate
from dapo_megatron.migrate.nemo_data import COT_TEMPLATE

DATA = Path(__file__).resolve().parents[2] / "data" / "foreign" / "nemo-rl"
FILES = sorted(str(p.relative_to(DATA)) for p in DATA.rglob("*.yaml"))
DAPO_MATH_ROWS = 1_791_700  # DAPO-Math-17k's parquet rows, each problem ~100 times

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
    # response_datasets/__init__.py: these load our hub datasets (dapo_math.py,
    # openmathinstruct2.py: split train_1M, problem -> user message, expected_answer)
    if train not in ("DAPOMath17K", "OpenMathInstruct-2"):
        need.add(f"NeMo RL's {train} dataset")
    if val not in (None, "DAPOMath17K", "DAPOMathAIME2024"):
        need.add(f"NeMo RL's {val} dataset")
    # openmathinstruct2.py -> raw_dataset.py split_train_validation(size, data.train.seed):
    # ours is data.val_fraction, seeded by run.seed (grpo.seed)
    split = g("data.train.split_validation_size", 0.05)
    if train == "OpenMathInstruct-2" and split and g("data.train.seed", 42) != g("grpo.seed"):
        need.add("a held-out split seeded apart from the run")
    prompt_file = g("data.default.prompt_file")  # processors.py: prompt.format(problem)
    if prompt_file not in (None, "examples/prompts/cot.txt"):  # cot.txt's text is known
        need.add(f"the prompt file {prompt_file}")
    if g("data.validation.repeat", 1) != 1:  # aime.py: dataset.repeat(repeat)
        need.add("a validation set repeated")
    kl = g("loss_fn.reference_policy_kl_penalty", 0.01)
    if kl and g("loss_fn.use_on_policy_kl_approximation"):
        need.add("an importance-weighted on-policy KL estimate")
    # vllm_worker.py: a response stops at min(max_new_tokens, max_model_len - prompt); ours
    # (generation.response_cap context) at the total less the prompt: the same only while
    # the engine's context is the total (megatron_worker.py: mcore_generation_config's)
    prompt, response = g("data.max_input_seq_length"), g("policy.generation.max_new_tokens")
    backend = g("policy.generation.backend")
    engine = "mcore_generation_config" if backend == "megatron" else "vllm_cfg"
    total = g("policy.max_total_sequence_length")
    context = g(f"policy.generation.{engine}.max_model_len")
    if prompt - 1 + response > total and context not in (None, total):
        need.add(f"an engine context ({context} tokens)")
    if g("loss_fn.use_importance_sampling_correction"):
        kind = g("loss_fn.truncated_importance_sampling_type")
        if kind is None or g("loss_fn.truncated_importance_sampling_ratio") is None:
            need.add("an uncapped importance-sampling correction")
        elif kind != "tis" or g("loss_fn.truncated_importance_sampling_ratio_min") not in (None, 0):
            need.add(f"NeMo RL's {kind}")
    for key, phrase in (
        ("loss_fn.use_cispo", "the CISPO loss"),
        ("loss_fn.sequence_level_importance_ratios", "sequence-level importance ratios"),
        ("loss_fn.disable_ppo_ratio", "a REINFORCE loss"),
        ("grpo.async_grpo.enabled", "NeMo RL's async GRPO"),
        ("policy.draft.enabled", "speculative-decoding draft model"),
        ("policy.generation.real_quant", "ModelOpt quantisation"),
    ):
        if g(key) is True:
            need.add(phrase)
    # loss_functions.py: the ratio exp(lp - lp.detach()) = 1; ours at one optimizer step per
    # step (grpo.py asserts train_global_batch_size = prompts x generations then) likewise
    one_step = g("grpo.num_prompts_per_step") * g("grpo.num_generations_per_prompt") == g(
        "policy.train_global_batch_size"
    )
    if g("loss_fn.force_on_policy_ratio") is True and not one_step:
        need.add("a ratio forced to 1")
    if g("policy.quant_cfg") is not None or g("policy.generation.quant_cfg") is not None:
        need.add("ModelOpt quantisation")
    sampler = g("async_rl.sampler.name")
    if sampler is not None and not (
        sampler == "in_order" and g("async_rl.sampler.max_lookahead_versions", 0) == 0
    ):
        need.add("single-controller asynchronous rollouts")
    if g("policy.tokenizer.chat_template_kwargs.enable_thinking") is False:
        need.add("arguments to the chat template")
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
    if g("grpo.max_num_epochs", 1) < 1:  # grpo.py's loop trains no step
        need.add("max_num_epochs >= 1")
    if _dapo_math_steps(t) == "refused":
        need.add("an epoch over")
    return need


def _dapo_math_steps(t: dict[str, Any]) -> int | str | None:
    """dapo_math.py reads DAPO-Math-17k's 1,791,700 rows, ours each problem once. The epoch
    bound: None (another dataset, several dataloaders); "dropped" when max_num_steps steps
    of (dynamic sampling: (max_gen_batches + 1) x batch_multiplier) batches of prompts fit
    in the passes; else without dynamic sampling the passes in steps (drop_last); "refused"."""
    g = lambda k, d=None: _get(t, k, d)  # noqa: E731
    if g("data.train.dataset_name") != "DAPOMath17K" or g("data.use_multiple_dataloader"):
        return None
    steps, prompts = g("grpo.max_num_steps"), g("grpo.num_prompts_per_step")
    epochs = g("grpo.max_num_epochs", 1)
    rounds = 1
    if g("grpo.use_dynamic_sampling") is True:
        rounds = (g("grpo.dynamic_sampling_max_gen_batches") + 1) * g("grpo.batch_multiplier", 1)
    if steps * prompts * rounds <= epochs * DAPO_MATH_ROWS:
        return "dropped"
    if rounds == 1:
        return min(steps, epochs * (DAPO_MATH_ROWS // prompts))
    return "refused"


# examples/prompts/cot.txt at 7ea279ab, byte for byte (no final newline): two literal
# backslashes before boxed, `{{}}` an escaped pair of braces, `{}` the problem
MAX_NEW = "policy.generation.max_new_tokens"
COT_TEXT = (
    r"Think step-by-step to solve the following problem. Output your answer inside of "
    r"\\boxed{{}} tags.:"
    "\n{}\n\nLet's think step-by-step"
)

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


# The outcome of each file, the first word, as the importer ends (import_config.py):
#   plans              exit 0, written and planned
#   nofit=<setting>    exit 1, written, the plan does not fit and its line names <setting>
#   refused            exit 2, nothing written: keys that change what is learned
#   layout             exit 2, nothing written: layout or memory keys we lack, and the plan
#                      without them does not fit
#   model=<family>     exit 2, nothing written: a model we cannot build (or prose)
#   noval              exit 2, written but the recipe does not validate
# then the features this table's rules say the file needs (TAGS). NeMo RL's default data
# (OpenMathInstruct-2, its 5% held-out split, examples/prompts/cot.txt), its KL clamp, its
# per-prompt response cap and its epoch bound are carried; what still refuses most files
# is a layout feature (test_nemo_layout.py) or a model we cannot build. The table is checked
# against expected_features and _family (both from the raw YAML) and by running the import.
TAGS = {
    "split-seed": "a held-out split seeded apart from the run",
    "engine-context": "an engine context",
    "aime2024": "NeMo RL's AIME2024 dataset",
    "deepscaler": "NeMo RL's DeepScaler dataset",
    "uncapped-is": "an uncapped importance-sampling correction",
    "ratio-1": "a ratio forced to 1",
    "cispo": "the CISPO loss",
    "async": "NeMo RL's async GRPO",
    "sc-async": "single-controller asynchronous rollouts",
    "draft": "speculative-decoding draft model",
    "quant": "ModelOpt quantisation",
    "thinking-off": "arguments to the chat template",
    "penalty-length": "an overlong-penalty length",
    "on-policy-kl": "an importance-weighted on-policy KL estimate",
    "val-repeat": "a validation set repeated",
    "epoch-17k": "an epoch over",
}
OUTCOMES: dict[str, str] = {
    "grpo_math_1B.yaml": "nofit=generation.engine.gpu_memory_utilization",
    "grpo_math_1B_megatron.yaml": "nofit=generation.engine.gpu_memory_utilization",
    "grpo_math_1B_megatron_single_controller.yaml": "refused sc-async",
    "grpo_math_1B_trtllm.yaml": "layout",
    "grpo_math_70B_megatron.yaml": "nofit=policy.megatron.recompute_granularity",
    "grpo_math_70B_megatron_fp8.yaml": "refused uncapped-is",
    "grpo_math_8B_megatron.yaml": "nofit=generation.engine.gpu_memory_utilization",
    "grpo_math_8B_megatron_fp8.yaml": "refused uncapped-is",
    "grpo_math_8B_megatron_nixl.yaml": "plans",
    "grpo_math_qwen30ba3b_megatron.yaml": "layout",
    "recipes/llm/dapo-qwen2.5-7b-16n4g-fsdp2cp2.v2.yaml": "refused penalty-length epoch-17k",
    "recipes/llm/dapo-qwen2.5-7b.v2.yaml": "refused penalty-length epoch-17k",
    "recipes/llm/grpo-cispo-mm1-async-lag1-highoffpolicy-qwen3-30ba3b-3n8g-megatron-cispo.yaml": (
        "refused async cispo uncapped-is"
    ),
    "recipes/llm/grpo-dapomath17k-dsv3-32n4g-megatron.yaml": (
        "model=prose on-policy-kl uncapped-is"
    ),
    "recipes/llm/grpo-dapomath17k-dsv3-megatron.yaml": "model=prose on-policy-kl uncapped-is",
    "recipes/llm/grpo-dapomath17k-nanov3-30BA3B-8n4g-megatron-trtllm.yaml": (
        "model=nemotron uncapped-is"
    ),
    "recipes/llm/grpo-deepscaler-1.5b-8K.yaml": "refused aime2024 deepscaler val-repeat",
    "recipes/llm/grpo-glm5.1-64n8g-megatron.yaml": "model=glm uncapped-is",
    "recipes/llm/grpo-gptoss-20b-8n4g-megatron.yaml": "model=gpt-oss uncapped-is",
    "recipes/llm/grpo-gptoss-20b-8n8g-megatron.yaml": "model=gpt-oss uncapped-is",
    "recipes/llm/grpo-llama3.1-8b-instruct-1n8g-megatron-fp8-rollouts.v3-tq_simple.yaml": (
        "refused uncapped-is"
    ),
    "recipes/llm/grpo-llama3.1-8b-instruct-1n8g-megatron-fp8-rollouts.v3.yaml": (
        "refused uncapped-is"
    ),
    "recipes/llm/grpo-llama3.1-8b-instruct-2n4g-async-1off-single-controller-streaming2.yaml": (
        "refused sc-async uncapped-is"
    ),
    "recipes/llm/grpo-llama3.1-8b-instruct-2n8g-async-1off-single-controller-streaming2.yaml": (
        "refused sc-async uncapped-is"
    ),
    "recipes/llm/grpo-llama3.1-8b-instruct-2n8g-megatron-fp8-e2e-tq_mooncake.yaml": (
        "refused uncapped-is"
    ),
    "recipes/llm/grpo-llama3.1-8b-instruct-2n8g-megatron-fp8-e2e.yaml": "refused uncapped-is",
    "recipes/llm/grpo-llama3.1-8b-instruct-2n8g-ready-first-single-controller.yaml": (
        "refused sc-async uncapped-is"
    ),
    "recipes/llm/grpo-llama3.2-1b-instruct-1n4g-megatron.yaml": "plans",
    "recipes/llm/grpo-llama3.2-1b-instruct-1n4g-megatron_generation.yaml": "plans",
    "recipes/llm/grpo-llama3.2-1b-instruct-1n8g-megatron-temp0.8-topp0.9-topk50-tq_mooncake.yaml": (
        "plans"
    ),
    "recipes/llm/grpo-llama3.2-1b-instruct-1n8g-megatron-temp0.8-topp0.9-topk50.yaml": "plans",
    "recipes/llm/grpo-llama3.2-1b-instruct-1n8g-megatron-tq_simple.yaml": "plans",
    "recipes/llm/grpo-llama3.2-1b-instruct-1n8g-megatron.yaml": "plans",
    "recipes/llm/grpo-llama3.2-1b-instruct-1n8g-megatron_generation-tq_mooncake.yaml": "plans",
    "recipes/llm/grpo-llama3.2-1b-instruct-1n8g-megatron_generation.yaml": "plans",
    "recipes/llm/grpo-llama3.2-1b-instruct-2n8g-megatron_generation-noncolocated.yaml": "plans",
    "recipes/llm/grpo-math-qwen3-30ba3b-megatron-tp4-32k.yaml": "plans",
    "recipes/llm/grpo-moonlight-16ba3b-4n4g-megatron.yaml": "model=moonlight",
    "recipes/llm/grpo-moonlight-16ba3b-4n8g-megatron-fp8-e2e.yaml": "model=moonlight uncapped-is",
    "recipes/llm/grpo-moonlight-16ba3b-4n8g-megatron-tq_simple.yaml": "model=moonlight",
    "recipes/llm/grpo-moonlight-16ba3b-4n8g-megatron.yaml": "model=moonlight",
    "recipes/llm/grpo-nano-v2-12b-1n4g-megatron.yaml": "model=nemotron",
    "recipes/llm/grpo-nano-v2-12b-1n8g-megatron.yaml": "model=nemotron",
    "recipes/llm/grpo-nanov3-30BA3B-2n8g-megatron-lora.yaml": "model=nemotron",
    "recipes/llm/grpo-nanov3-30BA3B-2n8g-megatron-pack-cp-tq_simple.yaml": "model=nemotron",
    "recipes/llm/grpo-nanov3-30BA3B-2n8g-megatron-pack-cp.yaml": "model=nemotron",
    "recipes/llm/grpo-nanov3-30BA3B-2n8g-megatron_generation.yaml": "model=nemotron",
    "recipes/llm/grpo-nanov3-30BA3B-4n4g-megatron_async_colocated.yaml": (
        "model=nemotron async uncapped-is"
    ),
    "recipes/llm/grpo-nanov3-30BA3B-4n4g-megatron_colocated_reshard.yaml": "model=nemotron",
    "recipes/llm/grpo-nanov3-30BA3B-4n4g-megatron_sync_colocated.yaml": (
        "model=nemotron uncapped-is"
    ),
    "recipes/llm/grpo-nemotron3-super-120BA12B-16n4g-megatron-qa-bf16-300step.yaml": (
        "model=nemotron thinking-off"
    ),
    "recipes/llm/grpo-nemotron3-super-120BA12B-16n4g-megatron-qa-nvfp4-w4a16-real-300step.yaml": (
        "model=nemotron quant thinking-off"
    ),
    "recipes/llm/grpo-nemotron3-super-120BA12B-16n4g-megatron-qa-nvfp4-w4a4-real-300step.yaml": (
        "model=nemotron quant thinking-off"
    ),
    "recipes/llm/grpo-nemotron3-super-120BA12B-16n8g-megatron.yaml": "model=nemotron",
    "recipes/llm/grpo-nemotron3-super-120BA12B-8n4g-megatron.yaml": "model=nemotron",
    "recipes/llm/grpo-qwen2.5-0.5b-1n4g-megatron-trtllm-noncolocated-async.yaml": "refused async",
    "recipes/llm/grpo-qwen2.5-1.5B-4n8g-megatron-yarn-256k.yaml": "refused",
    "recipes/llm/grpo-qwen2.5-7b-instruct-4n4g-megatron.yaml": (
        "nofit=policy.megatron.tensor_model_parallel_size"
    ),
    "recipes/llm/grpo-qwen2.5-7b-instruct-4n8g-megatron.yaml": (
        "nofit=generation.engine.gpu_memory_utilization"
    ),
    "recipes/llm/grpo-qwen2.5-math-1.5b-instruct-1n4g-megatron-single-controller-sync.yaml": (
        "plans"
    ),
    "recipes/llm/grpo-qwen2.5-math-1.5b-instruct-1n8g-fsdp2tp1.v3.yaml": "plans",
    "recipes/llm/grpo-qwen2.5-math-1.5b-instruct-1n8g-megatron-single-controller-sync.yaml": (
        "plans"
    ),
    "recipes/llm/grpo-qwen3-1.7b-1n4g-megatron-eagle3.yaml": "refused draft",
    "recipes/llm/grpo-qwen3-1.7b-1n8g-megatron-eagle3-tq_mooncake.yaml": "refused draft",
    "recipes/llm/grpo-qwen3-1.7b-1n8g-megatron-eagle3.yaml": "refused draft",
    "recipes/llm/grpo-qwen3-30ba3b-10n8g-megatron-cp2-r3-async-single-controller.yaml": (
        "refused sc-async uncapped-is"
    ),
    "recipes/llm/grpo-qwen3-30ba3b-10n8g-megatron-cp2-r3-async.yaml": "refused async uncapped-is",
    "recipes/llm/grpo-qwen3-30ba3b-2n8g-megatron_fused_linear_logprobs.yaml": "layout",
    "recipes/llm/grpo-qwen3-30ba3b-4n8g-megatron-zmq-deltaweight-noncolocated.yaml": "plans",
    "recipes/llm/grpo-qwen3-30ba3b-8n4g-megatron.yaml": "layout",
    "recipes/llm/grpo-qwen3-30ba3b-8n8g-megatron-cp2-r3-tq_simple.yaml": "noval",
    "recipes/llm/grpo-qwen3-30ba3b-8n8g-megatron-cp2-r3.yaml": "noval",
    "recipes/llm/grpo-qwen3-30ba3b-8n8g-megatron.yaml": "plans",
    "recipes/llm/grpo-qwen3-8b-base-1n8g-fp8-kvcache-megatron.yaml": "refused uncapped-is",
    "recipes/llm/grpo-qwen3-8b-base-1n8g-megatron-lora.yaml": "refused",
    "recipes/llm/grpo-qwen3-8b-base-dapo-2n8g-long-megatron-qa-nvfp4-w4a16.yaml": (
        "refused quant uncapped-is"
    ),
    "recipes/llm/grpo-qwen3.5-35ba3b-2n8g-megatron-ep16tp2-fp8.yaml": "model=qwen3.5",
    "recipes/llm/grpo-qwen3.5-35ba3b-2n8g-megatron-ep16tp2cp2.yaml": "model=qwen3.5",
    "recipes/llm/grpo-qwen3.5-397ba17b-32n8g-megatron.v2.yaml": "model=qwen3.5",
    "recipes/llm/grpo-qwen3.5-9b-1n8g-megatron-fp8.yaml": "model=qwen3.5",
    "recipes/llm/grpo-qwen3.5-9b-1n8g-megatron.yaml": "model=qwen3.5",
    "recipes/llm/performance/grpo-llama3.1-8b-instruct-2n8g-async-1off.yaml": (
        "refused async uncapped-is"
    ),
    "recipes/llm/performance/grpo-llama3.1-8b-instruct-2n8g.yaml": "refused uncapped-is",
    "recipes/llm/performance/grpo-qwen3-30ba3b-4n8g.yaml": "layout",
}


def _outcome(name: str) -> tuple[str, str | None, set[str]]:
    """(kind, its argument or None, the features the file needs) from OUTCOMES."""
    first, *tags = OUTCOMES[name].split()
    kind, _, arg = first.partition("=")
    return kind, arg or None, {TAGS[t] for t in tags}


def test_every_file_has_an_outcome():
    assert sorted(OUTCOMES) == FILES


@pytest.mark.parametrize("name", FILES)
def test_the_outcome_table_matches_the_rules(name):
    t = _tree(DATA / name)
    kind, arg, need = _outcome(name)
    assert kind in ("plans", "nofit", "refused", "layout", "model", "noval")
    # an engine context names its token count: the rule's phrase starts the tag's
    assert {p.split(" (")[0] for p in expected_features(t)} == need
    assert (arg if kind == "model" else None) == _family(t)
    if kind in ("plans", "nofit", "layout", "noval"):  # nothing of this table's blocks
        assert not need


def _flat(name: str) -> dict[str, Any]:
    flat = read_source(DATA / name, {})
    resolve_interpolations(flat)
    return flat


@pytest.mark.parametrize("name", FILES)
def test_outcome_names_each_missing_feature(tmp_path, capsys, name):
    kind, arg, need = _outcome(name)
    out = tmp_path / "r.yaml"
    rc = import_main(["--from", "nemo-rl", str(DATA / name), "-o", str(out)])
    printed = capsys.readouterr()
    err = printed.err
    plan = [x for x in printed.out.splitlines() if x.startswith("dapo-plan: ")]
    if kind == "plans":
        assert rc == 0 and out.exists() and len(plan) == 1, err
        return
    if kind == "nofit":
        assert rc == 1 and out.exists() and "was written but does not fit" in err, err
        assert arg in plan[0], plan
        return
    if kind == "noval":
        assert rc == 2 and out.exists() and "was written but does not validate yet" in err
        return
    assert rc == 2 and not out.exists(), err
    if kind == "layout":
        assert "layout or memory setting(s) need what dapo-megatron lacks" in err, err
        assert "the plan does not show the run fits" in err
        return
    if kind == "model":
        # a model we cannot build stops the import first, naming it and what else it needs
        assert "nothing written: the model policy.model_name = " in err, err
        assert "was not carried" in err
    else:
        assert "change what is learned and need what dapo-megatron lacks: " in err, err
    for phrase in need:
        # what is learned: in the refusal; speed only (a draft model): in the key listing
        assert phrase in err or phrase in printed.out, phrase
    # each of this table's keys that blocks names one of those features (or the model)
    result = translate("nemo-rl", _flat(name))
    for s in result.blocking:
        if LAYOUT.match(s.key) or s.key == "policy.model_name":
            continue  # test_nemo_layout.py; a family we cannot build
        assert any(p in s.reason for p in need), (s.key, s.reason)


# ---------------------------------------------------------------------------------------
# The run-changing values carried, against the raw YAML


def expected_values(t: dict[str, Any]) -> dict[str, Any]:
    g = lambda k, d=None: _get(t, k, d)  # noqa: E731
    megatron = g("policy.megatron_cfg.enabled") is True
    ds = g("grpo.use_dynamic_sampling") is True
    loo = g("grpo.adv_estimator.use_leave_one_out_baseline")
    clamp = g("loss_fn.kl_output_clamp_value", 10.0)
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
        "data.max_prompt_length": g("data.max_input_seq_length") - 1,
        "policy.max_total_sequence_length": g("policy.max_total_sequence_length"),
        "validation.num_samples_per_prompt": g("grpo.val_num_generations_per_prompt"),
        "validation.temperature": g("policy.generation.val_temperature"),
        "policy.train_global_batch_size": g("policy.train_global_batch_size"),
        "run.seed": g("grpo.seed"),
    }  # fmt: skip
    if v["dapo.loss.kl_coef"]:  # utils.py calculate_kl: clamped to +-kl_output_clamp_value
        v["dapo.loss.kl_clamp"] = None if clamp is None else float(clamp)
    for ours, theirs in (("generation.top_k", "top_k"), ("validation.top_k", "val_top_k")):
        k = g(f"policy.generation.{theirs}")  # vllm_worker.py: null -> -1 (off)
        v[ours] = -1 if k is None else k
    if g("loss_fn.force_on_policy_ratio") is True:  # a ratio of 1: no old-logprob pass
        v["policy.old_logprob_pass"] = "auto"
    # vllm_worker.py: a response stops at min(max_new_tokens, total - prompt); where the
    # longest trained prompt + max_new_tokens exceed the total: our response_cap context
    prompt, total = g("data.max_input_seq_length"), g("policy.max_total_sequence_length")
    response = g("policy.generation.max_new_tokens")
    v["generation.max_response_length"] = response  # as is (a cap of the total is legal)
    if prompt - 1 + response > total:
        v["generation.response_cap"] = "context"
    dapo_math = _dapo_math_steps(t)
    if isinstance(dapo_math, int):  # the passes over NeMo RL's rows, in steps
        v["dapo.max_num_steps"] = dapo_math
    elif dapo_math is None and g("data.use_multiple_dataloader") is not True:
        v["dapo.max_num_epochs"] = g("grpo.max_num_epochs", 1)  # grpo.py: ignored with several
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
    if g("data.train.dataset_name") == "OpenMathInstruct-2":  # openmathinstruct2.py
        v["data.train_path"] = "hf://nvidia/OpenMathInstruct-2"  # split train_1M, ours too
        v["data.format"] = "aime"  # problem -> the user message, expected_answer -> truth
        split = g("data.train.split_validation_size", 0.05)
        if split:  # raw_dataset.py train_test_split(test_size=split, seed=data.train.seed)
            v["data.val_fraction"] = split
            v["data.val_path"] = None
    if g("data.default.prompt_file") == "examples/prompts/cot.txt":
        v["data.prompt_template"] = COT_TEXT
    if g("data.validation.dataset_name") == "DAPOMathAIME2024":
        v["data.val_path"] = "hf://BytedTsinghua-SIA/AIME-2024"
    if "validation" in t.get("data", {}) and t["data"]["validation"] is None:
        v["data.val_path"] = None  # no validation file: never our default one
    return v


@pytest.mark.parametrize("name", FILES)
def test_carried_values_match_the_yaml(name):
    t = _tree(DATA / name)
    got = {s.key: s.value for s in translate("nemo-rl", _flat(name)).settings}
    want_all = expected_values(t)
    for key, want in want_all.items():
        assert key in got, key
        assert got[key] == want and type(got[key]) is type(want), (key, got[key], want)
    if "generation.response_cap" not in want_all:  # lengths that fit: one cap, ours
        assert "generation.response_cap" not in got
    if _dapo_math_steps(t) is not None:  # an epoch of ours is not one of NeMo RL's
        assert "dapo.max_num_epochs" not in got


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
    leave-one-out GRPO estimator, Megatron's optimizer, the scheduler's weight decay, and
    the base's data, KL clamp, lengths and epoch bound, read by eye: nothing it needs is
    missing (it plans, OUTCOMES)."""
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
    assert (v["dapo.loss.kl_coef"], v["dapo.loss.kl_clamp"]) == (0.01, 10.0)  # +-10 clamp
    # dataset_name OpenMathInstruct-2, split_validation_size 0.05, seed ${grpo.seed} = 42
    assert (v["data.train_path"], v["data.format"]) == ("hf://nvidia/OpenMathInstruct-2", "aime")
    assert (v["data.val_fraction"], v["data.val_path"], v["run.seed"]) == (0.05, None, 42)
    assert v["data.prompt_template"] == COT_TEXT  # prompt_file examples/prompts/cot.txt
    # total 512, max_input_seq_length 512, max_new_tokens 512: prompts < 512 tokens,
    # 511 + 512 > 512, so responses stop at 512 less the prompt: context, cap 512 as is
    assert (v["policy.max_total_sequence_length"], v["data.max_prompt_length"]) == (512, 511)
    assert (v["generation.max_response_length"], v["generation.response_cap"]) == (512, "context")
    assert v["dapo.max_num_epochs"] == 1  # grpo.max_num_epochs 1, one dataloader
    assert expected_features(t) == set() and OUTCOMES[name] == "plans"


def test_cot_template_is_nemo_rls_prompt_file():
    """nemo_data.COT_TEMPLATE (what the importer writes) is the package's NEMO_COT_TEMPLATE
    and the file's text; NeMo RL's processors.py formats the problem into it."""
    assert COT_TEMPLATE == NEMO_COT_TEMPLATE == COT_TEXT
    message = (
        "Think step-by-step to solve the following problem. Output your answer inside of "
        + "\\\\"  # the two backslashes of the file, kept by str.format
        + "boxed{} tags.:\n1+1?\n\nLet's think step-by-step"
    )
    assert COT_TEMPLATE.format("1+1?") == message
    assert message.count("\\") == 2 and "boxed{}" in message and not message.endswith("\n")


def test_dapo_math_epochs_count_nemo_rls_rows():
    """response_datasets/dapo_math.py loads DAPO-Math-17k whole, 1,791,700 rows (each of
    ~17.9k problems about 100 times), and grpo.py's epoch is a pass over those rows; ours
    keeps one copy of each problem, so the bound is written in steps: 1 pass of 32 prompts
    a step (no dynamic sampling, drop_last) = 1791700 // 32 = 55990 steps < 1M."""
    name = "recipes/llm/grpo-qwen3-8b-base-1n8g-fp8-kvcache-megatron.yaml"
    t = _tree(DATA / name)
    assert _get(t, "data.train.dataset_name") == "DAPOMath17K"
    assert (_get(t, "grpo.max_num_epochs"), _get(t, "grpo.max_num_steps")) == (1, 1_000_000)
    assert _get(t, "grpo.num_prompts_per_step") == 32
    v = {s.key: s.value for s in translate("nemo-rl", _flat(name)).settings}
    assert "dapo.max_num_epochs" not in v and v["dapo.max_num_steps"] == 55990
    # 10000 steps x 128 = 1.28M <= 1,791,700 rows: the steps end it first, no epoch bound
    name = "recipes/llm/grpo-dapomath17k-nanov3-30BA3B-8n4g-megatron-trtllm.yaml"
    v = {s.key: s.value for s in translate("nemo-rl", _flat(name)).settings}
    assert "dapo.max_num_epochs" not in v and v["dapo.max_num_steps"] == 10000
    # dapo-qwen2.5-7b.v2.yaml: 10000 x 512 x (10 + 1) x 3 > 1 pass: refused (OUTCOMES)


def test_penalty_length_equal_to_max_new_tokens_is_carried():
    """reward_functions.py: the penalty ramps up to reward_shaping.max_response_length; equal
    to max_new_tokens it is our overlong buffer over generation.max_response_length, which
    carries max_new_tokens as is (8192, the whole length: a legal response_cap context cap)."""
    name = "recipes/llm/grpo-qwen3.5-397ba17b-32n8g-megatron.v2.yaml"
    t = _tree(DATA / name)
    assert _get(t, "grpo.reward_shaping.max_response_length") == _get(t, MAX_NEW) == 8192
    assert _get(t, "policy.max_total_sequence_length") == 8192
    result = translate("nemo-rl", _flat(name))
    blocking = {s.key for s in result.blocking}
    assert not {"grpo.reward_shaping.max_response_length", MAX_NEW} & blocking
    v = {s.key: s.value for s in result.settings}
    assert (v["generation.max_response_length"], v["generation.response_cap"]) == (8192, "context")
