"""Every SkyRL script in tests/data/foreign/skyrl (SOURCES.md there): its outcome, and the
run-changing values it carries, against the script's own text.

The expected values come from an independent reading of each script (`script_overrides`
below: its `NAME=value` lines and `key=value` Hydra overrides, with SkyRL's dataclass
defaults of skyrl/train/config/config.py at a9564572 where a script omits a key), never
from the importer. A file either plans (exit 0 and dapo-plan says it fits) or exits 2
naming each feature dapo-megatron lacks: refused (nothing written), or, where only layout
or memory keys are untranslated, written but not valid (WRITTEN_INVALID).

GSM8K: the scripts train on the files examples/train/gsm8k/gsm8k_dataset.py writes (each
script's header runs it with --output_dir $HOME/data/gsm8k): openai/gsm8k (config main),
its train split as train.parquet and its test split as validation.parquet, each question
followed by " " and the instruction below; env_class gsm8k scores with
skyrl-gym/skyrl_gym/envs/gsm8k/utils.py compute_score (method strict: the first `#### N`).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from dapo_megatron.config import load_config
from dapo_megatron.data.prompt_template import apply_prompt_template
from dapo_megatron.data.records import PromptRecord
from dapo_megatron.migrate.foreign_source import read_source
from dapo_megatron.migrate.import_config import lacking_features, translate
from dapo_megatron.migrate.import_config import main as import_main
from dapo_megatron.migrate.plan_check import check_plan

DATA = Path(__file__).resolve().parents[2] / "data" / "foreign" / "skyrl"
HOME = "/home/u"

# -- an independent reader of a SkyRL launch script --------------------------------------

_VAR = re.compile(r"^(?:export\s+)?([A-Za-z_]\w*)=(.*)$")
_DEFAULT = re.compile(r'^: "\$\{(\w+):=([^}]*)\}"$')  # : "${NAME:=default}"
_OVERRIDE = re.compile(r"^\+{0,2}([a-z_][\w]*(?:\.[\w]+)+)=(.*)$")


def _expand(text: str, env: dict[str, str]) -> str:
    text = re.sub(r"\s+#.*$", "", text.strip())
    for _ in range(4):
        text = re.sub(r"\$\{(\w+):-\"?([^}\"]*)\"?\}", lambda m: env.get(m[1], m[2]), text)
        text = re.sub(r"\$\{(\w+)\}", lambda m: env.get(m[1], m[0]), text)
        text = re.sub(r"\$(\w+)", lambda m: env.get(m[1], m[0]), text)
    text = text.replace('"', "").replace("'", "")
    arith = re.fullmatch(r"\$\(\((.*)\)\)", text)
    if arith:
        expr = re.sub(r"[A-Za-z_]\w*", lambda m: env.get(m[0], m[0]), arith[1])
        text = str(eval(expr, {"__builtins__": {}}))  # e.g. 1024 * 4
    return text


def script_overrides(name: str) -> dict[str, str]:
    """The script's Hydra overrides, key -> value text, its shell variables substituted."""
    env = {"HOME": HOME}
    out: dict[str, str] = {}
    for raw in (DATA / name).read_text().splitlines():
        line = raw.strip().removesuffix("\\").strip()
        if not line or line.startswith("#"):
            continue
        m = _OVERRIDE.match(line)
        if m:
            out[m[1]] = _expand(m[2], env)
            continue
        m = _VAR.match(line) or _DEFAULT.match(line)
        if m and (m.re is _VAR or m[1] not in env):
            env[m[1]] = _expand(m[2], env)
    return out


def _num(text: str) -> Any:
    if text in ("true", "True"):
        return True
    if text in ("false", "False"):
        return False
    try:
        return int(text)
    except ValueError:
        return float(text)


# SkyRL's defaults (config.py dataclasses) for the keys each file is checked on.
DEFAULTS = {
    "trainer.policy.megatron_config.tensor_model_parallel_size": "1",
    "trainer.policy.megatron_config.pipeline_model_parallel_size": "1",
    "trainer.policy.megatron_config.context_parallel_size": "1",
    "trainer.policy.megatron_config.expert_model_parallel_size": "1",
    "trainer.placement.policy_num_nodes": "1",
    "trainer.placement.policy_num_gpus_per_node": "1",
    "trainer.train_batch_size": "1024",
    "trainer.policy_mini_batch_size": "256",
    "trainer.micro_train_batch_size_per_gpu": "1",
    "generator.n_samples_per_prompt": "5",
    "trainer.policy.optimizer_config.lr": "1e-6",
    "trainer.policy.optimizer_config.num_warmup_steps": "0",
    "trainer.algorithm.eps_clip_low": "0.2",
    "trainer.algorithm.eps_clip_high": "0.2",
    "trainer.max_prompt_length": "512",
    "generator.sampling_params.max_generate_length": "1024",
    "generator.inference_engine.tensor_parallel_size": "1",
    # DataConfig: [os.path.expanduser("~/data/gsm8k/...")]; EnvironmentConfig.env_class
    "data.train_data": f"[{HOME}/data/gsm8k/train.parquet]",
    "data.val_data": f"[{HOME}/data/gsm8k/validation.parquet]",
    "environment.env_class": "gsm8k",
}

# gsm8k_dataset.py, copied: instruction_following, and the file each split is written to
GSM8K_INSTRUCTION = 'Let\'s think step by step and output the final answer after "####".'
GSM8K_SPLITS = {"train.parquet": "train", "validation.parquet": "test"}
GSM8K_DIR = f"{HOME}/data/gsm8k"  # its --output_dir, as the scripts' headers run it


def expected(name: str) -> dict[str, Any]:
    """Our values, derived from the script text alone."""
    ov = {**DEFAULTS, **script_overrides(name)}
    meg = "trainer.policy.megatron_config"
    tp = _num(ov[f"{meg}.tensor_model_parallel_size"])
    n = _num(ov["generator.n_samples_per_prompt"])
    out: dict[str, Any] = {
        "policy.megatron.tensor_model_parallel_size": tp,
        "policy.megatron.pipeline_model_parallel_size": _num(
            ov[f"{meg}.pipeline_model_parallel_size"]
        ),
        "policy.megatron.context_parallel_size": _num(ov[f"{meg}.context_parallel_size"]),
        "policy.megatron.expert_model_parallel_size": _num(ov[f"{meg}.expert_model_parallel_size"]),
        # megatron_worker.py: sequence_parallel = TP > 1 (Megatron strategy)
        "policy.megatron.sequence_parallel": tp > 1 and ov.get("trainer.strategy") == "megatron",
        "cluster.num_nodes": _num(ov["trainer.placement.policy_num_nodes"]),
        "cluster.gpus_per_node": _num(ov["trainer.placement.policy_num_gpus_per_node"]),
        "dapo.num_prompts_per_step": _num(ov["trainer.train_batch_size"]),
        "dapo.num_generations_per_prompt": n,
        "policy.train_global_batch_size": _num(ov["trainer.policy_mini_batch_size"]) * n,
        "policy.train_micro_batch_size": _num(ov["trainer.micro_train_batch_size_per_gpu"]),
        "policy.optimizer.lr": float(ov["trainer.policy.optimizer_config.lr"]),
        "policy.scheduler.lr_warmup_steps": _num(
            ov["trainer.policy.optimizer_config.num_warmup_steps"]
        ),
        "dapo.loss.clip_ratio_low": float(ov["trainer.algorithm.eps_clip_low"]),
        "dapo.loss.clip_ratio_high": float(ov["trainer.algorithm.eps_clip_high"]),
        "data.max_prompt_length": _num(ov["trainer.max_prompt_length"]),
        "generation.max_response_length": _num(ov["generator.sampling_params.max_generate_length"]),
        "generation.engine.tensor_parallel_size": _num(
            ov["generator.inference_engine.tensor_parallel_size"]
        ),
    }
    if ov.get("trainer.placement.colocate_all") in ("false", "False"):
        # engines on GPUs of their own: num_engines x engine TP beside the policy's (one node)
        engines = _num(ov.get("generator.inference_engine.num_engines", "1"))
        engine_gpus = engines * out["generation.engine.tensor_parallel_size"]
        out["cluster.gpus_per_node"] += engine_gpus
        out["cluster.generation_num_devices"] = engine_gpus
    out["policy.max_total_sequence_length"] = (
        out["data.max_prompt_length"] + out["generation.max_response_length"]
    )
    ds = ov.get("trainer.algorithm.dynamic_sampling.type")
    out["dapo.dynamic_sampling.enabled"] = ds == "filter"
    if ds == "filter":  # trainer_utils.py handle_filter_sampling truncates: surplus dropped
        out["dapo.dynamic_sampling.surplus"] = "discard"
        out["dapo.dynamic_sampling.max_gen_batches"] = _num(
            ov.get("trainer.algorithm.dynamic_sampling.max_sample_batches", "30")
        )
    length = ov.get(
        "trainer.algorithm.overlong_buffer_len", ov.get("trainer.algorithm.overlong_buffer.len")
    )
    out["dapo.overlong_buffer.enabled"] = length is not None
    if length is not None:
        out["dapo.overlong_buffer.length"] = _num(length)
    if "generator.apply_overlong_filtering" in ov:
        out["dapo.overlong_filtering"] = _num(ov["generator.apply_overlong_filtering"])
    red = ov.get("trainer.algorithm.loss_reduction", "token_mean")
    micro = out["policy.train_micro_batch_size"]
    agg = {"token_mean": "token-mean", "sequence_mean": "seq-mean-token-mean"}.get(red)
    if red == "token_mean_legacy" and micro == 1:
        agg = "seq-mean-token-mean"  # a token mean per one-sample slice, averaged
    if agg is not None:
        out["dapo.loss.loss_agg_mode"] = agg
    for skyrl_key, ours in (
        ("data.train_data", "data.train_path"),
        ("data.val_data", "data.val_path"),
    ):
        folder, _, file = ov[skyrl_key].strip("[]").rpartition("/")
        if folder == GSM8K_DIR and file in GSM8K_SPLITS:
            out[ours] = f"hf://openai/gsm8k:{GSM8K_SPLITS[file]}"
            out["data.format"] = "gsm8k"
            # question_raw + " " + instruction_following, as a str.format template
            out["data.prompt_template"] = "{} " + GSM8K_INSTRUCTION.replace("{", "{{").replace(
                "}", "}}"
            )
    if ov["environment.env_class"] == "gsm8k":
        out["reward.verifier"] = "gsm8k_skyrl"  # envs/gsm8k/utils.py: strict, first `#### N`
    return out


# -- the outcomes, file by file (read from each script: its model, LoRA, strategy, ...) ----

PLANS = ["run_megatron_dapo_qwen3_4b.sh"]

LEGACY = "SkyRL's token_mean_legacy"
KL = "a KL term averaged per sequence"
ETP = "an expert tensor-parallel size (1) apart from TP"
VLM = "a vision-language checkpoint trained as text only"
PAO = "a precision-aware optimizer"
REFUSED: dict[str, tuple[str, ...]] = {
    "fully_async_run_gsm8k_megatron_lora.sh": (
        "LoRA", KL, "SkyRL's rollout_is policy loss", "SkyRL's fully asynchronous training",
    ),
    "run_dapo_gsm8k.sh": (LEGACY, "fsdp training"),
    "run_dapo_qwen2.5_32b_aime.sh": (LEGACY, "Ulysses sequence parallelism", "fsdp training"),
    "run_dapo_qwen2.5_math_7b_aime.sh": (LEGACY, "fsdp training"),
    "run_dapo_qwen3_1.7b_aime.sh": (LEGACY, "fsdp training"),
    "run_dapo_qwen3_30b_a3b_lora_megatron_aime.sh": (LEGACY, "LoRA", ETP),
    "run_dapo_qwen3_30b_a3b_megatron_aime.sh": (LEGACY, ETP),
    "run_megatron.sh": (KL,),
    "run_megatron_dapo_mimo_7b_rl.sh": ("the MiMo architecture",),
    "run_megatron_dapo_mimo_7b_rl_specdecode.sh": ("the MiMo architecture", "multi-token prediction"),
    "run_megatron_dapo_qwen3.5_35b_a3b.sh": ("the Qwen3.5 architecture", VLM, ETP, PAO),
    "run_megatron_dapo_qwen3.5_9b.sh": ("the Qwen3.5 architecture",),
    "run_megatron_dapo_qwen3.5_9b_specdecode.sh": ("the Qwen3.5 architecture", "multi-token prediction"),
    "run_megatron_dapo_qwen3.6_27b_lora.sh": ("2 data files", "the Qwen3.6 architecture", VLM, "LoRA", PAO),
    "run_megatron_dapo_qwen3.6_35b_a3b_lora.sh": ("the Qwen3.6 architecture", VLM, "LoRA", ETP, PAO),
    "run_megatron_dapo_qwen3.6_35b_a3b_lora_int4_qat.sh": ("the Qwen3.6 architecture", VLM, "LoRA", ETP, PAO),
    "run_megatron_dapo_qwen3_235b_a22b_lora.sh": ("LoRA", ETP, PAO, "an uneven pipeline split"),
    "run_megatron_dapo_qwen3_30b_a3b.sh": (ETP,),
    "run_megatron_dapo_qwen3_30b_a3b_lora.sh": ("LoRA", ETP),
    "run_megatron_dapo_qwen3_4b_lora.sh": ("LoRA",),
    "run_megatron_grpo_glm4_7_30b.sh": ("the GLM architecture", "a router override"),
    "run_megatron_lora_qwen3-0.6b.sh": ("LoRA", KL),
    "run_megatron_lora_qwen3-30b-a3b.sh": ("LoRA", KL, ETP),
    "run_megatron_moonlight.sh": ("Moonlight", KL, ETP, "an uneven pipeline split"),
    "run_megatron_nemotron_mini_4b.sh": ("the Nemotron-H hybrid Mamba architecture", KL),
    "run_megatron_qwen3-235b-a22b.sh": (ETP, PAO, "an uneven pipeline split"),
    "run_megatron_qwen3-30b-a3b.sh": (KL, ETP),
    "run_megatron_qwen3.5.sh": ("the Qwen3.5 architecture", VLM, KL),
    "run_megatron_qwen3.5_35b_a3b.sh": ("the Qwen3.5 architecture", VLM, ETP, PAO),
}  # fmt: skip
# Only layout keys untranslated: the recipe is written and fails validation (without
# SkyRL's expert TP of 1, the EP must divide the dense layers' DP x CP, and does not).
WRITTEN_INVALID = {"run_megatron_dapo_qwen3_30b_a3b.sh", "run_megatron_qwen3-235b-a22b.sh"}
GSM8K_FILES = [
    n
    for n in sorted(REFUSED)
    if "gsm8k_dataset.py --output_dir $HOME/data/gsm8k" in (DATA / n).read_text()
]


def test_every_script_has_an_outcome_and_a_source_row():
    files = sorted(p.name for p in DATA.glob("*.sh"))
    assert files == sorted([*PLANS, *REFUSED])
    sources = (DATA / "SOURCES.md").read_text()
    for name in files:
        assert f"| {name} |" in sources


def _import(tmp_path: Path, name: str) -> tuple[int, Path]:
    out = tmp_path / "r.yaml"
    argv = ["--from", "skyrl", str(DATA / name), "-o", str(out), "--shell-var", f"HOME={HOME}"]
    return import_main(argv), out


@pytest.mark.parametrize("name", PLANS)
def test_planned_scripts_import_and_fit(tmp_path, capsys, name):
    rc, out = _import(tmp_path, name)
    printed = capsys.readouterr()
    assert rc == 0, printed.err
    assert check_plan(out).fits is True
    assert "dapo-plan: " in printed.out and "memory: fits" in printed.out
    cfg = load_config(out)
    for key, value in expected(name).items():
        got = cfg.config
        for part in key.split("."):
            got = getattr(got, part)
        assert got == value, key


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_refused_scripts_name_each_missing_feature(tmp_path, capsys, name):
    """Exit 2, and each feature the file needs that we lack is named: the error names the
    first tier that stops the import (a model we cannot build, else the keys that change
    what is learned, else the recipe's validation), and the import's untranslated list
    (lacking_features of translate()) names every one. Nothing is written unless only
    layout keys are untranslated (WRITTEN_INVALID: written, named as not carried)."""
    out = tmp_path / "r.yaml"
    rc = import_main(
        ["--from", "skyrl", str(DATA / name), "-o", str(out), "--shell-var", f"HOME={HOME}"]
    )
    err = capsys.readouterr().err
    assert rc == 2, err
    result = translate("skyrl", read_source(DATA / name, {"HOME": HOME}))
    named = lacking_features(result.blocking)
    for feature in REFUSED[name]:
        assert feature in named, feature
    algorithm = [s for s in result.blocking if s.impact == "algorithm"]
    if "was not carried" not in err and algorithm:
        assert "nothing written" in err and not out.exists()
        assert lacking_features(algorithm) in err
    if name in WRITTEN_INVALID:
        assert not algorithm and out.exists() and "was written but does not validate" in err
        assert f"not carried: {named}" in err
    else:
        assert "nothing written" in err and not out.exists()
    assert "no counterpart here" not in named


@pytest.mark.parametrize("name", [*PLANS, *sorted(REFUSED)])
def test_carried_values_match_the_script(name):
    """What is carried equals the script's meaning, refused or not (a refused key carries
    nothing: it is absent, never our default)."""
    result = translate("skyrl", read_source(DATA / name, {"HOME": HOME}))
    got = {s.key: s.value for s in result.settings}
    refused = {s.key for s in result.skipped if s.blocking}
    for key, value in expected(name).items():
        if key == "dapo.loss.loss_agg_mode" and "trainer.algorithm.loss_reduction" in refused:
            continue
        if key in got:
            assert got[key] == value, key
        else:
            assert key in ("dapo.loss.loss_agg_mode",), key
    assert not [s for s in result.skipped if s.reason == "no counterpart here"]


def test_the_4b_dapo_script_reads_as_skyrl_runs_it():
    """run_megatron_dapo_qwen3_4b.sh by hand: TP4 PP2 (SP on, as SkyRL's worker sets it for
    TP > 1), 1 node x 8 GPUs colocated, 4 engines of TP2 at 0.8, DAPO data by name."""
    v = {
        s.key: s.value
        for s in translate(
            "skyrl", read_source(DATA / "run_megatron_dapo_qwen3_4b.sh", {"HOME": HOME})
        ).settings
    }
    assert v["policy.megatron.sequence_parallel"] is True
    assert (v["cluster.colocated"], v["generation.engine.num_engines"]) == (True, 4)
    assert v["generation.engine.gpu_memory_utilization"] == 0.8
    assert v["policy.megatron.recompute_granularity"] == "full"  # SkyRL's default kwargs
    assert v["data.train_path"] == "hf://BytedTsinghua-SIA/DAPO-Math-17k"
    assert v["data.val_path"] == "hf://BytedTsinghua-SIA/AIME-2024"
    assert (v["reward.verifier"], v["data.format"]) == ("math", "dapo_math")
    assert (v["validation.temperature"], v["validation.top_p"]) == (1.0, 0.7)
    assert v["dapo.loss.clip_ratio_c"] == 10.0  # policy_loss_type dual_clip
    assert v["generation.backend"] == "vllm"


def test_unresolved_home_refuses_the_model_path_but_not_the_dapo_data(tmp_path, capsys):
    """Without --shell-var HOME the DAPO files are still recognised by name; a model path
    under $HOME would be refused, never replaced by our default model."""
    result = translate("skyrl", read_source(DATA / "run_megatron_dapo_qwen3_4b.sh", {}))
    v = {s.key: s.value for s in result.settings}
    assert v["data.train_path"] == "hf://BytedTsinghua-SIA/DAPO-Math-17k"
    # $HOME only in the checkpoint and export paths (bookkeeping): it still plans
    script = str(DATA / "run_megatron_dapo_qwen3_4b.sh")
    assert import_main(["--from", "skyrl", script, "-o", str(tmp_path / "a.yaml")]) == 0
    assert "memory: fits" in capsys.readouterr().out
    local = (
        (DATA / "run_megatron_dapo_qwen3_4b.sh")
        .read_text()
        .replace('MODEL_NAME="Qwen/Qwen3-4B-Base"', 'MODEL_NAME="$HOME/models/Qwen3-4B-Base"')
    )
    src = tmp_path / "local.sh"
    src.write_text(local)
    rc = import_main(["--from", "skyrl", str(src), "-o", str(tmp_path / "r.yaml")])
    assert rc == 2 and "trainer.policy.model.path" in capsys.readouterr().err


def test_dynamic_sampling_filter_discards_the_surplus():
    """trainer_utils.py handle_filter_sampling keeps the first train_batch_size groups and
    drops the rest: never our default `carry`."""
    result = translate("skyrl", read_source(DATA / "run_dapo_gsm8k.sh", {"HOME": HOME}))
    v = {s.key: s.value for s in result.settings}
    assert (v["dapo.dynamic_sampling.surplus"], v["dapo.dynamic_sampling.batch_multiplier"]) == (
        "discard",
        1.0,
    )


@pytest.mark.parametrize(
    "micro, filtering, agg",
    [(1, False, "seq-mean-token-mean"), (2, False, None), (1, True, None)],
)
def test_token_mean_legacy_is_a_mean_per_micro_batch(micro, filtering, agg):
    """ppo_utils.py: token_mean_legacy normalises each slice of micro_train_batch_size_per_gpu
    samples by its own tokens and averages the slices: one-sample slices are sequences, but
    an overlong-filtered (all-masked) response still counts as a slice there, not here."""
    flat = {
        "trainer.strategy": "megatron",
        "trainer.algorithm.loss_reduction": "token_mean_legacy",
        "trainer.micro_train_batch_size_per_gpu": micro,
        "trainer.algorithm.use_kl_loss": False,
        "generator.apply_overlong_filtering": filtering,
    }
    result = translate("skyrl", flat)
    v = {s.key: s.value for s in result.settings}
    assert v.get("dapo.loss.loss_agg_mode") == agg


def test_an_omitted_key_takes_skyrls_default_never_ours():
    """A config that only picks the Megatron strategy: every key of ours that matters is
    SkyRL's default (config.py), or refused where that default needs what we lack (the KL
    loss averaged per sequence), except the run length (epochs x the dataset's batches).
    The default data (~/data/gsm8k/{train,validation}.parquet) and env_class gsm8k are
    gsm8k_dataset.py's files and the strict GSM8K reward."""
    result = translate("skyrl", {"trainer.strategy": "megatron"})
    v = {s.key: s.value for s in result.settings}
    assert result.kept_ours == ["dapo.max_num_steps"]
    assert (v["data.train_path"], v["data.val_path"]) == (
        "hf://openai/gsm8k:train",
        "hf://openai/gsm8k:test",
    )
    assert (v["data.format"], v["reward.verifier"]) == ("gsm8k", "gsm8k_skyrl")
    assert v["data.prompt_template"] == "{} " + GSM8K_INSTRUCTION
    assert v["policy.model_name_or_path"] == "Qwen/Qwen2.5-1.5B-Instruct"
    assert (v["dapo.num_prompts_per_step"], v["dapo.num_generations_per_prompt"]) == (1024, 5)
    assert v["policy.train_global_batch_size"] == 256 * 5
    assert (v["dapo.loss.clip_ratio_low"], v["dapo.loss.clip_ratio_high"]) == (0.2, 0.2)
    assert v["dapo.loss.clip_ratio_c"] is None  # policy_loss_type regular
    assert (v["policy.optimizer.weight_decay"], v["policy.scheduler.lr_warmup_steps"]) == (0.01, 0)
    assert (v["data.max_prompt_length"], v["generation.max_response_length"]) == (512, 1024)
    assert (v["dapo.dynamic_sampling.enabled"], v["dapo.overlong_buffer.enabled"]) == (False, False)
    assert v["validation.greedy"] is True  # no eval_sampling_params: temperature 0
    assert v["generation.engine.gpu_memory_utilization"] == 0.8
    refused = {s.key for s in result.skipped if s.blocking}
    assert refused == {"trainer.algorithm.use_kl_loss"}


def test_gsm8k_files_carry_the_dataset_scripts_prompt_and_strict_reward():
    """Each GSM8K script: its train/validation parquet are openai/gsm8k's train/test splits,
    each question + " " + the instruction, scored by the first `#### N` (gsm8k_skyrl)."""
    assert len(GSM8K_FILES) == 12
    for name in GSM8K_FILES:
        ov = script_overrides(name)
        assert ov["data.train_data"] == f"[{GSM8K_DIR}/train.parquet]", name
        assert ov["data.val_data"] == f"[{GSM8K_DIR}/validation.parquet]", name
        assert ov["environment.env_class"] == "gsm8k", name
        result = translate("skyrl", read_source(DATA / name, {"HOME": HOME}))
        v = {s.key: s.value for s in result.settings}
        assert v["data.train_path"] == "hf://openai/gsm8k:train", name
        assert v["data.val_path"] == "hf://openai/gsm8k:test", name
        assert (v["data.format"], v["reward.verifier"]) == ("gsm8k", "gsm8k_skyrl"), name
        assert v["data.prompt_template"] == "{} " + GSM8K_INSTRUCTION, name
        blocked = {s.key for s in result.blocking}
        assert not blocked & {"data.train_data", "data.val_data", "environment.env_class"}


@pytest.mark.parametrize(
    "question_raw",
    [
        "Natalia sold clips to 48 of her friends in April. How many clips did she sell?",
        "A set {1, 2} has {} braces, 50% of #### and a trailing space ",
        "Line one.\nLine two: $3.50 each?",
    ],
)
def test_the_carried_template_builds_gsm8k_dataset_pys_question(question_raw):
    """gsm8k_dataset.py process_fn: question = question_raw + " " + instruction_following,
    the row's one user message; ours: the template applied to the record's user message."""
    v = {
        s.key: s.value
        for s in translate("skyrl", read_source(DATA / "run_megatron.sh", {"HOME": HOME})).settings
    }
    instruction_following = 'Let\'s think step by step and output the final answer after "####".'
    question = question_raw + " " + instruction_following
    record = PromptRecord(question_raw, "72")
    assert apply_prompt_template(record.messages, v["data.prompt_template"]) == [
        {"role": "user", "content": question}
    ]
