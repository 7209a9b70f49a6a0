"""One DAPO step: our Ray + Megatron path vs a minimal single-process torch reference, CPU.

For each model (``tiny``: the main recipe's tiny-qwen2, 78K parameters; ``1m``: a Qwen2 of
4 layers, hidden 128, 1.0M parameters), in ONE run of this script, on the same random
weights (fp32) and the same workload (32 prompts x 8 samples, at most 8 response tokens,
the arithmetic task's prompts and verifier, one optimizer step per rollout batch):

  ours       ``dapo-train`` on recipes/dapo-tiny-cpu.yaml (two Megatron ranks, DP2 on gloo,
             Megatron-Core generation on the policy's model, Ray controller and reward
             worker), run as a subprocess for --steps steps; the step time is the loop's
             ``timing/step_s`` (generation, scoring, batching, logprobs, training, refit);
             warm-up steps are dropped and the median reported.
  reference  one process, no Ray, no torch.distributed, no Megatron: the HF transformers
             model samples with ``generate`` (KV cache), the same verifier scores, group
             advantages, a token-mean clipped policy-gradient loss with old logprobs = the
             detached current ones, backward, AdamW step. Same total thread count (2: our
             two ranks have one intra-op thread each).

Dynamic sampling is off in both (random weights score 0, every group would be filtered):
each step is exactly one generation round of 32 x 8. Prints phase times and
ratio = ours_step_s / reference_step_s per model; writes bench/results/step_overhead_cpu.json
with, per model, ``ours_step_s``, ``reference_step_s``, ``ratio`` (+ phase breakdowns).

Usage: python bench/step_overhead.py [--steps 12] [--models tiny,1m] [--out PATH]
           [--ours-override KEY=VALUE ...]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
RECIPE = REPO / "recipes" / "dapo-tiny-cpu.yaml"
PROMPTS, SAMPLES, MAX_TOKENS = 32, 8, 8
WARMUP_STEPS = 3
THREADS = 2


def _arch(name: str):
    from dapo_megatron.config.model_arch import PRESETS

    if name == "tiny":
        return PRESETS["tiny-qwen2"]
    return dataclasses.replace(PRESETS["tiny-qwen2"], num_layers=4, hidden_size=128,
                               ffn_hidden_size=512, num_attention_heads=4, num_query_groups=2)


def _ours(model_dir: Path, run_dir: Path, steps: int, extra: list[str]) -> dict:
    """Run dapo-train for `steps` steps; median phase times after the warm-up steps."""
    cmd = [
        sys.executable, "-c",
        "import sys; from dapo_megatron.cli import train_main; sys.exit(train_main())",
        "--config", str(RECIPE),
        f"run.output_dir={run_dir}",
        f"policy.model_name_or_path={model_dir}",
        "policy.init_model_if_missing=false",
        "sft_warmup.num_steps=0",
        "validation.val_at_start=false",
        "validation.val_period=0",
        "checkpointing.enabled=false",
        "logger.progress_bar=false",
        "logger.plots=false",
        f"dapo.max_num_steps={steps}",
        f"dapo.num_prompts_per_step={PROMPTS}",
        f"dapo.num_generations_per_prompt={SAMPLES}",
        "dapo.dynamic_sampling.enabled=false",
        # The soft overlong penalty would teach the policy to stop early (shorter steps
        # than the reference's); without it rewards are 0 and lengths stay put in both.
        "dapo.overlong_buffer.enabled=false",
        f"generation.max_response_length={MAX_TOKENS}",
        f"policy.train_global_batch_size={PROMPTS * SAMPLES}",
        *extra,
    ]
    env = dict(os.environ, RAY_AUTH_MODE="disabled", RAY_USAGE_STATS_ENABLED="0")
    started = time.perf_counter()
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - started
    if proc.returncode != 0:
        raise SystemExit(f"dapo-train failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}")
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in rows if "timing/step_s" in r][WARMUP_STEPS:]
    keys = {
        "step": "timing/step_s",
        "generate": "timing/generate_s",
        "reward": "timing/reward_s",
        "old_logprobs": "timing/logprob_s",
        "train": "timing/train_s",
        "refit": "timing/refit_s",
    }
    phases = {
        name: statistics.median(r.get(key, 0.0) for r in rows) for name, key in keys.items()
    }
    phases["other"] = phases["step"] - sum(v for k, v in phases.items() if k != "step")
    length = statistics.fmean(r["response_length/mean"] for r in rows)
    return {"phases": phases, "steps_timed": len(rows), "process_wall_s": wall,
            "response_length": length}


# ---------------------------------------------------------------------------------------
# The reference step


def _left_pad(rows: list[list[int]], pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad, dtype=torch.long)
    mask = torch.zeros(len(rows), width, dtype=torch.long)
    for b, row in enumerate(rows):
        ids[b, width - len(row):] = torch.tensor(row)
        mask[b, width - len(row):] = 1
    return ids, mask


def _reference(model_dir: Path, steps: int, seed: int = 0) -> dict:
    """The minimal single-process DAPO step (module docstring), median phase times."""
    import transformers

    from dapo_megatron.config.loader import load_config
    from dapo_megatron.data.datasets import build_datasets
    from dapo_megatron.rewards import get_verifier

    torch.set_num_threads(THREADS)
    torch.manual_seed(seed)
    tok = transformers.AutoTokenizer.from_pretrained(model_dir)
    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    optim = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.0)
    data = load_config(RECIPE, validate=False).config.data
    records = build_datasets(data, seed=seed).train.records
    verifier = get_verifier("arithmetic")
    eos, pad = tok.eos_token_id, tok.pad_token_id
    timings: list[dict[str, float]] = []
    lengths: list[float] = []
    for step in range(steps + WARMUP_STEPS):
        t0 = time.perf_counter()
        chosen = [records[(step * PROMPTS + i) % len(records)] for i in range(PROMPTS)]
        prompts = [tok.encode(r.prompt, add_special_tokens=False) for r in chosen]
        ids, mask = _left_pad([p for p in prompts for _ in range(SAMPLES)], pad)
        model.eval()
        with torch.no_grad():
            out = model.generate(ids, attention_mask=mask, do_sample=True, temperature=1.0,
                                 top_k=0, top_p=1.0, max_new_tokens=MAX_TOKENS,
                                 eos_token_id=eos, pad_token_id=pad)
        t1 = time.perf_counter()
        resp = out[:, ids.shape[1]:]
        # Response mask: tokens up to and including the first EOS.
        is_eos = resp == eos
        after_eos = (is_eos.cumsum(1) - is_eos.long()) > 0
        resp_mask = (~after_eos).float()
        texts = [tok.decode(r[m.bool()], skip_special_tokens=True)
                 for r, m in zip(resp, resp_mask, strict=True)]
        truths = [r.ground_truth for r in chosen for _ in range(SAMPLES)]
        scores = torch.tensor([verifier.judge(t, g).score for t, g in zip(texts, truths, strict=True)])
        scores = scores.view(PROMPTS, SAMPLES)
        adv = (scores - scores.mean(1, keepdim=True)) / (scores.std(1, keepdim=True) + 1e-6)
        adv = adv.reshape(-1, 1)
        t2 = time.perf_counter()
        model.train()
        full_mask = torch.cat([mask, resp_mask.long()], dim=1)
        position_ids = (full_mask.cumsum(1) - 1).clamp(min=0)
        logits = model(out, attention_mask=full_mask, position_ids=position_ids).logits
        logits = logits[:, ids.shape[1] - 1 : -1].float()
        lp = torch.log_softmax(logits, -1).gather(-1, resp.unsqueeze(-1)).squeeze(-1)
        ratio = torch.exp(lp - lp.detach())  # one update per batch: old = current
        pg = torch.maximum(-adv * ratio, -adv * ratio.clamp(1 - 0.2, 1 + 0.28))
        loss = (pg * resp_mask).sum() / resp_mask.sum().clamp(min=1)
        loss.backward()
        optim.step()
        optim.zero_grad(set_to_none=True)
        t3 = time.perf_counter()
        timings.append({"step": t3 - t0, "generate": t1 - t0, "reward": t2 - t1,
                        "train": t3 - t2})
        lengths.append(float(resp_mask.sum(1).mean()))
    timed = timings[WARMUP_STEPS:]
    return {"phases": {k: statistics.median(t[k] for t in timed) for k in timed[0]},
            "steps_timed": len(timed), "response_length": statistics.fmean(lengths)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=12, help="timed steps (after 3 warm-up)")
    parser.add_argument("--models", default="tiny,1m")
    parser.add_argument("--out", default=str(REPO / "bench/results/step_overhead_cpu.json"))
    parser.add_argument("--ours-override", action="append", default=[],
                        help="extra dapo-train override for our run (repeatable)")
    args = parser.parse_args(argv)

    from dapo_megatron.data.tiny_model import create_tiny_model

    results: dict = {
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(),
                    "torch": torch.__version__, "threads_total": THREADS},
        "workload": {"prompts": PROMPTS, "samples_per_prompt": SAMPLES,
                     "max_response_tokens": MAX_TOKENS, "optimizer_steps_per_batch": 1,
                     "precision": "fp32", "timed_steps": args.steps,
                     "warmup_steps": WARMUP_STEPS},
        "ours_overrides": args.ours_override,
    }
    with tempfile.TemporaryDirectory(prefix="step-overhead-") as tmp:
        for name in args.models.split(","):
            arch = _arch(name)
            model_dir = create_tiny_model(Path(tmp) / f"model-{name}", arch=arch, seed=0)
            ours = _ours(model_dir, Path(tmp) / f"run-{name}", args.steps + WARMUP_STEPS,
                         args.ours_override)
            ref = _reference(model_dir, args.steps)
            ratio = ours["phases"]["step"] / ref["phases"]["step"]
            results[name] = {
                "parameters": arch.num_parameters(),
                "ours_step_s": ours["phases"]["step"],
                "reference_step_s": ref["phases"]["step"],
                "ratio": ratio,
                "ours_phases_s": ours["phases"],
                "reference_phases_s": ref["phases"],
                "ours_response_length": ours["response_length"],
                "reference_response_length": ref["response_length"],
            }
            fmt = lambda p: " ".join(f"{k} {v:.3f}" for k, v in p.items())  # noqa: E731
            print(f"[{name}] {arch.num_parameters() / 1e6:.2f}M params")
            print(f"  ours      {fmt(ours['phases'])} "
                  f"(response length {ours['response_length']:.2f})")
            print(f"  reference {fmt(ref['phases'])} "
                  f"(response length {ref['response_length']:.2f})")
            print(f"  ratio ours/reference = {ratio:.2f}", flush=True)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
