"""NeMo RL's layout keys in the table: the Megatron and DTensor parallel layout, kernels and
memory settings, micro-batch and token budgets, the cluster and the generation engine
(nemo_engine.py); nemo_keys.py joins them to the rest of NeMo RL's keys.

What each key does in NeMo RL was read at the commit of tests/data/foreign/nemo-rl/SOURCES.md:
examples/configs/grpo_math_1B.yaml (the base of every recipe),
nemo_rl/models/megatron/setup.py (how megatron_cfg becomes Megatron-Core's TransformerConfig,
DDP and optimizer configs), nemo_rl/models/policy/lm_policy.py and
nemo_rl/distributed/batched_data_dict.py (micro-batches: sequence packing, dynamic
batching), nemo_rl/models/automodel/setup.py (the DTensor backend). Ours: configs/
dapo_base.yaml, megatron/model.py, megatron/optimizer.py, megatron/packed_batches.py.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

from dapo_megatron.config.model_arch import PRESETS, preset_for_model
from dapo_megatron.migrate.dialects import (
    IMPACT_ALGORITHM,
    IMPACT_HARMLESS,
    ForeignKey,
    Translation,
    Untranslatable,
    as_here,
    as_int,
    choice,
    custom,
    off,
    same,
)
from dapo_megatron.migrate.nemo_engine import NEMO_ENGINE_KEYS, any_value, engine_inactive
from dapo_megatron.migrate.nemo_megatron import (
    LORA,
    NEMO_MEGATRON_KEYS,
    OFFLOAD,
    RECOMPUTE,
    feature_part,
)
from dapo_megatron.migrate.shared_keys import NEMO

M = "policy.megatron_cfg"
D = "policy.dtensor_cfg"
PACK = "policy.sequence_packing"
DYN = "policy.dynamic_batching"


def _dtensor_recompute(value: Any, ctx: Mapping[str, Any]) -> Translation:
    # automodel/setup.py: each transformer block under a checkpoint wrapper, i.e. every
    # layer keeps only its input and recomputes the rest: our full recompute.
    if not isinstance(value, bool):
        raise Untranslatable(f"{value!r}: expected true or false")
    return Translation(
        ((RECOMPUTE, "full" if value else "none"),),
        ("full: every layer recomputed in backward, as DTensor's per-block checkpointing; "
         if value else "false: no activation recompute; ")
        + "our policy is Megatron-Core, not DTensor/FSDP2",
    )  # fmt: skip


def _read_with(key: str, owner: str) -> ForeignKey:
    def convert(value: Any, ctx: Mapping[str, Any]) -> Translation:
        return Translation((), f"read with {owner}")

    return custom(NEMO, key, f"(read with {owner})", f"read with `{owner}`", convert)


# ---------------------------------------------------------------------------------------
# Micro-batches. lm_policy.py: with sequence packing, each DP rank's share of a global batch
# is packed (batched_data_dict.py shard_by_batch_size: bins of at most train_mb_tokens
# tokens, each sequence padded to make_sequence_length_divisible_by) and a bin is one
# micro-batch; the logprob pass packs by logprob_mb_tokens. The budget counts a micro-batch's
# tokens before the CP split (the worker splits each packed row over CP). Ours
# (policy.max_tokens_per_microbatch, megatron/packed_batches.py): whole sequences packed up
# to the budget on one DP rank, padded to the layout's multiple, then split over CP; one
# budget for the train and logprob passes. Dynamic batching (no packing) makes micro-batches
# of rows whose padded tokens stay within train_mb_tokens: the same bound per micro-batch.


def _budget(value: Any) -> int:
    n = as_int(value)
    if n <= 0:
        raise Untranslatable(f"{n}: a token budget must be positive")
    return n


def _packing(value: Any, ctx: Mapping[str, Any]) -> Translation:
    if value is True:
        return Translation((), "on: micro-batches packed up to train_mb_tokens (carried there)")
    if ctx.get(f"{DYN}.enabled") is True:
        return Translation((), "off: dynamic batching decides the micro-batches")
    return Translation(
        (("policy.max_tokens_per_microbatch", None),),
        "off: padded micro-batches of train_micro_batch_size / logprob_batch_size samples",
    )


def _train_tokens(switch: str, how: str) -> Callable[[Any, Mapping[str, Any]], Translation]:
    def convert(value: Any, ctx: Mapping[str, Any]) -> Translation:
        if ctx.get(switch) is not True:
            return Translation((), f"not read: {switch} is not true")
        tokens = _budget(value)
        return Translation(
            (("policy.max_tokens_per_microbatch", tokens),),
            f"{tokens} tokens per micro-batch on a DP rank, before the CP split: {how}",
        )

    return convert


def _logprob_tokens(value: Any, ctx: Mapping[str, Any]) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


# ---------------------------------------------------------------------------------------
# Model config overrides (automodel/setup.py and the Megatron bridge apply them to the HF
# config before building the model).


def _max_positions(value: Any, ctx: Mapping[str, Any]) -> bool:
    """RoPE positions are computed for any length (no rope scaling reads this value for the
    families we build): an override between the run's length and the checkpoint's own limit
    changes nothing; a larger one would need the engine to accept a longer context than the
    checkpoint declares, which we do not override."""
    name = ctx.get("policy.model_name")
    preset = preset_for_model(name.rsplit("/", 1)[-1]) if isinstance(name, str) else None
    total = ctx.get("policy.max_total_sequence_length")
    if preset is None or not isinstance(value, int) or not isinstance(total, int):
        return False
    return total <= value <= PRESETS[preset].max_position_embeddings


_ROPE = "a RoPE scaling override (hf_config_overrides.rope_scaling, e.g. YaRN)"

_DTENSOR_NOTE = (
    "NeMo RL's DTensor (FSDP2) backend; ours is Megatron-Core with the same split of the "
    "math, and a distributed optimizer instead of FSDP2's sharding of every state"
)

_DTENSOR_KEYS: tuple[ForeignKey, ...] = (
    as_here(
        NEMO,
        f"{D}.enabled",
        "a DTensor (FSDP2) policy",
        off(True),
        "the policy trains on Megatron-Core with DTensor's TP, CP, SP and checkpointing "
        "(policy.megatron.*): the same math; FSDP2 also shards parameters and gradients, "
        "ours only the optimizer states: memory differs, and dapo-plan counts ours",
    ),
    same(
        NEMO,
        f"{D}.tensor_parallel_size",
        "policy.megatron.tensor_model_parallel_size",
        "same split: heads and MLP columns over {v} ranks; " + _DTENSOR_NOTE,
    ),
    same(
        NEMO,
        f"{D}.context_parallel_size",
        "policy.megatron.context_parallel_size",
        "same split: each sequence over {v} ranks (ring attention); " + _DTENSOR_NOTE,
    ),
    same(
        NEMO,
        f"{D}.sequence_parallel",
        "policy.megatron.sequence_parallel",
        "same split of norms' activations over the TP ranks; " + _DTENSOR_NOTE,
    ),
    custom(
        NEMO,
        f"{D}.activation_checkpointing",
        RECOMPUTE,
        "true: full (every layer recomputed, as per-block checkpointing); false: none",
        _dtensor_recompute,
    ),
    as_here(NEMO, f"{D}.cpu_offload", OFFLOAD, off(False), "on GPU"),
    as_here(NEMO, f"{D}.custom_parallel_plan", "a custom TP plan", off(None), "the standard one"),
    as_here(NEMO, f"{D}._v2", "a worker version", any_value, "one Megatron worker"),
    as_here(NEMO, f"{D}.automodel_kwargs", "Automodel options", lambda v, c: v == {}, "none"),
    as_here(NEMO, f"{D}.lora_cfg.enabled", LORA, off(False), "full fine-tuning"),
    *(
        feature_part(f"{D}.lora_cfg.{k}", LORA)
        for k in (
            "target_modules",
            "exclude_modules",
            "match_all_linear",
            "dim",
            "alpha",
            "dropout",
            "dropout_position",
            "lora_A_init",
            "use_triton",
        )
    ),
)

_BATCH_KEYS: tuple[ForeignKey, ...] = (
    same(NEMO, "policy.train_micro_batch_size", "policy.train_micro_batch_size"),
    same(NEMO, "policy.logprob_batch_size", "policy.logprob_micro_batch_size"),
    choice(
        NEMO,
        "policy.precision",
        "policy.precision",
        {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"},
    ),
    custom(
        NEMO,
        f"{PACK}.enabled",
        "policy.max_tokens_per_microbatch",
        "true: packed micro-batches of train_mb_tokens; false: padded ones (null) unless "
        "dynamic batching is on",
        _packing,
    ),
    custom(
        NEMO,
        f"{PACK}.train_mb_tokens",
        "policy.max_tokens_per_microbatch",
        "same budget: tokens of one packed micro-batch on a DP rank, before the CP split",
        _train_tokens(f"{PACK}.enabled", "whole sequences packed up to it, as here"),
    ),
    as_here(
        NEMO,
        f"{PACK}.logprob_mb_tokens",
        "a packing budget of the logprob pass of its own",
        _logprob_tokens,
        "the logprob pass packs with the train budget (same log-probs, other memory)",
    ),
    *(
        as_here(NEMO, f"{PACK}.{k}", "a packing heuristic", any_value, "our packer's")
        for k in ("algorithm", "microbatch_order", "sequence_length_round", "fuse_loss")
    ),
    as_here(
        NEMO,
        f"{DYN}.enabled",
        "dynamic batching",
        any_value,
        "true: micro-batches within train_mb_tokens (carried there); false: packing decides",
    ),
    custom(
        NEMO,
        f"{DYN}.train_mb_tokens",
        "policy.max_tokens_per_microbatch",
        "rows within the budget there, packed up to it here: the same bound per micro-batch",
        _train_tokens(
            f"{DYN}.enabled",
            "NeMo RL's dynamic batching groups rows whose padded tokens fit it, ours packs "
            "whole sequences up to it: the same bound per micro-batch",
        ),
    ),
    as_here(
        NEMO,
        f"{DYN}.logprob_mb_tokens",
        "a batching budget of the logprob pass of its own",
        _logprob_tokens,
        "the logprob pass uses the train budget",
    ),
    as_here(NEMO, f"{DYN}.sequence_length_round", "a padding", any_value, "our padding"),
    as_here(
        NEMO,
        "policy.make_sequence_length_divisible_by",
        "a padding multiple",
        any_value,
        "padding only (masked): ours pads to the multiple its layout needs",
    ),
    as_here(
        NEMO,
        "policy.offload_optimizer_for_logprob",
        OFFLOAD,
        off(False),
        "the optimizer stays on GPU",
    ),
    as_here(
        NEMO, "policy.hf_config_overrides", "model config overrides", lambda v, c: v == {}, "none"
    ),
    as_here(
        NEMO,
        "policy.hf_config_overrides.max_position_embeddings",
        "a max_position_embeddings override beyond the checkpoint's",
        _max_positions,
        "the checkpoint's RoPE: positions up to the run's length, within its limit",
    ),
    as_here(
        NEMO,
        "policy.hf_config_overrides.router_aux_loss_coef",
        "a MoE load-balancing loss",
        off(0, 0.0),
        "no load-balancing loss (policy.moe.aux_loss_coef 0)",
    ),
    *(
        as_here(NEMO, f"policy.hf_config_overrides.rope_scaling.{k}", _ROPE, off(None), "none")
        for k in (
            "rope_type",
            "factor",
            "original_max_position_embeddings",
            "beta_fast",
            "beta_slow",
            "mscale",
            "mscale_all_dim",
            "rope_theta",
            "truncate",
        )
    ),
)

_CLUSTER_KEYS: tuple[ForeignKey, ...] = (
    same(NEMO, "cluster.num_nodes", "cluster.num_nodes"),
    same(NEMO, "cluster.gpus_per_node", "cluster.gpus_per_node"),
    as_here(
        NEMO,
        "cluster.segment_size",
        "topology-aware placement",
        any_value,
        "a placement grouping (NVLink domains): which GPUs host which ranks, not what runs",
    ),
    as_here(
        NEMO,
        "data_plane.enabled",
        "a data plane",
        any_value,
        "how batches move between workers (TransferQueue there, Ray here): the same data",
    ),
    *(
        as_here(NEMO, f"data_plane.{k}", "a data plane", any_value, "batches move through Ray")
        for k in (
            "impl",
            "backend",
            "storage_capacity",
            "num_storage_units",
            "claim_meta_poll_interval_s",
            "global_segment_size",
            "local_buffer_size",
        )
    ),
)

NEMO_LAYOUT_KEYS: tuple[ForeignKey, ...] = (
    _CLUSTER_KEYS + _BATCH_KEYS + NEMO_MEGATRON_KEYS + _DTENSOR_KEYS + NEMO_ENGINE_KEYS
)
"""NeMo RL's layout, kernel, memory, cluster and engine keys."""

NEMO_LAYOUT_TIERS: dict[str, str] = {
    f"{M}.checkpoint.": IMPACT_HARMLESS,  # how checkpoints are written (async, structure)
    # what is learned, though the path says megatron: adapters, FP8 numerics, MTP heads,
    # which router weights train and how experts are balanced
    f"{M}.peft.": IMPACT_ALGORITHM,
    f"{D}.lora_cfg.": IMPACT_ALGORITHM,
    f"{M}.fp8_cfg.": IMPACT_ALGORITHM,
    f"{M}.mtp_num_layers": IMPACT_ALGORITHM,
    f"{M}.mtp_loss_scaling_factor": IMPACT_ALGORITHM,
    f"{M}.mtp_use_repeated_layer": IMPACT_ALGORITHM,
    f"{M}.mtp_detach_heads": IMPACT_ALGORITHM,
    f"{M}.freeze_moe_router": IMPACT_ALGORITHM,
    f"{M}.moe_router_load_balancing_type": IMPACT_ALGORITHM,
    f"{M}.moe_router_enable_expert_bias": IMPACT_ALGORITHM,
    f"{M}.moe_router_bias_update_rate": IMPACT_ALGORITHM,
    "policy.generation.vllm_cfg.precision": IMPACT_ALGORITHM,  # FP8 rollouts: other samples
    "policy.generation.vllm_cfg.kv_cache_dtype": IMPACT_ALGORITHM,
    f"{M}.moe_per_layer_logging": IMPACT_HARMLESS,
    "policy.generation.vllm_cfg.http_refit_api_key_env_var": IMPACT_HARMLESS,
    "policy.generation.vllm_cfg.http_refit_server_port": IMPACT_HARMLESS,
    "policy.generation.vllm_cfg.zmq_refit_server_port": IMPACT_HARMLESS,
}
"""NeMo RL layout keys (or subtrees ending in ".") classified by what NeMo RL does with them."""

_SWITCHED = (
    # (subtree, its switch): NeMo RL reads the subtree only with the switch true
    (f"{M}.peft.", f"{M}.peft.enabled"),
    (f"{M}.fp8_cfg.", f"{M}.fp8_cfg.enabled"),
    (f"{D}.lora_cfg.", f"{D}.lora_cfg.enabled"),
    ("data_plane.", "data_plane.enabled"),
    (f"{PACK}.", f"{PACK}.enabled"),
    (f"{DYN}.", f"{DYN}.enabled"),
)


def layout_inactive(flat: Mapping[str, Any]) -> dict[str, str]:
    """NeMo RL layout keys of a config that are not live there (key -> why): a feature's
    settings while its switch is false (setup.py reads peft.* and fp8_cfg.* only when
    enabled; lm_policy.py reads sequence_packing / dynamic_batching budgets only when
    enabled; grpo_math_1B.yaml: the data plane is off by default), and the engine keys of
    another backend (nemo_engine.engine_inactive).

    NeMo RL's resolver values (`${mul:...}`, e.g. sequence_packing.train_mb_tokens) are
    computed in `flat` first, as nemo_keys.inactive does for relative references: the
    importer's resolve_interpolations reads only plain `${key}` ones."""
    if isinstance(flat, dict):
        resolve_nemo_resolvers(flat)
    dead = engine_inactive(flat)
    for prefix, switch in _SWITCHED:
        if flat.get(switch) is True:
            continue
        for key in flat:
            if key.startswith(prefix) and key != switch:
                dead[key] = f"not live: {switch} is not true"
    return dead


# ---------------------------------------------------------------------------------------
# OmegaConf resolvers: NeMo RL registers mul, div, add and max (nemo_rl/utils/config.py)
# and its configs write e.g. `${mul:${policy.max_total_sequence_length},
# ${policy.train_micro_batch_size}}` and relative `${.temperature}`.

_CALL = re.compile(r"^\$\{(mul|div|add|max):(.*)\}$", re.S)
_REF = re.compile(r"^\$\{([A-Za-z_][\w.]*)\}$")
_RELATIVE = re.compile(r"^\$\{\.([A-Za-z_][\w.]*)\}$")
_OPS: dict[str, Callable[[Any, Any], Any]] = {
    "mul": lambda a, b: a * b,
    "div": lambda a, b: a / b,
    "add": lambda a, b: a + b,
    "max": max,
}


def _split_args(text: str) -> list[str]:
    """A resolver's arguments, split at the commas outside nested `${...}`."""
    args, depth, start = [], 0, 0
    for i, c in enumerate(text):
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
        elif c == "," and depth == 0:
            args.append(text[start:i].strip())
            start = i + 1
    args.append(text[start:].strip())
    return args


def _evaluate(text: str, flat: Mapping[str, Any]) -> int | float | None:
    """The number a resolver expression, a `${key}` or a literal stands for, or None."""
    value: Any = text
    if call := _CALL.match(text):
        args = [_evaluate(a, flat) for a in _split_args(call.group(2))]
        if len(args) != 2 or args[0] is None or args[1] is None:
            return None
        if call.group(1) == "div" and args[1] == 0:
            return None  # OmegaConf would raise: left unresolved, listed by the import
        value = _OPS[call.group(1)](args[0], args[1])
    elif ref := _REF.match(text):
        value = flat.get(ref.group(1))
    if isinstance(value, str):
        try:
            value = float(value) if any(c in value for c in ".eE") else int(value)
        except ValueError:
            return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return value


def resolve_nemo_resolvers(flat: dict[str, Any]) -> None:
    """`${mul:a, b}` (also div, add, max; each argument a number, a `${key}` or another
    such call) and relative `${.key}` values replaced by their value where every argument
    is known, as NeMo RL's OmegaConf resolvers compute them; anything else stays a string."""
    for _ in range(8):  # chains, bounded
        changed = False
        for key, value in list(flat.items()):
            if not isinstance(value, str) or "${" not in value:
                continue
            if rel := _RELATIVE.match(value):
                target = key.rsplit(".", 1)[0] + "." + rel.group(1)
                found = flat.get(target)
                if (
                    target in flat
                    and target != key
                    and not (isinstance(found, str) and "${" in found)
                ):
                    flat[key] = found
                    changed = True
            elif _CALL.match(value) and (number := _evaluate(value, flat)) is not None:
                flat[key] = number
                changed = True
        if not changed:
            return
