"""NeMo RL's layout on the real configs: every Megatron (and DTensor) file's parallel layout,
recompute, micro-batch and token budgets, nodes, GPUs per node, colocation, engine TP and
memory utilisation, as translate() writes them, against values read here from the raw YAML
(the file merged with its `defaults:` chain by this test's own merge, NeMo RL's `${...}`
resolvers worked out by hand): never the importer's output.

What NeMo RL does with each key was read at the commit of tests/data/foreign/nemo-rl/
SOURCES.md: nemo_rl/models/megatron/setup.py (megatron_cfg -> Megatron-Core), lm_policy.py
and distributed/batched_data_dict.py (packing budgets), algorithms/grpo.py setup() (the
non-colocated split of the cluster), models/automodel/setup.py (DTensor).
"""

from __future__ import annotations

import re
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
from dapo_megatron.migrate.nemo_layout import NEMO_LAYOUT_KEYS, resolve_nemo_resolvers

DATA = Path(__file__).resolve().parents[2] / "data" / "foreign" / "nemo-rl"
FILES = sorted(p.relative_to(DATA).as_posix() for p in DATA.rglob("*.yaml"))

# ---------------------------------------------------------------------------------------
# The test's own reading of a NeMo RL file


def _merge(base: dict[str, Any], child: dict[str, Any]) -> dict[str, Any]:
    """OmegaConf's merge as NeMo RL's load_config does it: mappings merge key by key, any
    other child value (a scalar, a list, null) replaces the parent's."""
    out = dict(base)
    for key, value in child.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out


def _tree(path: Path) -> dict[str, Any]:
    raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    parent = raw.pop("defaults", None)
    if isinstance(parent, str):
        return _merge(_tree(path.parent / parent), raw)
    return raw


def _get(tree: dict[str, Any], dotted: str) -> Any:
    node: Any = tree
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return _value(tree, node)


_REF = re.compile(r"^\$\{([\w.]+)\}$")
_MUL = re.compile(r"^\$\{mul:\$\{([\w.]+)\},\s*\$\{([\w.]+)\}\}$")


def _value(tree: dict[str, Any], node: Any) -> Any:
    """The two interpolation shapes the layout keys of these files use: `${a.b}` and
    `${mul:${a}, ${b}}` (the packing budgets of grpo_math_1B.yaml)."""
    if isinstance(node, str) and (ref := _REF.match(node)):
        return _get(tree, ref.group(1))
    if isinstance(node, str) and (mul := _MUL.match(node)):
        return _get(tree, mul.group(1)) * _get(tree, mul.group(2))
    return node


def _expected(tree: dict[str, Any]) -> dict[str, Any]:
    """Our layout settings for a NeMo RL file, worked out from its merged YAML."""
    g = lambda key: _get(tree, key)  # noqa: E731
    out: dict[str, Any] = {}
    if g("policy.megatron_cfg.enabled") is True:
        m = "policy.megatron_cfg."
        out["policy.megatron.tensor_model_parallel_size"] = g(m + "tensor_model_parallel_size")
        out["policy.megatron.pipeline_model_parallel_size"] = g(m + "pipeline_model_parallel_size")
        out["policy.megatron.context_parallel_size"] = g(m + "context_parallel_size")
        out["policy.megatron.expert_model_parallel_size"] = g(m + "expert_model_parallel_size")
        out["policy.megatron.sequence_parallel"] = g(m + "sequence_parallel")
        # setup.py: activation_checkpointing true + recompute_granularity full -> uniform,
        # one layer per unit (every file here that turns it on uses "full")
        on = g(m + "activation_checkpointing")
        out["policy.megatron.recompute_granularity"] = (
            g(m + "recompute_granularity") if on else "none"
        )
    else:  # DTensor: its TP / CP / SP and per-block checkpointing on our Megatron layout
        d = "policy.dtensor_cfg."
        out["policy.megatron.tensor_model_parallel_size"] = g(d + "tensor_parallel_size")
        out["policy.megatron.context_parallel_size"] = g(d + "context_parallel_size")
        out["policy.megatron.sequence_parallel"] = g(d + "sequence_parallel")
        full = g(d + "activation_checkpointing")
        out["policy.megatron.recompute_granularity"] = "full" if full else "none"
    out["policy.train_micro_batch_size"] = g("policy.train_micro_batch_size")
    out["policy.logprob_micro_batch_size"] = g("policy.logprob_batch_size")
    if g("policy.sequence_packing.enabled") is True:
        tokens = g("policy.sequence_packing.train_mb_tokens")
    elif g("policy.dynamic_batching.enabled") is True:
        tokens = g("policy.dynamic_batching.train_mb_tokens")
    else:
        tokens = None
    out["policy.max_tokens_per_microbatch"] = tokens
    nodes, gpus = g("cluster.num_nodes"), g("cluster.gpus_per_node")
    out["cluster.num_nodes"], out["cluster.gpus_per_node"] = nodes, gpus
    colocated = g("policy.generation.colocated.enabled")
    out["cluster.colocated"] = colocated
    # grpo.py setup(): one node -> resources.gpus_per_node of it; more -> whole nodes
    res = "policy.generation.colocated.resources."
    out["cluster.generation_num_devices"] = (
        0 if colocated else g(res + "gpus_per_node") if nodes == 1 else g(res + "num_nodes") * gpus
    )
    backend = g("policy.generation.backend")
    if backend in ("vllm", "megatron"):
        out["generation.backend"] = backend
    if backend == "vllm":
        v = "policy.generation.vllm_cfg."
        out["generation.engine.tensor_parallel_size"] = g(v + "tensor_parallel_size")
        out["generation.engine.gpu_memory_utilization"] = g(v + "gpu_memory_utilization")
    return out


def _translate(name: str, *overrides: str) -> ImportResult:
    """The import as dapo-import-config reads a file (overrides, then interpolations)."""
    flat = read_source(DATA / name, {})
    apply_foreign_overrides(flat, list(overrides))
    resolve_interpolations(flat)
    return translate("nemo-rl", flat)


def _settings(result: ImportResult) -> dict[str, Any]:
    return {s.key: s.value for s in result.settings}


def _skipped(result: ImportResult) -> dict[str, str]:
    return {s.key: s.reason for s in result.skipped}


# ---------------------------------------------------------------------------------------
# Every file


@pytest.mark.parametrize("name", FILES)
def test_layout_of_every_file_is_the_sources(name):
    expected = _expected(_tree(DATA / name))
    got = _settings(_translate(name))
    wrong = {k: (v, got.get(k, "(not set)")) for k, v in expected.items() if got.get(k) != v}
    assert not wrong, f"{name}: source value vs ours: {wrong}"
    # never the other way round: a value set where NeMo RL's differs (types too: 1 != True)
    for key, value in expected.items():
        assert type(got[key]) is type(value), (name, key)


_OURS = {fk.key for fk in NEMO_LAYOUT_KEYS}
_LAYOUT_PREFIXES = (
    "cluster.",
    "data_plane.",
    "policy.megatron_cfg.",
    "policy.dtensor_cfg.",
    "policy.sequence_packing.",
    "policy.dynamic_batching.",
    "policy.generation.vllm_cfg.",
    "policy.generation.vllm_kwargs",
    "policy.generation.mcore_generation_config.",
    "policy.generation.colocated.",
    "policy.generation.refit",
    "policy.hf_config_overrides",
)
_NOT_MINE = ("policy.megatron_cfg.optimizer.", "policy.megatron_cfg.scheduler.")


@pytest.mark.parametrize("name", FILES)
def test_every_layout_key_is_carried_as_here_or_refused_by_feature(name):
    """A layout key of a real file is never left as "not in the importer's table": it is
    translated, needs nothing here, is not live, or is refused naming what we lack."""
    result = _translate(name)
    for s in result.skipped:
        mine = s.key in _OURS or (
            s.key.startswith(_LAYOUT_PREFIXES) and not s.key.startswith(_NOT_MINE)
        )
        if not mine or not s.blocking:
            continue
        assert "not in the importer's table" not in s.reason, (name, s.key)
        # NeMo RL's ${mul:...} budgets are resolved, never left as an unknown string
        assert "interpolation or shell variable" not in s.reason, (name, s.key)
        assert "which dapo-megatron lacks" in s.reason, (name, s.key, s.reason)


# ---------------------------------------------------------------------------------------
# The example and the points where NeMo RL's meaning is easy to get wrong


def test_sequence_parallel_is_carried_on_and_off():
    # grpo_math_1B.yaml megatron_cfg.sequence_parallel: false (the base); the 30B-A3B
    # recipe turns it on with TP 4: both carried, never left at our default silently.
    assert _tree(DATA / "grpo_math_1B.yaml")["policy"]["megatron_cfg"]["sequence_parallel"] is False
    base = _settings(_translate("grpo_math_1B_megatron.yaml"))
    assert base["policy.megatron.sequence_parallel"] is False
    on = _settings(_translate("recipes/llm/grpo-qwen3-30ba3b-8n8g-megatron.yaml"))
    assert on["policy.megatron.sequence_parallel"] is True
    assert on["policy.megatron.tensor_model_parallel_size"] == 4


def test_dtensor_layout_is_carried_only_when_dtensor_is_the_backend():
    # dapo-qwen2.5-7b.v2.yaml: DTensor live (CP 4), its megatron_cfg (TP 4, PP 2, CP 2, SP)
    # is not read by NeMo RL and must not reach our layout.
    result = _translate("recipes/llm/dapo-qwen2.5-7b.v2.yaml")
    got = _settings(result)
    assert got["policy.megatron.context_parallel_size"] == 4
    assert got["policy.megatron.tensor_model_parallel_size"] == 1
    assert got["policy.megatron.sequence_parallel"] is False
    assert "policy.megatron.pipeline_model_parallel_size" not in got
    assert _skipped(result)["policy.megatron_cfg.sequence_parallel"].startswith("not live")
    # and a Megatron file's dtensor_cfg is not live
    meg = _translate("grpo_math_1B_megatron.yaml")
    assert all(
        why.startswith("not live")
        for key, why in _skipped(meg).items()
        if key.startswith("policy.dtensor_cfg.")
    )


def test_packing_budget_is_max_total_sequence_length_times_micro_batch():
    # grpo_math_1B.yaml: train_mb_tokens ${mul:${policy.max_total_sequence_length},
    # ${policy.train_micro_batch_size}}; the 7B recipe: 4096 x 1.
    got = _settings(_translate("recipes/llm/grpo-qwen2.5-7b-instruct-4n8g-megatron.yaml"))
    assert got["policy.max_tokens_per_microbatch"] == 4096 * 1
    # packing off (the 30B-A3B recipe): padded micro-batches, written as null
    off = _settings(_translate("recipes/llm/grpo-qwen3-30ba3b-8n8g-megatron.yaml"))
    assert off["policy.max_tokens_per_microbatch"] is None


def test_resolvers_nested_and_relative():
    flat: dict[str, Any] = {
        "policy.dtensor_cfg.tensor_parallel_size": 2,
        "policy.dtensor_cfg.context_parallel_size": 4,
        "policy.make_sequence_length_divisible_by": "${mul:${policy.dtensor_cfg."
        "tensor_parallel_size}, ${mul:2, ${policy.dtensor_cfg.context_parallel_size}}}",
        "policy.generation.temperature": 0.7,
        "policy.generation.val_temperature": "${.temperature}",
        "x.factor": "${div:${policy.dtensor_cfg.context_parallel_size}, 2}",
        "x.unknown": "${mul:${nowhere}, 2}",
        "x.by_zero": "${div:1, 0}",
    }
    resolve_nemo_resolvers(flat)
    assert flat["policy.make_sequence_length_divisible_by"] == 2 * 2 * 4
    assert flat["policy.generation.val_temperature"] == 0.7
    assert flat["x.factor"] == 2.0
    assert flat["x.unknown"] == "${mul:${nowhere}, 2}"  # unknown: left for the import to list
    assert flat["x.by_zero"] == "${div:1, 0}"


def test_non_colocated_generation_devices():
    # grpo-llama3.2-1b-instruct-2n8g-megatron_generation-noncolocated.yaml: 2 nodes x 8,
    # resources.num_nodes 1 -> generation gets one whole node (8 GPUs), the policy the other
    got = _settings(
        _translate(
            "recipes/llm/grpo-llama3.2-1b-instruct-2n8g-megatron_generation-noncolocated.yaml"
        )
    )
    assert (got["cluster.colocated"], got["cluster.generation_num_devices"]) == (False, 8)
    assert got["cluster.num_nodes"] == 2
    # one node: resources.gpus_per_node of its GPUs (grpo.py asserts it is set and > 0)
    one = _settings(
        _translate(
            "grpo_math_8B_megatron.yaml",
            "policy.generation.colocated.enabled=false",
            "policy.generation.colocated.resources.gpus_per_node=2",
        )
    )
    assert (one["cluster.colocated"], one["cluster.generation_num_devices"]) == (False, 2)
    missing = _skipped(
        _translate("grpo_math_8B_megatron.yaml", "policy.generation.colocated.enabled=false")
    )
    assert "resources.gpus_per_node > 0" in missing["policy.generation.colocated.enabled"]


def _convert(key: str, value: Any, ctx: dict[str, Any]) -> Any:
    fk = foreign_key(key, "nemo-rl")
    assert fk is not None, key
    return fk.convert(value, ctx)


def test_recompute_only_where_ours_does_the_same():
    key = "policy.megatron_cfg.activation_checkpointing"
    g = "policy.megatron_cfg.recompute_granularity"
    modules = "policy.megatron_cfg.recompute_modules"
    assert _convert(key, False, {g: "full"}).settings == (
        ("policy.megatron.recompute_granularity", "none"),
    )
    assert _convert(key, True, {g: "full"}).settings == (
        ("policy.megatron.recompute_granularity", "full"),
    )
    # selective with MCore's default modules (null = core_attn) is ours
    assert _convert(key, True, {g: "selective", modules: None}).settings == (
        ("policy.megatron.recompute_granularity", "selective"),
    )
    with pytest.raises(Untranslatable, match="which dapo-megatron lacks"):
        _convert(key, True, {g: "selective", modules: ["moe"]})


def test_expert_tensor_parallel_is_ours_only_where_it_equals_tp():
    key = "policy.megatron_cfg.expert_tensor_parallel_size"
    tp = "policy.megatron_cfg.tensor_model_parallel_size"
    dense = {"policy.model_name": "Qwen/Qwen2.5-7B-Instruct", tp: 4}
    moe = {"policy.model_name": "Qwen/Qwen3-30B-A3B", tp: 4}
    assert _convert(key, 1, dense).settings == ()  # no experts: not read
    assert _convert(key, 4, moe).settings == ()  # ours: expert TP = TP
    with pytest.raises(Untranslatable, match="expert tensor-parallel size other than TP"):
        _convert(key, 1, moe)
    result = _translate("recipes/llm/grpo-qwen3-30ba3b-8n8g-megatron.yaml")
    assert "expert tensor-parallel" in _skipped(result)[key]


@pytest.mark.parametrize(
    "name, key, feature",
    [
        ("recipes/llm/grpo-qwen3-8b-base-1n8g-megatron-lora.yaml", "policy.megatron_cfg.peft.enabled", "LoRA"),
        ("recipes/llm/grpo-llama3.1-8b-instruct-2n8g-megatron-fp8-e2e.yaml", "policy.megatron_cfg.fp8_cfg.enabled", "FP8 training"),
        ("recipes/llm/grpo-llama3.1-8b-instruct-1n8g-megatron-fp8-rollouts.v3.yaml", "policy.generation.vllm_cfg.precision", "FP8"),
        ("recipes/llm/grpo-qwen3-8b-base-1n8g-fp8-kvcache-megatron.yaml", "policy.generation.vllm_cfg.kv_cache_dtype", "FP8 KV cache"),
        ("recipes/llm/grpo-nemotron3-super-120BA12B-16n8g-megatron.yaml", "policy.megatron_cfg.mtp_num_layers", "multi-token prediction"),
        ("recipes/llm/grpo-dapomath17k-dsv3-megatron.yaml", "policy.megatron_cfg.num_layers_in_first_pipeline_stage", "uneven pipeline stages"),
        ("recipes/llm/grpo-qwen2.5-1.5B-4n8g-megatron-yarn-256k.yaml", "policy.hf_config_overrides.rope_scaling.rope_type", "RoPE scaling"),
        ("recipes/llm/grpo-qwen3-1.7b-1n8g-megatron-eagle3.yaml", "policy.generation.vllm_kwargs.speculative_config.method", "speculative decoding"),
        ("grpo_math_1B_trtllm.yaml", "policy.generation.backend", "trtllm inference engine"),
        ("recipes/llm/dapo-qwen2.5-7b.v2.yaml", "policy.hf_config_overrides.max_position_embeddings", "max_position_embeddings override"),
    ],
)  # fmt: skip
def test_features_we_lack_are_refused_by_name(name, key, feature):
    reason = _skipped(_translate(name))[key]
    assert feature in reason and "which dapo-megatron lacks" in reason, reason


def test_frozen_moe_router_is_carried():
    # grpo_math_1B.yaml megatron_cfg.freeze_moe_router: true, inherited by the 30B-A3B
    # recipe: setup.py's pre-wrap hook sets each router's requires_grad False, ours too
    assert _tree(DATA / "grpo_math_1B.yaml")["policy"]["megatron_cfg"]["freeze_moe_router"] is True
    result = _translate("recipes/llm/grpo-qwen3-30ba3b-8n8g-megatron.yaml")
    assert _settings(result)["policy.moe.freeze_router"] is True
    assert "policy.megatron_cfg.freeze_moe_router" not in _skipped(result)


def test_feature_subtrees_are_not_live_while_off():
    # grpo_math_1B.yaml: peft.enabled, fp8_cfg.enabled, lora_cfg.enabled, data_plane.enabled
    # false; the Megatron worker reads none of their settings then (setup.py).
    skipped = _skipped(_translate("grpo_math_1B_megatron.yaml"))
    for key in (
        "policy.megatron_cfg.peft.dim",
        "policy.megatron_cfg.fp8_cfg.fp8_recipe",
        "data_plane.backend",
        "policy.dynamic_batching.train_mb_tokens",
        "policy.generation.mcore_generation_config.buffer_size_gb",  # backend vllm
        "policy.generation.colocated.resources.gpus_per_node",  # colocated
    ):
        assert skipped[key].startswith("not live"), key


def test_speed_only_keys_need_nothing_set():
    # kernels, fusions, CUDA graphs, communication overlap, allocator: the same math here
    ctx = {"policy.model_name": "Qwen/Qwen2.5-7B-Instruct"}
    for key, value in (
        ("policy.megatron_cfg.apply_rope_fusion", False),
        ("policy.megatron_cfg.bias_activation_fusion", True),
        ("policy.megatron_cfg.moe_permute_fusion", True),
        ("policy.megatron_cfg.cuda_graph_impl", "local"),
        ("policy.megatron_cfg.distributed_data_parallel_config.overlap_grad_reduce", True),
        ("policy.megatron_cfg.empty_unused_memory_level", 2),
        ("policy.megatron_cfg.defer_fp32_logits", True),
        ("policy.generation.vllm_kwargs.moe_backend", "triton"),
        ("policy.generation.refit_transport", "nixl"),
        ("cluster.segment_size", 4),
    ):
        tr = _convert(key, value, ctx)
        assert tr.settings == () and tr.note.startswith("same as here"), key


# ---------------------------------------------------------------------------------------
# The written recipe plans at the source's layout and node count, or says what does not fit

# NeMo RL's own overrides keep each file's max_total_sequence_length and split it into a
# quarter of prompt and the rest of response (max_input_seq_length - 1 + max_new_tokens =
# the total): the length rule of nemo_keys.py (a per-prompt cap we lack) then passes and the
# plan is of the source's length, not our default. Other untranslated keys (algorithm,
# data) are written marked (--allow-untranslated): this checks the layout's plan only.
PLANS = [
    # (file, fits, a setting the line must name when it does not fit)
    ("recipes/llm/grpo-qwen3-30ba3b-8n8g-megatron.yaml", True, None),
    ("recipes/llm/grpo-qwen3-1.7b-1n8g-megatron-eagle3.yaml", True, None),
    ("grpo_math_8B_megatron_nixl.yaml", True, None),  # engines on a node of their own
    ("recipes/llm/grpo-qwen3-8b-base-dapo-2n8g-long-megatron-qa-nvfp4-w4a16.yaml", True, None),
    ("grpo_math_8B_megatron.yaml", False, "generation.engine.gpu_memory_utilization"),
    (
        "recipes/llm/grpo-qwen2.5-7b-instruct-4n8g-megatron.yaml",
        False,
        "generation.engine.gpu_memory_utilization",
    ),
    (
        "recipes/llm/grpo-qwen2.5-7b-instruct-4n4g-megatron.yaml",
        False,
        "policy.megatron.tensor_model_parallel_size",
    ),
    (
        "recipes/llm/performance/grpo-qwen3-30ba3b-4n8g.yaml",
        False,
        "policy.megatron.recompute_granularity",
    ),
]


@pytest.mark.parametrize("name, fits, names", PLANS)
def test_written_recipe_plans_at_the_sources_layout(name, fits, names, tmp_path, capsys):
    from dapo_megatron.config.loader import load_config
    from dapo_megatron.migrate.import_config import main
    from dapo_megatron.migrate.plan_check import check_plan

    tree = _tree(DATA / name)
    total = _get(tree, "policy.max_total_sequence_length")
    prompt = total // 4
    out = tmp_path / "r.yaml"
    rc = main(
        [
            "--from",
            "nemo-rl",
            str(DATA / name),
            "-o",
            str(out),
            "--allow-untranslated",
            f"data.max_input_seq_length={prompt + 1}",
            f"policy.generation.max_new_tokens={total - prompt}",
        ]
    )
    printed = capsys.readouterr().out
    line = next(x for x in printed.splitlines() if x.startswith("dapo-plan: "))
    verdict = check_plan(out)
    print(f"{name}: {line}")
    assert verdict.fits is fits, line
    assert rc == (0 if fits else 1)
    if names is not None:
        assert names in line
    cfg = load_config(out).config
    expected = _expected(tree)
    assert cfg.cluster.num_nodes == expected["cluster.num_nodes"]
    assert cfg.cluster.gpus_per_node == expected["cluster.gpus_per_node"]
    assert (
        cfg.policy.megatron.tensor_model_parallel_size
        == (expected["policy.megatron.tensor_model_parallel_size"])
    )
    assert cfg.policy.megatron.sequence_parallel is expected["policy.megatron.sequence_parallel"]
    assert cfg.policy.max_total_sequence_length == total
    assert cfg.cluster.colocated is expected["cluster.colocated"]
    assert cfg.cluster.generation_num_devices == expected["cluster.generation_num_devices"]
