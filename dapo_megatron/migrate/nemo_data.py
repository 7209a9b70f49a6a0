"""NeMo RL's data, environment, tokenizer, sampling, validation and bookkeeping keys
(data.*, env.*, policy.tokenizer.*, policy.generation sampling, grpo.val_*, checkpointing.*,
logger.*); nemo_keys.py joins them to NeMo RL's table. Claims cite NeMo RL at 7ea279ab."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from dapo_megatron.migrate.dialects import (
    ForeignKey,
    Translation,
    Untranslatable,
    as_here,
    as_int,
    custom,
    hub_model,
    mapped,
    off,
    same,
    sampling_top_k,
)
from dapo_megatron.migrate.shared_keys import MAX_RESPONSE, NEMO

# nemo_rl/data/datasets/response_datasets/__init__.py DATASET_REGISTRY -> the class's
# load_dataset call. The two DAPO sets are ours (data/hub_datasets.py KNOWN_DATASETS) with
# the same prompt: dapo_math.py DAPOMath17KDataset.format_data takes prompt[0].content as the
# user message, and processors.py math_hf_data_processor wraps it in the chat template
# (add_generation_prompt) when no prompt_file is set, as our dapo_math format does.
_OURS = {
    "DAPOMath17K": "hf://BytedTsinghua-SIA/DAPO-Math-17k",
    "DAPOMathAIME2024": "hf://BytedTsinghua-SIA/AIME-2024",
    # openmathinstruct2.py loads split train_1M: problem -> the user message,
    # expected_answer -> the ground truth, as our hub converter (data/hub_datasets.py).
    "OpenMathInstruct-2": "hf://nvidia/OpenMathInstruct-2",
}
_FORMATS = {"OpenMathInstruct-2": "aime"}
"""data.format of a dataset that is not dapo_math's layout (a bare problem and answer)."""
_THEIRS = {
    "AIME2024": "HuggingFaceH4/aime_2024",
    "AIME2025": "opencompass/AIME2025",
    "AIME2026": "MathArena/aime_2026",
    "DeepScaler": "agentica-org/DeepScaleR-Preview-Dataset",
    "GSM8K": "openai/gsm8k as NeMo RL's GSM8KDataset formats it",
    "gsm8k": "openai/gsm8k as NeMo RL's GSM8KDataset formats it",
    "NuminaMath-1.5": "AI-MO/NuminaMath-1.5",
    "OpenR1-Math-220k": "open-r1/OpenR1-Math-220k",
}
_SPLITTING = ("OpenMathInstruct-2",)
"""Datasets that carve their validation set out of the training data
(RawDataset.split_train_validation, called by openmathinstruct2.py); the others ignore
split_validation_size (response_datasets/__init__.py warns that it is swallowed)."""


def _dataset(ours: str) -> Any:
    def convert(value: Any, ctx: Mapping[str, Any]) -> Translation:
        hub = _OURS.get(value) if isinstance(value, str) else None
        if hub is None:
            known = _THEIRS.get(value, "a dataset class named there")
            raise Untranslatable(
                f"needs NeMo RL's {value} dataset ({known}), which dapo-megatron does not "
                "read (here: hf://BytedTsinghua-SIA/DAPO-Math-17k, AIME-2024, openai/gsm8k, "
                "HuggingFaceH4/MATH-500)"
            )
        settings: list[tuple[str, Any]] = [(ours, hub)]
        note = f"{value} loads {hub[5:]} (nemo_rl/data/datasets/response_datasets/)"
        if ours == "data.train_path":
            settings += [
                ("data.format", _FORMATS.get(value, "dapo_math")),
                ("data.prompt_key", None),
                ("data.answer_key", None),
                ("data.apply_chat_template", True),
            ]
            note += "; the user message is the row's problem in the chat template, as ours"
            if value == "DAPOMath17K":
                note += (
                    "; NeMo RL keeps the file's ~100 copies of each problem, ours one (the "
                    "same problems, drawn alike over a shuffled pass)"
                )
        return Translation(tuple(settings), note)

    return convert


def _no_validation(value: Any, ctx: Mapping[str, Any]) -> Translation:
    """data.validation null: NeMo RL's validation set is the training set's held-out split
    (a refused dataset, _SPLITTING) or there is none (grpo.py asserts val_period 0 then);
    never our default validation file."""
    if value is not None:
        raise Untranslatable(f"{value!r}: expected null or data.validation.dataset_name")
    return Translation((("data.val_path", None),), "no validation file")


def _split_unread(value: Any, ctx: Mapping[str, Any]) -> bool:
    return ctx.get("data.train.dataset_name") not in _SPLITTING or value in (0, 0.0, None)


def _split(value: Any, ctx: Mapping[str, Any]) -> Translation:
    """raw_dataset.py split_train_validation: train_test_split(test_size=f, seed) of the
    training rows, computed alike by our data/val_split.py (data.val_fraction)."""
    if _split_unread(value, ctx):
        return Translation((), "not read by this dataset (only OpenMathInstruct-2 splits)")
    if isinstance(value, bool) or not isinstance(value, float) or not 0 < value < 1:
        raise Untranslatable(
            f"{value!r}: needs a held-out count of rows, which dapo-megatron lacks (here: "
            "data.val_fraction, a share in (0, 1))"
        )
    return Translation(
        (("data.val_fraction", value), ("data.val_path", None)),
        f"same split: {value} of the training rows held out for validation, the rest trains",
    )


def _split_seed(value: Any, ctx: Mapping[str, Any]) -> Translation:
    if _split_unread(ctx.get("data.train.split_validation_size"), ctx):
        return Translation((), "not read by this dataset (the seed of the held-out split)")
    if value != ctx.get("grpo.seed"):
        raise Untranslatable(
            f"needs a held-out split seeded apart from the run ({value} vs grpo.seed "
            f"{ctx.get('grpo.seed')}), which dapo-megatron lacks (here: run.seed seeds both)"
        )
    return Translation((), "the split's seed is run.seed (grpo.seed), as there")


# examples/prompts/cot.txt at the commit the tests cite, read whole (interfaces.py
# TaskDataSpec reads the file without stripping it): two literal backslashes, {{}} an
# escaped pair of braces, no final newline. data/prompt_template.py NEMO_COT_TEMPLATE holds
# the same text (tests/unit/migrate/test_nemo_files.py checks they agree).
COT_TEMPLATE = (
    "Think step-by-step to solve the following problem. Output your answer inside of "
    "\\\\boxed{{}} tags.:\n{}\n\nLet's think step-by-step"
)
_PROMPT_FILES = {"examples/prompts/cot.txt": COT_TEMPLATE}


def _prompt_file(value: Any, ctx: Mapping[str, Any]) -> Translation:
    if value is None:
        return Translation((), "same as here: the dataset's problem as the user message")
    template = _PROMPT_FILES.get(value) if isinstance(value, str) else None
    if template is None:
        raise Untranslatable(
            f"needs the prompt file {value}, whose text this importer does not know (here: "
            "data.prompt_template, set it to the file's text)"
        )
    return Translation(
        (("data.prompt_template", template),),
        f"the text of NeMo RL's {value}: processors.py math_hf_data_processor formats the "
        "problem into it before the chat template, as ours",
    )


def _val_prompts(value: Any, ctx: Mapping[str, Any]) -> Any:
    """grpo.py validate(): `max_batches = max_val_samples // val_batch_size` batches of
    val_batch_size prompts (a smaller validation set ends sooner)."""
    if value is None:
        return None
    total = as_int(value)
    batch = ctx.get("grpo.val_batch_size")
    if batch is None:
        return total
    return total // as_int(batch) * as_int(batch)


def _verifier(value: Any, ctx: Mapping[str, Any]) -> Translation:
    """math_environment.py HFVerifyWorker.verify: dapo_math_verify is verl's math_dapo
    (dapo_math_verifier.py: the `Answer:` line of the last 300 characters, 1 / 0);
    hf_math_verify compares with math-verify against `\\boxed{ground truth}`, 1 / 0."""
    if value not in ("dapo_math_verify", "hf_math_verify"):
        raise Untranslatable(f"needs the {value} math verifier, which dapo-megatron lacks")
    return Translation(
        (("reward.verifier", "math"),),
        "a 1 / 0 math reward, as ours: the `Answer:` line or the last \\boxed{}, compared "
        "as strings, integers, then with math-verify",
    )


_RELATIVE = re.compile(r"^\$\{(\.+)([A-Za-z_][\w.]*)\}$")


def resolve_relative(flat: dict[str, Any]) -> None:
    """OmegaConf's relative references, `${.temperature}` (a sibling) and `${..x}` (a
    parent's sibling), replaced by the value they name when it is a plain value: NeMo RL's
    grpo_math_1B.yaml writes val_temperature: ${.temperature}."""
    for key, value in list(flat.items()):
        if isinstance(value, str) and (m := _RELATIVE.match(value)):
            parts = key.split(".")[: -len(m.group(1))]
            target = ".".join([*parts, m.group(2)])
            found = flat.get(target)
            if target in flat and not (isinstance(found, str) and "${" in found):
                flat[key] = found


_TAG = "policy.generation"
NEMO_DATA_KEYS: tuple[ForeignKey, ...] = (
    hub_model("policy.model_name", NEMO),
    same(NEMO, "policy.tokenizer.name", "policy.tokenizer_name_or_path"),
    as_here(
        NEMO,
        "policy.tokenizer.use_fastokens",
        "nothing: any value gives the same run",
        lambda v, ctx: isinstance(v, bool),
        "a faster implementation of the same tokenizer: the same tokens",
    ),
    as_here(
        NEMO,
        "policy.tokenizer.chat_template_kwargs",
        "arguments to the chat template",
        lambda v, ctx: v is None or v == {},
        "the template's defaults",
    ),
    as_here(
        NEMO,
        "policy.tokenizer.chat_template_kwargs.enable_thinking",
        "arguments to the chat template (enable_thinking: false)",
        off(True),
        "the template's defaults (Qwen3: thinking on)",
    ),
    custom(
        NEMO,
        "data.train.dataset_name",
        "data.train_path (+ data.format, prompt/answer keys, chat template)",
        "DAPOMath17K: hf://BytedTsinghua-SIA/DAPO-Math-17k; other datasets refused",
        _dataset("data.train_path"),
    ),
    custom(
        NEMO,
        "data.validation.dataset_name",
        "data.val_path",
        "DAPOMathAIME2024: hf://BytedTsinghua-SIA/AIME-2024; other datasets refused",
        _dataset("data.val_path"),
    ),
    custom(
        NEMO,
        "data.validation",
        "data.val_path",
        "null: no validation file (NeMo RL then validates on the training set's held-out "
        "split, refused with it, or not at all)",
        _no_validation,
    ),
    custom(
        NEMO,
        "data.train.split_validation_size",
        "data.val_fraction",
        "same split: that share of the training data held out as the validation set "
        "(HF datasets' train_test_split, as ours); only OpenMathInstruct-2 reads it",
        _split,
    ),
    custom(
        NEMO,
        "data.train.seed",
        "(run.seed)",
        "the held-out split's seed: ours is run.seed, so it must equal grpo.seed",
        _split_seed,
    ),
    custom(
        NEMO,
        "data.default.prompt_file",
        "data.prompt_template",
        "examples/prompts/cot.txt: its text (str.format of the problem); null: none; other "
        "files refused (their text is not known here)",
        _prompt_file,
    ),
    as_here(
        NEMO,
        "data.default.system_prompt_file",
        "a system prompt",
        lambda v, ctx: v is None,
        "no system message",
    ),
    as_here(
        NEMO,
        "data.default.processor",
        "a NeMo RL data processor other than math_hf_data_processor",
        off("math_hf_data_processor"),
        "the problem in the chat template with the generation prompt, the answer kept for "
        "the verifier (processors.py math_hf_data_processor)",
    ),
    as_here(
        NEMO, "data.default.env_name", "a NeMo RL environment other than math", off("math"), "math"
    ),
    as_here(
        NEMO,
        "data.use_multiple_dataloader",
        "several training dataloaders",
        off(False),
        "one training set",
    ),
    same(NEMO, "data.shuffle", "data.shuffle"),
    custom(NEMO, "env.math.math_verify_impl", "reward.verifier", "math (1 / 0)", _verifier),
    same(
        NEMO,
        "env.math.num_workers",
        "reward.num_workers",
        "same meaning: processes of the verification pool",
    ),
    same(NEMO, f"{_TAG}.temperature", "generation.temperature"),
    same(NEMO, f"{_TAG}.top_p", "generation.top_p"),
    mapped(NEMO, f"{_TAG}.top_k", "generation.top_k", "null: -1 (off)", sampling_top_k),
    same(
        NEMO,
        f"{_TAG}.max_new_tokens",
        MAX_RESPONSE,
        "same meaning: the engine's response cap (with the context's own per-prompt cap, "
        "generation.response_cap context, where prompt + response exceed the total length)",
    ),
    same(NEMO, f"{_TAG}.stop_token_ids", "generation.stop_token_ids"),
    as_here(NEMO, f"{_TAG}.stop_strings", "stop strings", lambda v, ctx: v is None, "none"),
    # grpo.py setup asserts val_temperature/top_p/top_k equal the training ones outside
    # NeMo-Gym, and validate() samples with the engine's configured parameters
    same(NEMO, f"{_TAG}.val_temperature", "validation.temperature"),
    same(NEMO, f"{_TAG}.val_top_p", "validation.top_p"),
    mapped(
        NEMO,
        f"{_TAG}.val_top_k",
        "validation.top_k",
        "null: -1 (off); same meaning",
        sampling_top_k,
    ),
    same(NEMO, "grpo.val_num_generations_per_prompt", "validation.num_samples_per_prompt"),
    mapped(
        NEMO,
        "grpo.max_val_samples",
        "validation.max_prompts",
        "{out}: NeMo RL validates max_val_samples // val_batch_size whole batches",
        _val_prompts,
    ),
    same(NEMO, "grpo.val_period", "validation.val_period"),
    same(NEMO, "grpo.val_at_start", "validation.val_at_start"),
    same(
        NEMO,
        "checkpointing.checkpoint_dir",
        "checkpointing.checkpoint_dir",
        "same meaning (null here: `<run.output_dir>/checkpoints`)",
    ),
    same(NEMO, "checkpointing.enabled", "checkpointing.enabled"),
    same(NEMO, "checkpointing.save_period", "checkpointing.save_period"),
    same(NEMO, "logger.log_dir", "logger.log_dir"),
    same(NEMO, "logger.wandb_enabled", "logger.wandb_enabled"),
    same(NEMO, "logger.tensorboard_enabled", "logger.tensorboard_enabled"),
    same(NEMO, "logger.wandb.project", "logger.wandb_project"),
)
"""NeMo RL's data, sampling, validation and bookkeeping keys."""
