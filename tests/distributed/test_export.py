"""dapo-export: Hugging Face checkpoints from Megatron dist checkpoints (export_hf, export_launch).

A tiny random Qwen2 (tied embeddings, q/k/v bias, char tokenizer) is trained for one step at
TP2 (distributed optimizer), checkpointed, and exported with the ``dapo-export`` CLI (which
starts TP2 ranks from the checkpoint's marker). The export must

* load with ``AutoModelForCausalLM.from_pretrained`` and give the trained policy's own
  logprobs (fp32, <= 1e-5), with its tokenizer, token ids and generation config;
* hold exactly (bit for bit) the policy's weights, as does ``export_policy`` on the live
  policy (the hook for the end of a run), here written in small shards with an index;
* re-import: a MegatronPolicy built from the (sharded) export at PP2 exports the same
  tensors bit-exactly. That policy trains one more step, saves at PP2, and that checkpoint
  is exported at TP2 (``--tp 2 --pp 1``, another layout than saved), checked the same way.

The user errors (missing or incomplete checkpoint, non-empty output, no config) are checked
without starting any rank, as are the HF configs (Qwen2, Llama 3.1), a Llama written by the
export's writer, and the shard writer.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from launch import run_distributed

from dapo_megatron.config.loader import load_config
from dapo_megatron.config.parallel import ParallelDims
from dapo_megatron.shared.batch import PolicyBatch

pytestmark = pytest.mark.distributed

REPO = Path(__file__).resolve().parents[2]
RECIPE = REPO / "recipes" / "dapo-tiny-cpu.yaml"
B, S, VOCAB = 4, 12, 90
ATOL = 1e-5
SMALL_SHARD = 40_000
"""Bytes per shard of the live export: the tiny model (~0.1 MB) spans several shards."""
TP2 = ParallelDims(tp=2, pp=1, cp=1, dp=1, sequence_parallel=False)
PP2 = ParallelDims(tp=1, pp=2, cp=1, dp=1, sequence_parallel=False)


def _overrides(model_dir: Path, *, distributed_optimizer: bool = False) -> list[str]:
    return [
        f"policy.model_name_or_path={model_dir}",
        "policy.model_arch=null",
        "policy.init_model_if_missing=false",
        "policy.precision=fp32",
        "policy.optimizer.name=adam",
        "policy.optimizer.lr=0.01",
        "policy.optimizer.min_lr=0.0",
        "policy.optimizer.weight_decay=0.0",
        "policy.optimizer.clip_grad=0.0",
        "policy.scheduler.lr_warmup_steps=0",
        "policy.scheduler.lr_decay_style=constant",
        "policy.train_micro_batch_size=2",
        "policy.logprob_micro_batch_size=2",
        "generation.temperature=1.0",
        f"policy.megatron.use_distributed_optimizer={str(distributed_optimizer).lower()}",
    ]


def _config(model_dir: Path, **kwargs):
    return load_config(RECIPE, _overrides(model_dir, **kwargs), validate=False).config


def _batch() -> PolicyBatch:
    gen = torch.Generator().manual_seed(3)
    input_ids = torch.randint(0, VOCAB, (B, S), generator=gen)
    loss_mask = torch.zeros(B, S)
    loss_mask[:, 3:] = 1.0
    return PolicyBatch(input_ids=input_ids, loss_mask=loss_mask)


def _read_export(directory: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    tensors: dict[str, torch.Tensor] = {}
    for path in sorted(directory.glob("*.safetensors")):
        tensors.update(load_file(path))
    return tensors


def _assert_same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert set(a) == set(b), (sorted(a), sorted(b))
    for name in a:
        assert a[name].dtype == b[name].dtype and torch.equal(a[name], b[name]), name


# --------------------------------------------------------------------------- rank side


def _train_save(
    model_dir: Path,
    run_dir: Path,
    dims: ParallelDims,
    batch: PolicyBatch,
    live_dir: Path | None,
    distributed_optimizer: bool,
) -> dict:
    """One rank: the weights as loaded from ``model_dir``, one SFT step, the logprobs, a
    checkpoint; with ``live_dir``, the live export of the trained weights (and a refused
    second one)."""
    import torch.distributed as dist

    from dapo_megatron.config.run_plan import policy_plan
    from dapo_megatron.megatron.export_hf import ExportError, export_policy
    from dapo_megatron.megatron.policy import MegatronPolicy

    config = _config(model_dir, distributed_optimizer=distributed_optimizer)
    policy = MegatronPolicy(policy_plan(config, dims))
    loaded = dict(policy.export_weights())
    policy.sft_step(batch, lr=0.01)
    lp, _ = policy.logprobs(batch)
    checkpoint = policy.save(run_dir / "checkpoints", step=1, extra_state={})
    refused = None
    if live_dir is not None:
        export_policy(policy, live_dir, max_shard_size=SMALL_SHARD)
        try:  # again: refused on every rank (no rank left waiting), nothing overwritten
            export_policy(policy, live_dir)
        except ExportError as e:
            refused = str(e)
    trained = dict(policy.export_weights())
    rank = dist.get_rank()
    policy.shutdown()
    if rank != 0:
        return {"refused": refused}
    return {
        "loaded": loaded,
        "trained": trained,
        "lp": lp,
        "checkpoint": checkpoint,
        "refused": refused,
    }


# -------------------------------------------------------------------------- test side


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random tiny Qwen2 with the char tokenizer (tied embeddings, q/k/v bias)."""
    import transformers

    from dapo_megatron.data.tokenizer import build_char_tokenizer, save_char_tokenizer

    tokenizer = build_char_tokenizer(model_max_length=64)
    config = transformers.Qwen2Config(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        rope_theta=10000.0,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(0)
    model = transformers.Qwen2ForCausalLM(config)
    with torch.no_grad():
        for name, param in model.named_parameters():
            param.copy_(
                1.0 + 0.2 * torch.randn_like(param)
                if name.endswith("norm.weight")
                else 0.1 * torch.randn_like(param)
            )
    hf_dir = tmp_path_factory.mktemp("base") / "qwen2"
    model.save_pretrained(hf_dir)
    save_char_tokenizer(tokenizer, hf_dir)
    return hf_dir


def _hf_logprobs(model_dir: Path, input_ids: torch.Tensor) -> torch.Tensor:
    """Token-aligned fp32 logprobs of the HF model at ``model_dir`` (position 0 is 0)."""
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(
        model_dir, attn_implementation="eager"
    )
    assert next(model.parameters()).dtype == torch.float32
    with torch.no_grad():
        logp = torch.log_softmax(model(input_ids).logits[:, :-1].float(), dim=-1)
    lp = logp.gather(-1, input_ids[:, 1:, None]).squeeze(-1)
    return torch.cat([torch.zeros(input_ids.shape[0], 1), lp], dim=1)


def _cli_export(
    checkpoint: Path, out: Path, model_dir: Path, *flags: str, distributed_optimizer: bool = False
) -> None:
    from dapo_megatron.cli import export_main

    argv = ["--checkpoint", str(checkpoint), "--out", str(out), "--config", str(RECIPE), *flags]
    assert (
        export_main([*argv, *_overrides(model_dir, distributed_optimizer=distributed_optimizer)])
        == 0
    )


def _check_export(out: Path, result: dict, batch: PolicyBatch, base_dir: Path) -> None:
    """HF logits == the policy's, tensors == the policy's, config and tokenizer in place."""
    import transformers

    assert {
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
        "generation_config.json",
    } <= {p.name for p in out.iterdir()}
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["Qwen2ForCausalLM"] and config["tie_word_embeddings"]
    base_config = json.loads((base_dir / "config.json").read_text())
    for key in ("bos_token_id", "eos_token_id", "pad_token_id"):
        assert config[key] == base_config[key], key
    _assert_same(_read_export(out), result["trained"])
    lp_diff = (_hf_logprobs(out, batch.input_ids) - result["lp"]).abs().max().item()
    print(f"[{out.name}] max |HF logprob - policy logprob| = {lp_diff:.2e}")
    assert lp_diff <= ATOL
    tokenizer = transformers.AutoTokenizer.from_pretrained(out)
    assert tokenizer.decode(tokenizer("1+2=3")["input_ids"], skip_special_tokens=True) == "1+2=3"


def test_export_matches_policy_and_reimports(base: Path, tmp_path: Path) -> None:
    batch = _batch()
    # 1. TP2: train, checkpoint, live export (sharded); then the CLI export of the checkpoint.
    live = tmp_path / "live-tp2"
    ranks = run_distributed(
        _train_save, TP2.world_size, base, tmp_path / "run-tp2", TP2, batch, live, True, timeout=300
    )
    tp2 = ranks[0]
    for rank in ranks:
        assert rank["refused"] and f"output directory {live} exists" in rank["refused"]
    assert any(not torch.equal(tp2["loaded"][k], tp2["trained"][k]) for k in tp2["loaded"])
    shards = sorted(p.name for p in live.glob("*.safetensors"))
    assert len(shards) > 1 and (live / "model.safetensors.index.json").is_file(), shards
    _assert_same(_read_export(live), tp2["trained"])
    out = tmp_path / "hf-tp2"
    _cli_export(tp2["checkpoint"], out, base, distributed_optimizer=True)
    _check_export(out, tp2, batch, base)
    assert [p.name for p in tmp_path.iterdir() if ".tmp-" in p.name] == []

    # 2. Re-import the sharded live export at PP2: the same tensors, bit for bit. Then one
    # more step there, and the PP2 checkpoint's CLI export at TP2.
    pp2 = run_distributed(
        _train_save,
        PP2.world_size,
        live,
        tmp_path / "run-pp2",
        PP2,
        batch,
        None,
        False,
        timeout=300,
    )[0]
    _assert_same(pp2["loaded"], _read_export(live))
    out = tmp_path / "hf-pp2"
    _cli_export(pp2["checkpoint"], out, live, "--tp", "2", "--pp", "1")
    _check_export(out, pp2, batch, live)


# --------------------------------------------------------------------- no ranks needed


def test_cli_errors_name_the_path_and_the_fix(tmp_path: Path, capsys) -> None:
    from dapo_megatron.cli import export_main

    root = tmp_path / "run" / "checkpoints"
    complete = root / "step_000002"
    complete.mkdir(parents=True)
    (complete / "complete.json").write_text(json.dumps({"step": 2, "layout": {"tp": 1, "pp": 1}}))
    incomplete = root / "step_000004"
    incomplete.mkdir()
    (incomplete / "common.pt").write_bytes(b"")

    def error(*argv: str) -> str:
        assert export_main(list(argv)) == 2
        err = capsys.readouterr().err
        assert err.startswith("error: ") and err.count("\n") == 1 and "Traceback" not in err
        return err

    err = error("--checkpoint", str(incomplete), "--out", str(tmp_path / "o"))
    assert f"{incomplete} is not a complete checkpoint (no readable complete.json" in err
    assert f"export the latest complete one, {complete}" in err
    err = error("--checkpoint", str(root / "step_000009"), "--out", str(tmp_path / "o"))
    assert f"checkpoint directory {root / 'step_000009'} does not exist" in err
    full = tmp_path / "full"
    full.mkdir()
    (full / "x").write_text("")
    err = error("--checkpoint", str(complete), "--out", str(full))
    assert f"output directory {full} exists and is not empty" in err
    err = error("--checkpoint", str(complete), "--out", str(tmp_path / "o"))
    assert "--config is required" in err and "config.yaml" in err
    err = error(
        "--checkpoint",
        str(complete),
        "--out",
        str(tmp_path / "o"),
        "--config",
        str(RECIPE),
        f"policy.model_name_or_path={tmp_path / 'nothing'}",
    )
    assert "policy.model_name_or_path" in err and "config.json not found" in err
    # Without --config: the run directory's config.yaml (a dump of the resolved config).
    import dataclasses

    import yaml

    saved = _config(tmp_path / "from-run-dir")
    (tmp_path / "run" / "config.yaml").write_text(yaml.safe_dump(dataclasses.asdict(saved)))
    err = error("--checkpoint", str(complete), "--out", str(tmp_path / "o"))
    assert f"{tmp_path / 'from-run-dir' / 'config.json'} not found" in err
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize(
    "preset",
    ["tiny-qwen2", "qwen2.5-7b", "llama-3.1-8b", "qwen3-8b", "tiny-qwen3", "qwen3-30b-a3b"],
)
def test_hf_config_reads_back_as_the_arch(preset: str) -> None:
    from dapo_megatron.config.model_arch import PRESETS, arch_from_hf_config
    from dapo_megatron.megatron.export_hf import hf_config

    arch = PRESETS[preset]
    config = hf_config(arch, dtype=torch.bfloat16, base_config={"eos_token_id": [7, 8]})
    as_json = json.loads(config.to_json_string())
    assert arch_from_hf_config(as_json, preset) == arch
    assert as_json["eos_token_id"] == [7, 8] and as_json["dtype"] == "bfloat16"
    family = {
        "qwen2": "Qwen2ForCausalLM",
        "llama": "LlamaForCausalLM",
        "qwen3": "Qwen3ForCausalLM",
        "qwen3_moe": "Qwen3MoeForCausalLM",
    }[arch.family]
    assert as_json["architectures"] == [family]


def test_hf_config_refuses_what_hf_cannot_express() -> None:
    import dataclasses

    from dapo_megatron.config.model_arch import PRESETS
    from dapo_megatron.megatron.export_hf import ExportError, hf_config

    with pytest.raises(ExportError, match="Llama with q/k/v bias"):
        hf_config(dataclasses.replace(PRESETS["llama-3.1-8b"], add_qkv_bias=True))
    with pytest.raises(ExportError, match="'gpt2' has no Hugging Face export"):
        hf_config(dataclasses.replace(PRESETS["tiny-qwen2"], family="gpt2"))


def test_shard_writer_splits_like_save_pretrained(tmp_path: Path) -> None:
    from dapo_megatron.megatron.export_hf import INDEX_FILE, ShardWriter

    fused = torch.arange(24, dtype=torch.float32).view(2, 3, 4)
    tensors = {
        "a": torch.ones(10),  # 40 bytes
        "b": fused[0],  # views of one buffer: written as separate tensors
        "c": fused[1],
        "big": torch.zeros(100),  # over the limit alone: a shard of its own
        "d": torch.full((3,), 2.0, dtype=torch.bfloat16),
    }
    writer = ShardWriter(tmp_path, max_shard_size=100)
    for name, tensor in tensors.items():
        writer.add(name, tensor)
    files = writer.finish()
    # [a, b] (88 bytes), [c] (c + big > 100), [big], [d]
    assert files == [f"model-0000{i}-of-00004.safetensors" for i in (1, 2, 3, 4)] + [INDEX_FILE]
    index = json.loads((tmp_path / INDEX_FILE).read_text())
    assert index["metadata"]["total_size"] == 40 + 48 + 48 + 400 + 6
    assert index["weight_map"] == {
        "a": files[0],
        "b": files[0],
        "c": files[1],
        "big": files[2],
        "d": files[3],
    }
    _assert_same(_read_export(tmp_path), tensors)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(files)

    single = tmp_path / "single"
    single.mkdir()
    writer = ShardWriter(single)
    writer.add("a", tensors["a"])
    assert writer.finish() == ["model.safetensors"]
    with pytest.raises(ValueError, match="already written"):
        writer.add("a", tensors["a"])


def test_llama_export_loads_in_hf(tmp_path: Path) -> None:
    """A Llama 3.1-style model (untied, llama3 RoPE scaling, no bias) written by the export's
    writer and config reloads in HF with identical logits and the same ModelArch."""
    import dataclasses

    import transformers

    from dapo_megatron.config.model_arch import PRESETS, arch_from_hf_config
    from dapo_megatron.data.tokenizer import build_char_tokenizer, save_char_tokenizer
    from dapo_megatron.megatron.export_hf import hf_config, write_hf_checkpoint

    arch = dataclasses.replace(
        PRESETS["llama-3.1-8b"],
        num_layers=2,
        hidden_size=32,
        ffn_hidden_size=64,
        num_attention_heads=4,
        num_query_groups=2,
        vocab_size=VOCAB,
        max_position_embeddings=16384,
    )
    tokenizer_dir = tmp_path / "tokenizer"
    save_char_tokenizer(build_char_tokenizer(model_max_length=64), tokenizer_dir)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(hf_config(arch, dtype=torch.float32)).eval()
    out = write_hf_checkpoint(
        model.state_dict().items(), tmp_path / "llama", arch=arch, tokenizer_dir=tokenizer_dir
    )
    assert arch_from_hf_config(json.loads((out / "config.json").read_text()), "export") == arch
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    assert type(reloaded) is transformers.LlamaForCausalLM
    ids = _batch().input_ids
    with torch.no_grad():
        assert torch.equal(model(ids).logits, reloaded(ids).logits)
