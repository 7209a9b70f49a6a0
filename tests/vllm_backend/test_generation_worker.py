"""GenerationWorker with the vllm backend, in-process (no Ray): the worker a split-mode or
colocated-GPU run starts per engine, built from a run config.

Checks that the config reaches the engine (fp32 weights, the trainer's context length,
seed) and that the worker's refit path loads another model's weights: after
``update_weights`` with checkpoint B's tensors, greedy responses and logprobs are B's,
computed independently with HF transformers.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch
import transformers

from dapo_megatron.config.loader import load_config
from dapo_megatron.config.model_arch import PRESETS
from dapo_megatron.data.tiny_model import create_tiny_model
from dapo_megatron.shared.sampling import SamplingParams
from dapo_megatron.workers.generation_worker import GenerationWorker

REPO = Path(__file__).resolve().parents[2]
MAX_NEW = 8


def _hf_greedy(model_dir: Path, prompt: list[int]) -> tuple[list[int], list[float]]:
    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    ids, lps = list(prompt), []
    with torch.no_grad():
        for _ in range(MAX_NEW):
            logits = model(torch.tensor([ids])).logits[0, -1].double()
            token = int(logits.argmax())
            lps.append(float(torch.log_softmax(logits, -1)[token]))
            ids.append(token)
    return ids[len(prompt) :], lps


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("worker_models")
    # vLLM's CPU attention supports head sizes 32, 64, ...: the tiny preset's 16 is not.
    arch = dataclasses.replace(PRESETS["tiny-qwen2"], num_attention_heads=2, num_query_groups=1)
    dirs = {name: root / name for name in ("a", "b")}
    for seed, path in enumerate(dirs.values()):
        create_tiny_model(path, arch=arch, seed=seed)
    return dirs


def test_vllm_worker_generates_and_refits(models):
    plan = load_config(
        REPO / "recipes" / "dapo-tiny-cpu.yaml",
        [
            f"policy.model_name_or_path={models['a']}",
            "policy.model_arch=null",
            "policy.init_model_if_missing=false",
            "generation.backend=vllm",
            # The placement of a split-mode engine (colocated vLLM needs GPUs).
            "cluster.gpus_per_node=3",
            "cluster.colocated=false",
            "cluster.generation_num_devices=1",
        ],
    ).require_plan()
    worker = GenerationWorker(plan, engine_index=0)
    info = worker.setup()
    assert info["backend"] == "vllm"
    prompts = [[5, 9, 13, 7], [11, 4]]
    greedy = SamplingParams(top_k=1, max_tokens=MAX_NEW, stop_token_ids=[0], n=1, seed=1)
    try:
        for name in ("a", "b"):
            if name == "b":
                hf = transformers.AutoModelForCausalLM.from_pretrained(models["b"])
                worker.update_weights(list(hf.state_dict().items()))
            out = worker.generate(prompts, greedy)
            for prompt, (sample,) in zip(prompts, out, strict=True):
                tokens, lps = _hf_greedy(models[name], prompt)
                n = len(sample.response_token_ids)
                assert sample.response_token_ids == tokens[:n], name
                assert (
                    max(abs(a - b) for a, b in zip(sample.logprobs, lps[:n], strict=True)) < 1e-4
                ), name
    finally:
        worker.shutdown()
