"""verl's data, reward and bookkeeping keys, with their converters; verl_keys.py joins them
into VERL_KEYS.

Dataset files: verl-recipe's dapo/prepare_dapo_data.sh downloads DAPO-Math-17k and AIME 2024
from the hub to ${VERL_HOME:-${HOME}/verl}/data/dapo-math-17k.parquet and aime-2024.parquet
(the hub files of those names, unchanged); verl's examples/data_preprocess/gsm8k.py writes
openai/gsm8k (config main) to <dir>/train.parquet and test.parquet. Those files are our hub
datasets (dapo_megatron/data/hub_datasets.py), recognised by their file name whatever the
directory, even one the shell could not resolve. examples/data_preprocess/math_dataset.py
writes DigitalLearningGmbH/MATH-lighteval (the whole MATH set), which is not MATH-500.
"""

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
    off,
    same,
)
from dapo_megatron.migrate.shared_keys import GSM8K_TEMPLATE, VERL

_UNRESOLVED = re.compile(r"\$\{|\$\(|\$[A-Za-z_]")

DAPO_FILES: dict[str, tuple[str, str]] = {
    "dapo-math-17k.parquet": ("hf://BytedTsinghua-SIA/DAPO-Math-17k", "dapo_math"),
    "aime-2024.parquet": ("hf://BytedTsinghua-SIA/AIME-2024", "aime"),
}
"""verl-recipe dapo/prepare_dapo_data.sh's file names -> (our hub name, data.format)."""


def unresolved(value: Any) -> bool:
    """A string holding a shell expansion the importer could not do (${HOME} unset)."""
    return isinstance(value, str) and _UNRESOLVED.search(value) is not None


def _one_file(value: Any) -> str:
    if isinstance(value, list):
        if len(value) != 1:
            raise Untranslatable(
                f"needs {len(value)} training files in one set, which dapo-megatron lacks "
                "(here: one file or hub dataset)"
            )
        value = value[0]
    if not isinstance(value, str):
        raise Untranslatable(f"{value!r}: expected a path")
    return value


def identify(path: str) -> tuple[str, str, str] | None:
    """(hub name, data.format, note) of a file the peer's own scripts write, or None."""
    parts = path.replace("\\", "/").rstrip("/").split("/")
    name = parts[-1]
    if name in DAPO_FILES:
        hub, fmt = DAPO_FILES[name]
        return (
            hub,
            fmt,
            f"{name} is the hub file verl-recipe dapo/prepare_dapo_data.sh downloads: {hub}",
        )
    if len(parts) >= 2 and parts[-2] == "gsm8k" and name in ("train.parquet", "test.parquet"):
        split = name.removesuffix(".parquet")
        return (
            f"hf://openai/gsm8k:{split}",
            "gsm8k",
            f"gsm8k/{name} is openai/gsm8k (main) split {split}, written by verl's "
            "examples/data_preprocess/gsm8k.py",
        )
    return None


def _data_file(ours: str) -> Any:
    def convert(value: Any, ctx: Mapping[str, Any]) -> Translation:
        path = _one_file(value)
        found = identify(path)
        if found is not None:
            hub, fmt, note = found
            settings: list[tuple[str, Any]] = [(ours, hub)]
            train = identify(_first(ctx.get("data.train_files")))
            if ours == "data.train_path" or train is None:
                settings.append(("data.format", fmt))
                if fmt == "gsm8k":
                    # gsm8k.py appends its instruction to every question, and verl scores
                    # GSM8K strictly (reward_score/gsm8k.py): our gsm8k_verl verifier.
                    settings += [
                        ("data.prompt_template", GSM8K_TEMPLATE),
                        ("reward.verifier", "gsm8k_verl"),
                    ]
                    note += (
                        "; each question + ' ' + its instruction (data.prompt_template), "
                        "scored by verl's strict `#### N` reward (reward.verifier gsm8k_verl)"
                    )
            return Translation(tuple(settings), "recognised by its file name: " + note)
        if unresolved(path):
            raise Untranslatable(
                f"{path}: a dataset file we cannot identify, in a path the shell cannot "
                "resolve (pass --shell-var NAME=VALUE)"
            )
        if path.rstrip("/").endswith(("math/train.parquet", "math/test.parquet")):
            raise Untranslatable(
                f"{path}: a dataset file we cannot identify as ours: verl's "
                "examples/data_preprocess/math_dataset.py writes MATH-lighteval (the whole "
                "MATH set), not MATH-500"
            )
        return Translation(((ours, path),), "a local file: the same file")

    return convert


def _first(value: Any) -> str:
    if isinstance(value, list) and value:
        value = value[0]
    return value if isinstance(value, str) else ""


def _model(value: Any, ctx: Mapping[str, Any]) -> Translation:
    if unresolved(value):
        raise Untranslatable(
            f"{value}: a model path the shell cannot resolve (an unset variable); pass "
            "--shell-var NAME=VALUE, our default model is never put in its place"
        )
    return _HUB.convert(value, ctx)


_HUB = hub_model("actor_rollout_ref.model.path", VERL)


def _verl_save_freq(value: Any, ctx: Mapping[str, Any]) -> Translation:
    n = as_int(value)
    if n <= 0:
        return Translation((("checkpointing.enabled", False),), f"{n}: verl never saves")
    return Translation(
        (("checkpointing.enabled", True), ("checkpointing.save_period", n)), "same meaning"
    )


def _verl_test_freq(value: Any, ctx: Mapping[str, Any]) -> Translation:
    n = as_int(value)
    if n <= 0:
        return Translation(
            (("validation.val_period", 0),),
            f"{n}: verl never validates during training (ray_trainer.py tests only when "
            "test_freq > 0): 0",
        )
    return Translation((("validation.val_period", n),), f"same meaning: every {n} steps")


def _verl_epochs(value: Any, ctx: Mapping[str, Any]) -> Translation:
    """verl's run ends at whichever comes first: its step cap (`is_last_step = global_steps
    >= total_training_steps`; the cap is trainer.total_training_steps when set, else
    len(train_dataloader) x total_epochs: ray_trainer.py _create_dataloader) or the end of
    the data (fit's `for epoch in range(current_epoch, total_epochs)` over the drop_last
    train dataloader; verl-recipe dapo_ray_trainer.py fit the same, which also drops a step's
    partial batch when the last epoch runs out). Ours: dapo.max_num_epochs with
    dapo.max_num_steps (data/sampler.py epochs_exhausted)."""
    n = as_int(value)
    if n < 1:
        raise Untranslatable(f"{n}: verl's epoch loop would train no step")
    steps = ctx.get("trainer.total_training_steps")
    if isinstance(steps, int) and steps > 0:
        bound = f"with total_training_steps {steps} (dapo.max_num_steps), whichever ends first"
    else:
        # Without it verl's cap is len(dataloader) x total_epochs, which the data's end
        # reaches first or at the same step (a step uses at least one dataloader batch).
        bound = (
            "which end verl's run before its step cap len(dataloader) x total_epochs: keep "
            "dapo.max_num_steps at least that (the dataloader's length is unknown here)"
        )
    return Translation(
        (("dapo.max_num_epochs", n),),
        f"{n} pass(es) over the data, {bound}; verl drops each epoch's last partial "
        "dataloader batch (drop_last), ours only the last pass's tail shorter than a step "
        "(our passes run into each other)",
    )


def _any_bool(value: Any, ctx: Mapping[str, Any]) -> bool:
    return isinstance(value, bool)


def _max_resp_len(value: Any, ctx: Mapping[str, Any]) -> bool:
    # verl's DAPORewardManager (workers/reward_manager/dapo.py __call__): expected_len =
    # max_resp_len - overlong_buffer_cfg.len, penalty ramps to -penalty_factor at
    # max_resp_len; ours ramps to generation.max_response_length. Same at the same length.
    return value is None or value == ctx.get("data.max_response_length", 512)


def _reward_manager(value: Any, ctx: Mapping[str, Any]) -> bool:
    # dapo: math_dapo compute_score gives +1 / -1 and the overlong penalty: ours scales the
    # verifier's 0/1 to -1/+1 (dapo.reward_scaling) and adds the same penalty. naive: 0/1
    # (an affine map of ours; the group-normalised advantage and the filter are the same).
    return value in ("dapo", "naive") or (
        isinstance(value, dict) and value.get("name") in ("dapo", "naive")
    )


def _verl_filter_overlong(value: Any, ctx: Mapping[str, Any]) -> Translation:
    if value is True:
        return Translation(
            (),
            "same as here: a prompt over data.max_prompt_length is dropped (verl: "
            "rl_dataset.py maybe_filter_out_long_prompts; ours skips and counts it)",
        )
    if value is False:
        return Translation(
            (),
            "false: verl keeps an over-long prompt and its agent loop pads prompts to "
            "rollout.prompt_length without truncating (experimental/agent_loop/agent_loop.py), "
            "so a batch holding one fails there; on the data of a run that completes (none "
            "over-long) ours does the same",
        )
    raise Untranslatable(f"{value!r}: expected true or false")


def _verl_reward_manager(value: Any, ctx: Mapping[str, Any]) -> Translation:
    if not _reward_manager(value, ctx):
        raise Untranslatable(f"needs the {value} reward manager, which dapo-megatron lacks")
    return Translation(
        (("dapo.overlong_filtering", False),),
        f"{value}: the verifier's score (dapo: +1/-1, as our reward scaling; naive: 0/1, the "
        "same group-normalised advantage) plus the overlong penalty when enabled; truncated "
        "responses stay in the loss (verl has no overlong filtering): overlong_filtering false",
    )


def _verl_adv(value: Any, ctx: Mapping[str, Any]) -> Translation:
    # verl's grpo (trainer/ppo/core_algos.py compute_grpo_outcome_advantage): (r - group
    # mean) / (group std + eps), the mean over the whole group (no leave-one-out)
    if value != "grpo":
        raise Untranslatable(f"needs the {value} advantage estimator, which dapo-megatron lacks")
    return Translation(
        (("dapo.advantage.leave_one_out", False),),
        "grpo: the group mean as baseline, as ours",
    )


def _kl_in_reward_coef(value: Any, ctx: Mapping[str, Any]) -> bool:
    return ctx.get("algorithm.use_kl_in_reward") is not True


def _max_positions(value: Any, ctx: Mapping[str, Any]) -> bool:
    total = as_int(ctx.get("data.max_prompt_length", 512)) + as_int(
        ctx.get("data.max_response_length", 512)
    )
    return isinstance(value, int) and value >= total


VERL_DATA_KEYS: tuple[ForeignKey, ...] = (
    custom(
        VERL,
        "actor_rollout_ref.model.path",
        "policy.model_name_or_path (+ policy.model_arch)",
        "same meaning (a hub id is downloaded by the first dapo-train); a path the shell "
        "cannot resolve is refused, never replaced by our default",
        _model,
    ),
    same(VERL, "actor_rollout_ref.model.tokenizer_path", "policy.tokenizer_name_or_path"),
    same(VERL, "data.tokenizer", "policy.tokenizer_name_or_path"),
    custom(
        VERL,
        "data.train_files",
        "data.train_path (+ data.format)",
        "one file: the same file; prepare_dapo_data.sh's and gsm8k.py's files are our hub "
        "datasets (by file name)",
        _data_file("data.train_path"),
    ),
    custom(
        VERL,
        "data.val_files",
        "data.val_path",
        "one file: the same file; prepare_dapo_data.sh's and gsm8k.py's files are our hub "
        "datasets (by file name)",
        _data_file("data.val_path"),
    ),
    same(VERL, "data.prompt_key", "data.prompt_key"),
    same(VERL, "data.shuffle", "data.shuffle"),
    custom(
        VERL,
        "data.filter_overlong_prompts",
        "(none: over-long prompts are skipped)",
        "true: prompts over data.max_prompt_length dropped, as here; false: verl's run fails "
        "on one, so a run that completes had none",
        _verl_filter_overlong,
    ),
    as_here(
        VERL,
        "data.return_raw_chat",
        "a chat template setting",
        _any_bool,
        "the tokenizer's chat template wraps each prompt",
    ),
    as_here(VERL, "data.trust_remote_code", "remote model code", _any_bool, "our own model code"),
    as_here(
        VERL,
        "actor_rollout_ref.model.trust_remote_code",
        "remote model code",
        _any_bool,
        "our own model code",
    ),
    custom(
        VERL,
        "trainer.save_freq",
        "checkpointing.save_period (or enabled)",
        "<= 0: never save (verl ray_trainer.py saves only when save_freq > 0): "
        "checkpointing.enabled false",
        _verl_save_freq,
    ),
    custom(
        VERL,
        "trainer.test_freq",
        "validation.val_period",
        "<= 0: never validate during training (0 here); else the same period",
        _verl_test_freq,
    ),
    custom(
        VERL,
        "trainer.total_epochs",
        "dapo.max_num_epochs",
        "the same bound in passes over the data, beside total_training_steps (whichever "
        "ends first); verl's drop_last drops each epoch's partial batch, ours the last's",
        _verl_epochs,
    ),
    as_here(VERL, "trainer.critic_warmup", "a critic", off(0), "no critic"),
    as_here(VERL, "trainer.device", "NPU devices", off("cuda"), "CUDA GPUs"),
    custom(
        VERL,
        "algorithm.adv_estimator",
        "dapo.advantage.leave_one_out",
        "grpo: ours (the group mean as baseline, no leave-one-out); others refused",
        _verl_adv,
    ),
    same(VERL, "algorithm.norm_adv_by_std_in_grpo", "dapo.advantage.norm_by_std"),
    as_here(
        VERL,
        "algorithm.use_kl_in_reward",
        "a KL penalty in the reward",
        off(False),
        "no KL term in the reward",
    ),
    as_here(
        VERL,
        "algorithm.kl_ctrl.kl_coef",
        "a KL penalty in the reward",
        _kl_in_reward_coef,
        "unused while use_kl_in_reward is false",
    ),
    custom(
        VERL,
        "reward_model.reward_manager",
        "(none: the reward pipeline) + dapo.overlong_filtering",
        "dapo (+1/-1 and the overlong penalty) and naive (0/1): as ours; no overlong filtering",
        _verl_reward_manager,
    ),
    custom(
        VERL,
        "reward.reward_manager.name",
        "(none: the reward pipeline) + dapo.overlong_filtering",
        "dapo (+1/-1 and the overlong penalty) and naive (0/1): as ours; no overlong filtering",
        _verl_reward_manager,
    ),
    *(
        as_here(
            VERL,
            f"{root}.reward_kwargs.max_resp_len",
            "an overlong-penalty length other than the response cap",
            _max_resp_len,
            "the penalty ramps to its end at generation.max_response_length",
        )
        for root in ("reward_model", "reward")
    ),
    as_here(
        VERL,
        "actor_rollout_ref.model.override_config.max_position_embeddings",
        "a context shorter than prompt + response",
        _max_positions,
        "positions up to prompt + response (rotary embeddings without scaling do not read it)",
    ),
    as_here(
        VERL,
        "actor_rollout_ref.model.override_config.model_config.max_position_embeddings",
        "a context shorter than prompt + response",
        _max_positions,
        "positions up to prompt + response (rotary embeddings without scaling do not read it)",
    ),
    *(
        as_here(
            VERL,
            f"actor_rollout_ref.model.override_config.{k}",
            "dropout",
            off(0.0, 0),
            "no dropout",
        )
        for k in ("attention_dropout", "embd_pdrop", "resid_pdrop")
    ),
    as_here(VERL, "actor_rollout_ref.model.lora.rank", "LoRA", off(0), "full fine-tuning"),
    as_here(VERL, "actor_rollout_ref.model.lora_rank", "LoRA", off(0), "full fine-tuning"),
    as_here(
        VERL,
        "actor_rollout_ref.model.mtp.enable",
        "multi-token prediction (MTP) layers",
        off(False),
        "no MTP",
    ),
    as_here(
        VERL,
        f"{'actor_rollout_ref.actor.megatron.override_transformer_config'}.fp8",
        "FP8 training",
        off(None),
        "bf16/fp16 training",
    ),
    as_here(
        VERL,
        "actor_rollout_ref.actor.optim.override_optimizer_config.fp8_recipe",
        "FP8 training",
        off(None),
        "bf16/fp16 training",
    ),
    as_here(
        VERL,
        "actor_rollout_ref.actor.megatron.override_transformer_config.fp8_recipe",
        "FP8 training",
        off(None),
        "bf16/fp16 training",
    ),
    *(
        as_here(
            VERL,
            f"actor_rollout_ref.actor.optim.override_optimizer_config.{k}",
            "CPU offload (parameters, gradients or optimizer states kept in host memory)",
            lambda v, ctx: False,
            "read with optimizer_cpu_offload",
        )
        for k in ("optimizer_offload_fraction", "overlap_cpu_optimizer_d2h_h2d")
    ),
    as_here(
        VERL,
        "algorithm.rollout_correction.rollout_is",
        "verl's rollout correction (importance weights with rejection sampling)",
        off(None),
        "no rollout correction",
    ),
    as_here(
        VERL,
        "algorithm.rollout_correction.rollout_rs",
        "verl's rollout correction (importance weights with rejection sampling)",
        off(None),
        "no rollout correction",
    ),
)
"""verl's data, reward and bookkeeping keys."""


def data_inactive(flat: Mapping[str, Any]) -> dict[str, str]:
    """Keys of switched-off features: LoRA's and MTP's settings without them, rollout
    correction's thresholds without it, the trtllm engine's kwargs with another engine."""
    out: dict[str, str] = {}
    lora = flat.get("actor_rollout_ref.model.lora.rank", 0)
    mtp = flat.get("actor_rollout_ref.model.mtp.enable", False)
    engine = flat.get("actor_rollout_ref.rollout.name")
    rc = [flat.get(f"algorithm.rollout_correction.{k}") for k in ("rollout_is", "rollout_rs")]
    for key in flat:
        if (
            key.startswith("actor_rollout_ref.model.lora.")
            and key != "actor_rollout_ref.model.lora.rank"
        ):
            out[key] = "read with lora.rank" if lora else "not live: lora.rank is 0"
        elif (
            key.startswith("actor_rollout_ref.model.mtp.")
            and key != "actor_rollout_ref.model.mtp.enable"
        ):
            out[key] = "read with mtp.enable" if mtp else "not live: mtp.enable is false"
        elif key.startswith("algorithm.rollout_correction.") and not key.endswith(
            ("rollout_is", "rollout_rs")
        ):
            out[key] = (
                "read with rollout_is / rollout_rs"
                if any(rc)
                else "not live: rollout_is and rollout_rs are null"
            )
        elif key.startswith("actor_rollout_ref.rollout.engine_kwargs."):
            out[key] = (
                f"an engine's own options (rollout.name is {engine}: refused there when not vllm)"
            )
        elif (
            key.startswith("actor_rollout_ref.actor.optim.override_optimizer_config.")
            and key.endswith(("optimizer_offload_fraction", "overlap_cpu_optimizer_d2h_h2d"))
            and flat.get(
                "actor_rollout_ref.actor.optim.override_optimizer_config.optimizer_cpu_offload"
            )
            is not True
        ):
            out[key] = "not live: optimizer_cpu_offload is false"
        elif key == "data.truncation":
            out[key] = (
                "not live: verl's rl_dataset.py stores it and nothing of the RL data path at "
                "this commit applies it (over-long prompts: data.filter_overlong_prompts)"
            )
        elif key.startswith("actor_rollout_ref.rollout.prometheus."):
            out[key] = "not live here: engine metrics export"
    return out


VERL_READS_UNRESOLVED = frozenset(
    {"actor_rollout_ref.model.path", "data.train_files", "data.val_files"}
)
"""Keys whose converter reads a value holding an unresolved shell variable: the data files
of prepare_dapo_data.sh / gsm8k.py are recognised by their file name whatever the directory,
and a model path is refused naming the variable (never replaced by our default)."""
