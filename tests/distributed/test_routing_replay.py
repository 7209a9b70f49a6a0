"""Rollout routing replay (policy.moe.routing_replay) on the tiny Qwen3-MoE at EP2, on gloo.

One two-process launch (DP2 x EP2: each data-parallel replica's engine decodes prompts of
its own, the EP ranks in lockstep). Per precision (fp32, bf16), one policy built with
routing replay and the colocated Megatron engine on the same model object:

1. the engine samples responses; every sample carries its recorded routing;
2. ``build_policy_batch`` (the controller's path) makes the batch;
3. the policy's logprob pass without replay (the routers in RECORD, so the trainer's own
   top-k is read in its own order), with replay (padded micro-batches: one of all rows, so
   the router's token order is simply ``[S, B]`` s-major, which the test inverts by
   itself), and with replay in packed (THD) micro-batches.

Checks: (a) in the replay pass every router's chosen experts equal the engine's recorded
ones for every token the engine fed; (b) the train/rollout logprob mismatch on the loss
tokens with and without replay (printed; replay must not make it worse, and in bf16 the
routing must actually have flipped somewhere for the check to mean anything); (c) the
control: replaying the trainer's OWN routing gives exactly the logprobs of no replay; and
the packed replay pass gives the padded one's logprobs.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch
from launch import run_distributed
from test_policy_step import TEMPERATURE, _config
from test_qwen3_moe import _arch, _write_checkpoint

from dapo_megatron.config.parallel import ParallelDims
from dapo_megatron.shared.batch import PolicyBatch

pytestmark = pytest.mark.distributed

# Per data-parallel replica: prompts (different lengths: the engine left-pads, the batch
# right-pads). Sampled responses of MAX_TOKENS (no stop token), N per prompt.
PROMPTS = {0: [[5, 17, 3, 44, 9, 12], [61, 2], [2, 30, 7, 88]], 1: [[33, 8, 4], [70]]}
N, MAX_TOKENS = 4, 16


def _token_aligned(per_layer: list[torch.Tensor], shape: tuple[int, int]) -> torch.Tensor:
    """One padded micro-batch's router outputs ``[S * rows, ...]`` per layer (s-major, the
    router's flattening of ``[s, b]``; filler rows pad the batch to the micro-batch size)
    as ``[B, S, layers, ...]``."""
    b, s = shape
    rows = [t.reshape(s, -1, *t.shape[1:])[:, :b].transpose(0, 1) for t in per_layer]
    return torch.stack(rows, dim=2)


def _worker(hf_dir: Path, dims: ParallelDims) -> dict:
    from megatron.core import parallel_state

    out = {}
    for precision in ("fp32", "bf16"):
        out[precision] = _passes(hf_dir, dims, precision)
        parallel_state.destroy_model_parallel()  # the next policy reuses the process group
    return out


def _passes(hf_dir: Path, dims: ParallelDims, precision: str) -> dict:
    """Generate with the colocated engine, then the four logprob passes (module doc)."""
    from megatron.core import parallel_state
    from megatron.core.transformer.moe.router import TopKRouter
    from megatron.core.transformer.moe.router_replay import RouterReplayAction

    from dapo_megatron.config.run_plan import build_reward_shaping, policy_plan
    from dapo_megatron.controller.rollouts.rollout_groups import build_policy_batch, make_groups
    from dapo_megatron.megatron.inference import MegatronGenerationBackend
    from dapo_megatron.megatron.policy import MegatronPolicy
    from dapo_megatron.shared.sampling import SamplingParams

    config = _config(hf_dir, dims, 4)
    config.policy.precision = precision
    config.policy.moe.routing_replay = True
    config.policy.max_tokens_per_microbatch = 256  # built for THD; padded passes below
    config.policy.logprob_micro_batch_size = 64  # padded: one micro-batch of every row
    policy = MegatronPolicy(policy_plan(config, dims))
    packed_ctx = policy.ctx
    padded_ctx = dataclasses.replace(packed_ctx, max_tokens_per_microbatch=None)
    engine = MegatronGenerationBackend(policy.model[0], policy.arch, dims, shares_policy_model=True)
    dp = parallel_state.get_data_parallel_rank()
    prompts = PROMPTS[dp]
    sampling = SamplingParams(temperature=TEMPERATURE, max_tokens=MAX_TOKENS, n=N, seed=dp)
    samples = engine.generate(prompts, sampling)
    scores = [float(i % 2) for i in range(len(prompts) * N)]
    shaping = build_reward_shaping(config)
    groups = make_groups(prompts, [""] * len(prompts), samples, scores, shaping)
    batch = build_policy_batch(groups, config, pad_id=0)
    assert batch.routed_experts is not None
    shape = (len(batch), batch.seq_len)

    routers = sorted(
        (m for m in policy.model[0].modules() if isinstance(m, TopKRouter)),
        key=lambda m: m.layer_number,
    )
    maps: list[torch.Tensor] = []  # each router call's routing map [tokens, experts]
    own: list[torch.Tensor] = []  # each router call's own top-k (RECORD only)

    def hook(router: torch.nn.Module, _inputs: object, output: tuple) -> None:
        maps.append(output[1])
        if router.router_replay.router_replay_action == RouterReplayAction.RECORD:
            own.append(router.router_replay.get_recorded_indices())

    hooks = [r.register_forward_hook(hook) for r in routers]

    def logprobs(b: PolicyBatch, ctx) -> tuple[torch.Tensor, torch.Tensor | None]:
        maps.clear()
        policy.ctx = ctx
        lp = policy.logprobs(b)[0]
        if ctx is packed_ctx:  # the pack's order is data/packing.py's, not [S, B]
            return lp, None
        return lp, _token_aligned(list(maps), shape)

    # The trainer's own routing, in its own top-k order (RECORD keeps the indices).
    for r in routers:
        r.router_replay.set_router_replay_action(RouterReplayAction.RECORD)
    lp_plain, map_plain = logprobs(dataclasses.replace(batch, routed_experts=None), padded_ctx)
    for r in routers:
        r.router_replay.clear_router_replay_action()
        r.router_replay.clear_indices()
    own_routing = _token_aligned(own, shape).to(torch.uint8)
    lp_replay, map_replay = logprobs(batch, padded_ctx)
    lp_control, _ = logprobs(dataclasses.replace(batch, routed_experts=own_routing), padded_ctx)
    lp_packed, _ = logprobs(batch, packed_ctx)
    for h in hooks:
        h.remove()
    assert all(r.router_replay.router_replay_action is None for r in routers)
    return {
        "batch": batch,
        "samples": [s for group in samples for s in group],
        "lp_plain": lp_plain,
        "lp_replay": lp_replay,
        "lp_control": lp_control,
        "lp_packed": lp_packed,
        "map_plain": map_plain,
        "map_replay": map_replay,
    }


def _one_hot(routed_BSLK: torch.Tensor, num_experts: int) -> torch.Tensor:
    hot = torch.zeros(*routed_BSLK.shape[:3], num_experts, dtype=torch.bool)
    return hot.scatter_(-1, routed_BSLK.long(), True)


def test_routing_replay_at_ep2(tmp_path: Path) -> None:
    arch = _arch(True)
    assert arch.moe is not None
    _write_checkpoint(arch, tmp_path, seed=3)
    dims = ParallelDims(1, 1, 1, 2, False, ep=2)
    per_rank = run_distributed(_worker, 2, tmp_path, dims, timeout=240)
    for precision in ("fp32", "bf16"):
        diffs: dict[str, list[torch.Tensor]] = {"plain": [], "replay": []}
        flips = fed_total = 0
        for rank in per_rank:
            r = rank[precision]
            batch: PolicyBatch = r["batch"]
            assert batch.lengths is not None and batch.routed_experts is not None
            b, s = batch.input_ids.shape
            layers, k = arch.num_layers, arch.moe.experts_per_token
            assert batch.routed_experts.shape == (b, s, layers, k)
            assert batch.routed_experts.dtype == torch.uint8
            for sample, length in zip(r["samples"], batch.lengths.tolist(), strict=True):
                assert sample.routed_experts.shape == (length - 1, layers, k)
            # Tokens the engine fed (all but each row's last): their routing was recorded.
            fed = torch.arange(s)[None] < (batch.lengths - 1)[:, None]
            recorded = _one_hot(batch.routed_experts, arch.moe.num_experts)
            # (a) the replay pass routed every fed token exactly as the engine did.
            assert torch.equal(r["map_replay"][fed], recorded[fed]), precision
            # Tokens the trainer routes differently on its own (the flips replay removes).
            flips += int((r["map_plain"][fed] != recorded[fed]).any(-1).any(-1).sum())
            fed_total += int(fed.sum())
            # (c) replaying the trainer's own routing changes nothing.
            assert torch.equal(r["lp_control"], r["lp_plain"]), precision
            mask = batch.loss_mask > 0
            rollout = batch.rollout_logprobs
            assert rollout is not None
            diffs["plain"].append((r["lp_plain"] - rollout)[mask].abs())
            diffs["replay"].append((r["lp_replay"] - rollout)[mask].abs())
            packed_diff = (r["lp_packed"] - r["lp_replay"])[mask].abs().max().item()
            assert packed_diff <= (1e-5 if precision == "fp32" else 5e-2), (precision, packed_diff)
        plain, replay = torch.cat(diffs["plain"]), torch.cat(diffs["replay"])
        print(
            f"[routing replay {precision}] |lp_train - lp_rollout| over {plain.numel()} "
            f"tokens: no replay max {plain.max():.2e} mean {plain.mean():.2e}; replay max "
            f"{replay.max():.2e} mean {replay.mean():.2e}; trainer's own routing differs "
            f"from the engine's on {flips} of {fed_total} fed tokens"
        )
        if precision == "fp32":
            assert replay.max() <= 1e-4
        else:
            assert flips > 0, "no routing flip in bf16: the comparison would be vacuous"
            assert replay.mean() <= plain.mean()


# name: (layout, activation recompute); every rank holds the whole batch (DP2 sums two
# halves of the global normaliser, so every layout makes the same update).
LAYOUTS = {
    "dp2": (ParallelDims(1, 1, 1, 2, False), "none"),
    "dp2-full-recompute": (ParallelDims(1, 1, 1, 2, False), "full"),
    "tp2-sp": (ParallelDims(2, 1, 1, 1, True), "none"),
    "cp2": (ParallelDims(1, 1, 2, 1, False), "none"),
}


def _layouts_worker(hf_dir: Path, batch: PolicyBatch) -> dict:
    """Per layout: logprobs (padded and packed) and the SGD weight change of one train step
    (lr 1: minus the gradient), all replaying ``batch.routed_experts``."""
    from megatron.core import parallel_state

    from dapo_megatron.config.run_plan import policy_plan
    from dapo_megatron.megatron.policy import MegatronPolicy

    out = {}
    for name, (dims, recompute) in LAYOUTS.items():
        config = _config(hf_dir, dims, 4, recompute)
        config.policy.moe.routing_replay = True
        config.policy.max_tokens_per_microbatch = 64  # THD packs of a few rows
        policy = MegatronPolicy(policy_plan(config, dims))
        packed_ctx = policy.ctx
        policy.ctx = dataclasses.replace(packed_ctx, max_tokens_per_microbatch=None)
        padded = policy.logprobs(batch)[0]
        policy.ctx = packed_ctx
        packed = policy.logprobs(batch)[0]
        before = dict(policy.export_weights())
        loss = policy.train_step(batch)["loss"]  # in packed micro-batches
        delta = {n: t - before[n] for n, t in policy.export_weights()}
        out[name] = {"padded": padded, "packed": packed, "loss": loss, "delta": delta}
        parallel_state.destroy_model_parallel()
    return out


def test_routing_replay_layouts(tmp_path: Path) -> None:
    """An arbitrary routing (random experts, unlike the router's own choice for most
    tokens) replayed at TP2 x SP, CP2, in packed micro-batches and under full recompute
    gives the logprobs and the update of the plain layout: the routing reaches each token
    in the router's order of every layout (a misplaced token changes its experts)."""
    arch = _arch(True)
    assert arch.moe is not None
    model = _write_checkpoint(arch, tmp_path, seed=4)
    gen = torch.Generator().manual_seed(5)
    b, s, layers = 6, 16, arch.num_layers
    lengths = torch.tensor([16, 9, 13, 4, 16, 11])
    loss_mask = (torch.arange(s)[None] < lengths[:, None]).float()
    loss_mask[:, :2] = 0.0  # a two-token prompt
    noise = torch.rand(b, s, layers, arch.moe.num_experts, generator=gen)
    routed = noise.argsort(-1)[..., : arch.moe.experts_per_token].to(torch.uint8)
    batch = PolicyBatch(
        input_ids=torch.randint(0, 90, (b, s), generator=gen) * (loss_mask > 0),
        loss_mask=loss_mask,
        advantages=torch.randn(b, generator=gen),
        old_logprobs=-torch.rand(b, s, generator=gen) * loss_mask,
        lengths=lengths,
        routed_experts=routed,
    )
    del model
    per_rank = run_distributed(_layouts_worker, 2, tmp_path, batch, timeout=240)
    mask = loss_mask > 0
    ref = per_rank[0]["dp2"]
    for name in LAYOUTS:
        for rank in per_rank:
            ours = rank[name]
            for kind in ("padded", "packed"):
                diff = (ours[kind] - ref["padded"])[mask].abs().max().item()
                assert diff <= 1e-5, (name, kind, diff)
            assert abs(ours["loss"] - ref["loss"]) <= 1e-5, name
            worst = max((d - ref["delta"][n]).abs().max().item() for n, d in ours["delta"].items())
            assert worst <= 1e-5, (name, worst)
