"""Every verl script of tests/data/foreign/verl/ (SOURCES.md): the outcome of importing it
("plans", or "refused: <features>") and its run-changing values.

The expected values are NOT the importer's output: a small parser of this file (`_script`,
independent of migrate/foreign_source.py: `NAME=value` lines, `${NAME:-default}`, `$NAME`,
`$((a * b))`, then the `key=value` words of the command) reads each script's raw values,
and the test derives ours from them by the rules read in verl's code (cited where used):
  - TP, PP, CP, EP: the same numbers; sequence parallel on iff TP > 1 (verl's
    McoreEngineConfig.__post_init__ turns it off at TP 1, workers/config/engine.py);
  - prompts per step: train_batch_size with filter_groups on; without it the whole
    generated batch, gen_batch_size (verl-recipe dapo_ray_trainer.py fit: `batch =
    new_batch`); surplus discard with filter_groups on (`batch = batch[:traj_bsz]`);
  - our mini-batch counts samples: ppo_mini_batch_size x rollout.n;
  - nodes, GPUs, n, lr, clip ratios, lengths, loss aggregation, overlong buffer: the same.
Features refused are listed by hand per file, from reading the script.
"""

from __future__ import annotations

import contextlib
import re
import shlex
from pathlib import Path
from typing import Any

import pytest
import yaml

from dapo_megatron.migrate.foreign_source import read_source
from dapo_megatron.migrate.import_config import main as import_main
from dapo_megatron.migrate.import_config import translate

DATA = Path(__file__).resolve().parents[2] / "data" / "foreign" / "verl"
HOME = "/home/u"
A = "actor_rollout_ref.actor"
R = "actor_rollout_ref.rollout"
M = f"{A}.megatron"

OFFLOAD = "CPU offload"
TWO_FILES = "2 training files in one set"

# Hand-read from each script: what the import must refuse (a fragment of each feature's
# words), or [] for "plans". Every script here sets a CPU offload or a feature we lack (a
# run length in epochs is carried: trainer.total_epochs -> dapo.max_num_epochs, except over
# dapo-math-17k.parquet, _dapo_math: refused with filter_groups on and no step count).
EPOCH_17K = "needs an epoch over"
OUTCOMES: dict[str, list[str]] = {
    "30B_megatron_dapo_npu.sh": ["NPU devices", OFFLOAD],
    "qwen2_32B_grpo_8_h20_megatron_vllm.sh": ["MATH-lighteval", OFFLOAD],
    "run_dapo_early_qwen2.5_32b.sh": [OFFLOAD],
    "run_dapo_qwen2.5_32b.sh": [OFFLOAD, EPOCH_17K],
    "run_dapo_qwen2.5_32b_rollout_corr.sh": ["rollout correction", OFFLOAD, EPOCH_17K],
    "run_dapo_qwen3_moe_30b_megatron_npu.sh": [OFFLOAD, EPOCH_17K],
    "run_dapo_wo_ds_qwen2.5_32b.sh": [OFFLOAD],
    "run_deepseek671b_math_megatron_80gb.sh": [
        "neither a hub id",
        "an uneven pipeline split",
        OFFLOAD,
    ],
    "run_deepseek671b_math_megatron_96gb.sh": ["DeepSeek-V2/V3", OFFLOAD],
    "run_deepseek7b_llm_math_megatron.sh": [TWO_FILES, "DeepSeek-V2/V3"],
    "run_moonlight16b_math_megatron.sh": [
        "Moonlight",
        "an expert tensor-parallel size other than the tensor-parallel size",
    ],
    "run_qwen2-7b_math_megatron.sh": [TWO_FILES],
    "run_qwen2-7b_math_megatron_lora.sh": [TWO_FILES, "LoRA"],
    "run_qwen2-7b_math_megatron_trtllm.sh": [TWO_FILES, "the trtllm inference engine"],
    "run_qwen2-7b_seq_balance_math_megatron.sh": [TWO_FILES, OFFLOAD],
    "run_qwen2-7b_sgl_megatron.sh": [
        TWO_FILES,
        "the sglang inference engine",
        "virtual pipeline stages",
    ],
    "run_qwen2_5-7b_math_megatron_diff_tp.sh": [TWO_FILES],
    "run_qwen3-235b_megatron_96gb.sh": [OFFLOAD, "precision-aware optimizer"],
    "run_qwen3moe-30b_megatron_96gb.sh": ["cannot identify", OFFLOAD],
    "run_qwen3moe-30b_megatron_lora.sh": ["LoRA", OFFLOAD],
    "test_dapo_7b_math.sh": [OFFLOAD, "FSDP sharding groups"],
    "test_dapo_7b_math_megatron.sh": [OFFLOAD],
    "test_dapo_8b_megatron_fp16.sh": [OFFLOAD],
    "test_dapo_8b_megatron_fp8train.sh": ["FP8 training", OFFLOAD],
    "test_dapo_dspk_671b_megatron_96gb.sh": ["neither a hub id", OFFLOAD, "an uneven pipeline"],
    "test_dapo_glm_air_megatron.sh": ["the GLM architecture", OFFLOAD],
    "test_dapo_gptoss_20b_megatron.sh": ["gpt-oss", OFFLOAD],
    "test_dapo_mimo_7b_with_mtp_math_megatron.sh": [
        "multi-token prediction",
        "MiMo",
        "the sglang inference engine",
        OFFLOAD,
    ],
    "test_dapo_qwen3_30b_math.sh": [OFFLOAD, "FSDP sharding groups"],
    "test_dapo_qwen3_moe_30b_megatron_fp16.sh": [OFFLOAD],
    "test_dapo_qwen3next_80b_megatron.sh": ["cannot resolve", OFFLOAD],
}

# Their only refusals are speed and memory knobs (CPU offload) and the plan fits without them:
# import_config.py main writes the recipe (exit 0), naming what it did not carry.
PLANS_WITHOUT = {"test_dapo_7b_math_megatron.sh"}


def test_every_file_has_an_outcome_and_a_source_row():
    files = sorted(p.name for p in DATA.glob("*.sh"))
    assert files == sorted(OUTCOMES)
    sources = (DATA / "SOURCES.md").read_text(encoding="utf-8")
    for name in files:
        assert f"| {name} |" in sources


# ---------------------------------------------------------------------------------------
# An independent reading of the scripts


_ASSIGN = re.compile(r"^(?:export\s+)?([A-Za-z_]\w*)=(.*)$")
_REF = re.compile(r"\$\{([A-Za-z_]\w*)(?::-([^{}]*(?:\{[^{}]*\}[^{}]*)*))?\}|\$([A-Za-z_]\w*)")
_ARITH = re.compile(r"\$\(\(([^()]*)\)\)")


def _expand(text: str, env: dict[str, str]) -> str:
    for _ in range(6):
        new = _ARITH.sub(lambda m: str(_arith(_expand(m.group(1), env), env)), text)
        new = _REF.sub(lambda m: _ref(m, env), new)
        if new == text:
            break
        text = new
    return text


def _ref(m: re.Match[str], env: dict[str, str]) -> str:
    name = m.group(1) or m.group(3)
    if name in env and env[name] != "":
        return env[name]
    if m.group(2) is not None:
        return _expand(m.group(2).strip("\"'"), env)
    return "${" + name + "}"


def _arith(expr: str, env: dict[str, str]) -> int:
    expr = re.sub(r"[A-Za-z_]\w*", lambda m: env.get(m.group(0), m.group(0)), expr)
    if not re.fullmatch(r"[\d\s*+/()-]+", expr):
        raise ValueError(expr)
    return int(eval(expr.replace("/", "//")))  # noqa: S307 - digits and operators only


def _script(name: str) -> dict[str, Any]:
    """The script's `dotted.key=value` words, values as YAML, with HOME set."""
    env = {"HOME": HOME}
    out: dict[str, Any] = {}
    text = (DATA / name).read_text(encoding="utf-8").replace("\\\n", " ")
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        m = _ASSIGN.match(re.sub(r"\s+#.*$", "", line))
        if m and not re.search(
            r"\s", re.sub(r"\$\(\([^()]*\)\)|\"[^\"]*\"|'[^']*'|\$\{[^}]*\}", "", m.group(2))
        ):
            value = _expand(m.group(2), env)
            with contextlib.suppress(ValueError):
                value = " ".join(shlex.split(value)) if value else ""
            env[m.group(1)] = value
            continue
        try:
            words = shlex.split(_expand(line, env), comments=True)
        except ValueError:
            continue
        for word in words:
            key, sep, raw = word.partition("=")
            key = key.lstrip("+")
            if sep and re.fullmatch(r"[A-Za-z_][\w-]*(\.[\w-]+)+", key):
                try:
                    out[key] = yaml.safe_load(raw) if raw else None
                except yaml.YAMLError:
                    out[key] = raw
                if isinstance(out[key], str) and re.fullmatch(r"-?\d+(\.\d*)?e-?\d+", out[key]):
                    out[key] = float(out[key])  # 1e-6: a number to Hydra, a string to YAML 1.1
    return out


def test_the_parser_reads_by_eye_values():
    """Values read by eye from three scripts check the parser itself."""
    v = _script("test_dapo_7b_math_megatron.sh")
    # train_prompt_bsz=512, n_resp_per_prompt=16, train_prompt_mini_bsz=32, gen_tp=4,
    # train_tp=4, train_pp=2, NNODES=4 (16 GPUs each), max_response_length=$((1024 * 8))
    assert v["data.train_batch_size"] == 512 and v[f"{R}.n"] == 16
    assert v[f"{A}.ppo_mini_batch_size"] == 32
    assert v[f"{M}.tensor_model_parallel_size"] == 4 and v[f"{M}.pipeline_model_parallel_size"] == 2
    assert v["data.max_response_length"] == 8192
    assert (v["trainer.nnodes"], v["trainer.n_gpus_per_node"]) == (4, 16)
    v = _script("run_qwen3-235b_megatron_96gb.sh")
    # ...-pp8-tp4-ep4: the experiment's own name says the layout
    assert (v[f"{M}.pipeline_model_parallel_size"], v[f"{M}.tensor_model_parallel_size"]) == (8, 4)
    assert v[f"{M}.expert_model_parallel_size"] == 4
    v = _script("run_dapo_qwen2.5_32b.sh")
    assert v["data.gen_batch_size"] == 1536 and v["algorithm.filter_groups.enable"] is True


# ---------------------------------------------------------------------------------------
# Each file: the outcome and the values


def _ours(raw: dict[str, Any]) -> dict[str, Any]:
    """Our values, derived from the raw script values by the rules of the docstring."""
    exp: dict[str, Any] = {}
    tp = raw.get(f"{M}.tensor_model_parallel_size", 1)
    if f"{M}.tensor_model_parallel_size" in raw:
        exp["policy.megatron.tensor_model_parallel_size"] = tp
        exp["policy.megatron.sequence_parallel"] = tp > 1
    for theirs, ours in (
        (f"{M}.pipeline_model_parallel_size", "policy.megatron.pipeline_model_parallel_size"),
        (f"{M}.context_parallel_size", "policy.megatron.context_parallel_size"),
        (f"{M}.expert_model_parallel_size", "policy.megatron.expert_model_parallel_size"),
        (f"{A}.ulysses_sequence_parallel_size", "policy.megatron.context_parallel_size"),
        ("trainer.nnodes", "cluster.num_nodes"),
        ("trainer.n_gpus_per_node", "cluster.gpus_per_node"),
        (f"{R}.n", "dapo.num_generations_per_prompt"),
        (f"{A}.optim.lr", "policy.optimizer.lr"),
        (f"{A}.clip_ratio_low", "dapo.loss.clip_ratio_low"),
        (f"{A}.clip_ratio_high", "dapo.loss.clip_ratio_high"),
        (f"{A}.clip_ratio_c", "dapo.loss.clip_ratio_c"),
        (f"{A}.loss_agg_mode", "dapo.loss.loss_agg_mode"),
        ("data.max_prompt_length", "data.max_prompt_length"),
        ("data.max_response_length", "generation.max_response_length"),
        (f"{R}.tensor_model_parallel_size", "generation.engine.tensor_parallel_size"),
        (f"{R}.gpu_memory_utilization", "generation.engine.gpu_memory_utilization"),
        ("trainer.total_training_steps", "dapo.max_num_steps"),
    ):
        if theirs in raw and isinstance(raw[theirs], int | float | str):
            exp[ours] = raw[theirs]
    # ray_trainer.py fit loops `for epoch in range(..., total_epochs)` (default 30,
    # trainer/config/ppo_trainer.yaml): the same passes, whether or not a step cap is set
    epochs = raw.get("trainer.total_epochs", 30)
    if isinstance(epochs, int | str):
        exp["dapo.max_num_epochs"] = int(epochs) if str(epochs).isdigit() else epochs
    filtering = raw.get("algorithm.filter_groups.enable") is True
    exp["dapo.dynamic_sampling.enabled"] = filtering
    if filtering:
        exp["dapo.dynamic_sampling.surplus"] = "discard"
    prompts = raw["data.train_batch_size"]
    exp["dapo.num_prompts_per_step"] = (
        prompts if filtering else raw.get("data.gen_batch_size", prompts)
    )
    n = raw.get(f"{R}.n", 1)
    exp["policy.train_global_batch_size"] = raw[f"{A}.ppo_mini_batch_size"] * n
    for root in ("reward_model.reward_kwargs.overlong_buffer_cfg", "reward_model.overlong_buffer"):
        if f"{root}.enable" in raw:
            exp["dapo.overlong_buffer.enabled"] = raw[f"{root}.enable"]
            if raw[f"{root}.enable"]:
                exp["dapo.overlong_buffer.length"] = raw[f"{root}.len"]
    if raw.get(f"{A}.use_dynamic_bsz") is True:
        # the budget is per CP rank: x Megatron CP (megatron_actor.py) or x the Ulysses
        # size of an FSDP worker (dp_actor.py)
        cp = raw.get(
            f"{M}.context_parallel_size", raw.get(f"{A}.ulysses_sequence_parallel_size", 1)
        )
        # verl's default budget: 16384 (_generated_ppo_megatron_trainer.yaml)
        budget = raw.get(f"{A}.ppo_max_token_len_per_gpu", 16384)
        exp["policy.max_tokens_per_microbatch"] = budget * cp
    elif f"{A}.ppo_micro_batch_size_per_gpu" in raw:
        exp["policy.train_micro_batch_size"] = raw[f"{A}.ppo_micro_batch_size_per_gpu"]
    if _dapo_math(raw):
        del exp["dapo.max_num_epochs"]
        steps = _dapo_math_steps(raw, exp["dapo.num_prompts_per_step"])
        if steps is not None:
            exp["dapo.max_num_steps"] = steps
    return {k: v for k, v in exp.items() if not (isinstance(v, str) and "${" in v)}


DAPO_MATH_ROWS = 1_791_700  # dapo-math-17k.parquet's rows, each problem ~100 times


def _dapo_math(raw: dict[str, Any]) -> bool:
    """prepare_dapo_data.sh's DAPO-Math-17k file, read whole by verl's RLHFDataset."""
    train = raw.get("data.train_files")
    return isinstance(train, str) and train.rsplit("/", 1)[-1] == "dapo-math-17k.parquet"


def _dapo_math_steps(raw: dict[str, Any], prompts: int) -> int | None:
    """Ours reads each problem once, so total_epochs E over verl's 1,791,700 rows is kept
    out when the step cap S (none: unbounded) surely ends the run first, S x prompts x
    rounds <= E x rows (rounds: max_num_gen_batches x gen_batch_size / train_batch_size
    with filter_groups on, else 1); else without filtering written as min(S, E x (rows //
    prompts)) steps (the dataloader's drop_last); else refused (None)."""
    epochs, steps = raw.get("trainer.total_epochs", 30), raw.get("trainer.total_training_steps")
    rounds = 1.0
    if raw.get("algorithm.filter_groups.enable") is True:
        gen = raw.get("data.gen_batch_size", raw["data.train_batch_size"])
        rounds = raw["algorithm.filter_groups.max_num_gen_batches"] * max(
            1.0, gen / raw["data.train_batch_size"]
        )
    if steps is not None and steps * prompts * rounds <= epochs * DAPO_MATH_ROWS:
        return steps
    if rounds == 1.0:
        passes = epochs * (DAPO_MATH_ROWS // prompts)
        return passes if steps is None else min(steps, passes)
    return None


@pytest.mark.parametrize("name", sorted(OUTCOMES))
def test_each_file_values(name):
    raw = _script(name)
    result = translate("verl", read_source(DATA / name, {"HOME": HOME}))
    got = {s.key: s.value for s in result.settings}
    skipped = {s.key for s in result.skipped}
    for s in result.blocking:  # every refusal names what differs, never "unknown"
        assert "not in the importer's table" not in s.reason, (s.key, s.reason)
        assert "no counterpart here" not in s.reason, (s.key, s.reason)
    for key, value in _ours(raw).items():
        assert key in got, key
        assert got[key] == value, (key, got[key], value)
    if _dapo_math(raw):  # an epoch of ours is not one of verl's
        assert "dapo.max_num_epochs" not in got
        if _dapo_math_steps(raw, got["dapo.num_prompts_per_step"]) is None:
            assert "trainer.total_epochs" in {s.key for s in result.blocking}
    # a warm-up of N trainer steps is carried as N with our scheduler stepping per trainer
    # step (policy.scheduler.unit train_step), whatever the optimizer steps per step
    warm = raw.get(f"{A}.optim.lr_warmup_steps")
    if isinstance(warm, int) and warm > 0 and f"{A}.optim.lr_warmup_steps" not in skipped:
        assert got["policy.scheduler.lr_warmup_steps"] == warm
        assert got["policy.scheduler.unit"] == "train_step"


@pytest.mark.parametrize("name", sorted(OUTCOMES))
def test_each_file_outcome(name, tmp_path, capsys):
    out = tmp_path / "recipe.yaml"
    code = import_main(
        ["--from", "verl", str(DATA / name), "-o", str(out), "--shell-var", f"HOME={HOME}"]
    )
    console = capsys.readouterr()
    features = OUTCOMES[name]
    if not features or name in PLANS_WITHOUT:
        assert code == 0 and out.is_file(), console.err
    else:
        # A refusal that changes what is learned writes nothing; layout-only ones write the
        # recipe and stop at its validation or plan (import_config.py main)
        assert code == 2, console.out
    for feature in features:  # the summary names each untranslated key's feature
        assert feature in console.out + console.err, (feature, console.out, console.err)


def test_dapo_math_run_lengths_by_hand():
    """total_epochs over dapo-math-17k.parquet (1,791,700 rows), read by eye: 10 epochs of
    96 prompts, no step cap: 10 x 18663 steps (96 x 18663 = 1,791,648); 10 epochs, 200
    steps of 512: 102,400 prompts fit, the steps end it; 1 epoch of 512 with filter_groups
    on and no step cap: refused."""
    for name, want in (
        ("run_deepseek671b_math_megatron_96gb.sh", 186_630),
        ("test_dapo_7b_math.sh", 200),
        ("run_dapo_early_qwen2.5_32b.sh", 3499),
    ):
        raw = _script(name)
        assert (
            _dapo_math(raw)
            and _dapo_math_steps(raw, _ours(raw)["dapo.num_prompts_per_step"]) == want
        )
    raw = _script("run_dapo_qwen2.5_32b.sh")
    assert _dapo_math_steps(raw, 512) is None
