"""Command-line entry points: dapo-train, dapo-plan and dapo-export.

User errors (bad keys, values, files) print one `error:` message and exit with status 2,
without a traceback; runtime failures print one `error:` line and exit with 1; Ctrl-C
stops the workers and exits with 130. Anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import argparse
import dataclasses
import shlex
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import yaml

import dapo_megatron.migrate  # noqa: F401  (registers the foreign-key hints the loader prints)
from dapo_megatron.config.errors import ConfigError
from dapo_megatron.config.loader import LoadedConfig, display_path, load_config
from dapo_megatron.config.run_plan import RunPlan, runtime_problems
from dapo_megatron.planning.capacity import DEFAULT_CARD, card_names, parse_gpu_mem
from dapo_megatron.planning.capacity import DEFAULT_GPU_MEM_GIB as DEFAULT_CAPACITY_GIB
from dapo_megatron.planning.summary import format_plan
from dapo_megatron.shared.commands import tool_command

# The main job when no --config is given: the tiny CPU recipe shipped with the package.
DEFAULT_RECIPE = Path(__file__).resolve().parent.parent / "recipes" / "dapo-tiny-cpu.yaml"
USER_ERROR_EXIT = 2
RUNTIME_ERROR_EXIT = 1
INTERRUPTED_EXIT = 130  # the shell's code for a process ended by SIGINT (128 + 2)
PREEMPTED_EXIT = 143  # SIGTERM (128 + 15): stopped at a safe point, resumable

TRAIN_EPILOG = """\
overrides:
  KEY=VALUE pairs in YAML syntax (dapo.loss.clip_ratio_high=0.28, validation.val_at_start=
  false, policy.megatron.tensor_model_parallel_size=2) may appear anywhere on the command
  line, before or after the flags; later ones win.

run directory (run.output_dir):
  config.yaml         the resolved config of the run (what dapo-export reads)
  metrics.jsonl       one JSON record per step (and per validation)
  sft_metrics.jsonl   one record per SFT warm-up step (sft_warmup.num_steps > 0)
  plots/              PNG curves of the run (logger.plots), written when it ends
  logs/workers/       the output of the policy ranks and generation engines
  checkpoints/step_N  complete checkpoints (checkpointing.*), verified on resume
  hf/step_N           the final model as a Hugging Face checkpoint (checkpointing.export_hf)
  .lock               held while a run uses the directory: a second dapo-train on the
                      same directory is refused

resume:
  checkpointing.resume=auto (default) continues from the newest checkpoint that verifies,
  so re-running the same command after a crash, Ctrl-C or preemption resumes it;
  checkpointing.resume=never refuses a directory that already holds a run (choose another
  run.output_dir). A worker that dies is restarted from the last checkpoint up to
  run.max_restarts times. SIGTERM (Slurm preemption or time limit; slurm/ray.sub asks
  for it before the limit) saves a checkpoint at the end of the current step, within
  run.preemption_grace_s, and exits 143 with the command that resumes.

exit status:
  0 finished; 1 runtime failure (a worker failed, restarts exhausted, dynamic sampling
  found too few groups); 2 invalid input (config, paths, data, model, devices) found
  before any worker started; 130 interrupted (Ctrl-C); 143 stopped by SIGTERM
  (preemption), resumable.

related commands:
  dapo-plan           check a recipe's layout and per-GPU memory before asking for GPUs
  dapo-prepare        fetch a recipe's hub model and datasets into the cache (on a
                      machine with internet, before a cluster run without)
  dapo-import-config  write a recipe from a NeMo RL, SkyRL, RLinf or verl config
  dapo-export         write a Hugging Face checkpoint from any dapo-train checkpoint
"""


def _parser(prog: str, description: str, epilog: str | None = None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog,
        description=description,
        epilog=epilog,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--config", type=Path, default=None, help=f"recipe YAML (default: {DEFAULT_RECIPE.name})"
    )
    parser.add_argument(
        "overrides",
        nargs="*",
        metavar="KEY=VALUE",
        help="overrides such as dapo.loss.clip_ratio_high=0.28 (YAML values)",
    )
    return parser


def _recipe(config: Path | None) -> Path:
    """--config, or the default recipe; a directory is named as one (the loader would say
    "not found")."""
    if config is not None and config.is_dir():
        raise ConfigError(
            f"--config {config} is a directory; pass a recipe YAML file, e.g. "
            f"--config {config / 'dapo-tiny-cpu.yaml'}"
        )
    return config or DEFAULT_RECIPE


def resolved_config_yaml(loaded: LoadedConfig) -> str:
    """The merged config as YAML, with derived values (data_parallel_size) filled in."""
    tree = dataclasses.asdict(loaded.config)
    if loaded.plan is not None:
        tree["policy"]["megatron"]["data_parallel_size"] = loaded.plan.dims.dp
    text: str = yaml.safe_dump(tree, sort_keys=False, default_flow_style=False)
    return text


def check_runnable(plan: RunPlan, prepare_args: str | None = None) -> None:
    """The checks a dry run and a real run share beyond the config itself, before any
    worker starts: what this machine must provide (devices) and the inputs the run reads
    (data files, model weights, tokenizer; dapo_megatron/planning/preflight.py). Raises ConfigError
    listing every problem. ``prepare_args``: the run's ``--config`` and overrides, which a
    missing model's message repeats in the dapo-prepare command that fetches it."""
    from dapo_megatron.data.hub import PREPARE_ARGS
    from dapo_megatron.planning.preflight import preflight

    problems = runtime_problems(plan) + preflight(
        plan.config,
        plan.device,
        run_dir=plan.run_dir,
        checkpoint_dir=plan.checkpoint_dir,
        prepare_args=prepare_args or PREPARE_ARGS,
    )
    if len(problems) == 1:
        raise ConfigError(problems[0])  # one problem, one line
    if problems:
        n = len(problems)
        raise ConfigError(
            f"{n} problem{'s' if n > 1 else ''} found before starting:\n  - "
            + "\n  - ".join(problems)
        )


def _run_guarded(main: Callable[[], int]) -> int:
    try:
        return main()
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return USER_ERROR_EXIT


def _write_resolved_config(loaded: LoadedConfig, run_dir: Path) -> None:
    """``RUN_DIR/config.yaml``: the resolved config of the run (what dapo-export and a later
    reader need without the recipe), written atomically; a resumed run rewrites it."""
    run_dir.mkdir(parents=True, exist_ok=True)
    tmp = run_dir / f"{RUN_CONFIG_FILE}.tmp"
    tmp.write_text(resolved_config_yaml(loaded), encoding="utf-8")
    tmp.replace(run_dir / RUN_CONFIG_FILE)


def _resume_hint(plan: RunPlan, command: str) -> str:
    """Where the run stands on disk and how to continue it."""
    from dapo_megatron.storage.checkpoint_dirs import latest_checkpoint
    from dapo_megatron.storage.run_dir import unresumable_run_problem

    last = latest_checkpoint(plan.checkpoint_dir)
    if last is None:
        if unresumable_run_problem(plan.run_dir, plan.checkpoint_dir) is None:
            return f"no checkpoint was saved yet; `{command}` starts the run again"
        # A re-run refuses the directory: starting afresh would overwrite its metrics.
        return (
            f"no checkpoint was saved yet; delete {plan.run_dir} (or set a new run.output_dir) "
            f"and run `{command}` to start again"
        )
    return f"the last checkpoint is {last}; `{command}` resumes from it"


def _finished(plan: RunPlan, *, notes: bool = False) -> str | None:
    """The line of a run that has nothing left to do (planning/resume_check.py), or None;
    ``notes`` prints the lines about checkpoints skipped on the way (a dry run's view)."""
    from dapo_megatron.planning.resume_check import finished_run, resume_point

    point = resume_point(plan.config, plan.run_dir, plan.checkpoint_dir)
    if notes:
        for line in point.notes:
            print(line)
        if point.path is not None:
            print(f"[resume] the run would resume from {point.path} (step {point.step})")
    return finished_run(plan.config, plan.run_dir, point)


def _train(loaded: LoadedConfig, command: str) -> int:
    """Run the job in its locked run directory (storage/run_dir.py)."""
    from dapo_megatron.storage.run_dir import acquire_run_dir

    plan = loaded.require_plan()
    cfg = plan.config
    # Locked before anything is written: a refused second process must not touch the
    # directory (not even config.yaml) of the run that holds it.
    # Every directory the run writes is locked: two runs sharing a checkpoint directory
    # would delete each other's saves in progress and resume from each other's steps.
    with acquire_run_dir(
        plan.run_dir,
        resume=cfg.checkpointing.resume,
        checkpoint_dir=plan.checkpoint_dir,
        export_dir=plan.run_dir / "hf" if cfg.checkpointing.export_hf else None,
    ):
        finished = _finished(plan)
        if finished is not None:
            # Found from the files: no Ray, no workers, the directory left as it is.
            print(f"dapo-train: {finished}")
            return 0
        _write_resolved_config(loaded, plan.run_dir)
        return _train_locked(plan, command)


def _train_locked(plan: RunPlan, command: str) -> int:
    """Train; runtime failures are one-line errors with exit status 1, Ctrl-C exits 130."""
    from dapo_megatron.algorithms.dynamic_sampling import DynamicSamplingExhausted
    from dapo_megatron.controller.actors import preemption
    from dapo_megatron.controller.actors.cluster import ClusterJoinError
    from dapo_megatron.controller.actors.node_loss import NodeLost
    from dapo_megatron.controller.actors.remote import RestartsExhausted, WorkerFailure
    from dapo_megatron.controller.loop import train
    from dapo_megatron.storage.checkpoint_dirs import CheckpointError

    # The final line of a preempted run (also printed by the hook's exit watchdog when
    # stopping the workers or Ray hangs, e.g. on a GCS the job-wide SIGTERM stopped).
    hook = preemption.Preemption(
        plan.config.run.preemption_grace_s,
        final_line=lambda outcome: f"preempted: SIGTERM; {outcome}{_resume_hint(plan, command)}",
    )
    hook.install()
    preemption.activate(hook)

    def preempted(outcome: str) -> int:
        if hook.outcome is None:
            hook.outcome = outcome
        line = hook.final_line()
        if line is not None:
            print(line, file=sys.stderr, flush=True)
        return PREEMPTED_EXIT

    started = time.monotonic()  # the summary's wall time: Ray's start included
    try:
        try:
            metrics = train(plan)
        except Exception:
            if hook.outcome is not None:
                # The safe point (or the deadline) was reached and decided the outcome;
                # what failed after it is the stop of workers (a job-wide SIGTERM may
                # have ended them, and the GCS with them).
                return preempted(hook.outcome)
            raise
    except preemption.Preempted as e:
        return preempted(preemption.saved_words(e.step, e.saved))
    except preemption.PreemptionDeadline as e:
        return preempted(f"{e}, so the workers were stopped without a new checkpoint; ")
    except KeyboardInterrupt:
        print(
            f"interrupted: the workers were stopped; {_resume_hint(plan, command)}",
            file=sys.stderr,
        )
        return INTERRUPTED_EXIT
    except ClusterJoinError as e:
        print(f"error: {e}", file=sys.stderr)
        return RUNTIME_ERROR_EXIT
    except (RestartsExhausted, NodeLost) as e:
        print(f"error: {e}; {_resume_hint(plan, command)}", file=sys.stderr)
        return RUNTIME_ERROR_EXIT
    except (DynamicSamplingExhausted, WorkerFailure, CheckpointError) as e:
        # A checkpoint that failed to save (or to verify) is the error, not the rank
        # that reported it: its line names the path and the OS error.
        cause = e.__cause__ if isinstance(e.__cause__, CheckpointError) else e
        print(f"error: {cause}", file=sys.stderr)
        return RUNTIME_ERROR_EXIT
    finally:
        hook.uninstall()
        preemption.activate(None)
    del metrics  # the summary reads the run directory: a resumed run's whole history
    print(_summary(plan, time.monotonic() - started), flush=True)
    return 0


def _summary(plan: RunPlan, wall_s: float) -> str:
    """The closing lines of a finished run: steps, wall time, validation accuracy and
    where the checkpoint, the export, the plots and the worker logs are."""
    from dapo_megatron.logging import format_summary, worker_log_dir
    from dapo_megatron.storage.checkpoint_dirs import latest_checkpoint

    cfg = plan.config
    export = plan.run_dir / "hf" / f"step_{cfg.dapo.max_num_steps:06d}"
    if cfg.dapo.max_num_epochs is not None:  # the passes may end the run first: its last one
        export = max((plan.run_dir / "hf").glob("step_*"), default=export)
    plots = plan.run_dir / "plots"
    logs = worker_log_dir(plan.run_dir)
    return format_summary(
        plan.run_dir,
        total_steps=cfg.dapo.max_num_steps,
        wall_s=wall_s,
        checkpoint=latest_checkpoint(plan.checkpoint_dir) if cfg.checkpointing.enabled else None,
        export=export if cfg.checkpointing.export_hf and export.exists() else None,
        plots=plots if plots.is_dir() else None,
        worker_logs=logs if logs.is_dir() else None,
    )


def train_main(argv: Sequence[str] | None = None) -> int:
    """dapo-train: validate a recipe, print it or its plan, then train."""
    parser = _parser("dapo-train", "Train a policy with DAPO on Megatron-Core.", TRAIN_EPILOG)
    parser.add_argument(
        "--print-config", action="store_true", help="print the resolved config and exit"
    )
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="run every check of a real run (config, data files, model, tokenizer, devices) "
        "and print the plan, without starting anything",
    )
    raw = list(sys.argv[1:] if argv is None else argv)
    # Overrides may sit between or after flags (`a=1 --dry-run b=2`).
    args = parser.parse_intermixed_args(raw)
    command = shlex.join([tool_command("dapo-train"), *(a for a in raw if a != "--dry-run")])

    def main() -> int:
        loaded = load_config(_recipe(args.config), args.overrides)
        if args.print_config:
            print(resolved_config_yaml(loaded), end="")
            return 0
        print(format_plan(loaded))
        # What dapo-prepare needs to fetch this run's inputs: its recipe, and its overrides
        # but the model's (the missing-model message sets that one to the hub id).
        prepare_args = shlex.join(
            ["--config", display_path(_recipe(args.config))]
            + [o for o in args.overrides if not o.startswith("policy.model_name_or_path=")]
        )
        check_runnable(loaded.require_plan(), prepare_args)
        if args.dry_run:
            finished = _finished(loaded.require_plan(), notes=True)
            print(
                "dry run: configuration, data, model, tokenizer and devices are valid; "
                + (f"{finished}; " if finished else "")
                + "nothing was started"
            )
            return 0
        return _train(loaded, command)

    return _run_guarded(main)


DEFAULT_GPU_MEM_GIB = DEFAULT_CAPACITY_GIB
"""Device memory dapo-plan checks against unless --gpu-mem says otherwise: what an 80 GB
H100 reports to the allocator (79.2 GiB, planning/capacity.py), not its marketed 80."""


def plan_main(argv: Sequence[str] | None = None) -> int:
    """dapo-plan: validate a recipe, print its layout and per-GPU memory plan.

    Exit status 1 when the memory plan does not fit a GPU with its safety margin (CPU
    recipes: never, the numbers are informative), 2 on an invalid recipe.
    """
    parser = _parser("dapo-plan", "Check that a recipe's layout and memory fit its cluster.")
    parser.add_argument(
        "--gpu-mem",
        default=DEFAULT_CARD,
        metavar="GIB|CARD",
        help="memory of one GPU as torch.cuda.mem_get_info() reports it, in GiB, or a card "
        f"name ({card_names()}; default: {DEFAULT_CARD}, {DEFAULT_GPU_MEM_GIB:g} GiB)",
    )
    parser.add_argument(
        "--margin",
        type=float,
        default=None,
        metavar="GIB",
        help="memory every phase must leave free (default: max(5%% of the GPU, 2 GiB))",
    )
    parser.add_argument(
        "--trace",
        action="store_true",
        help="check the memory plan against a trace of the real Megatron step, one rank "
        "per pipeline stage on a fake CUDA device (no GPU needed; seconds to minutes)",
    )
    args = parser.parse_args(argv)

    def main() -> int:
        from dapo_megatron.planning.memory import memory_inputs, plan_memory
        from dapo_megatron.planning.step_time_summary import format_step_time
        from dapo_megatron.planning.summary import format_memory

        gpu_mem, label = parse_gpu_mem(args.gpu_mem)
        if args.margin is not None and not 0 <= args.margin < gpu_mem:
            raise ConfigError(f"--margin = {args.margin}: must be >= 0 and below --gpu-mem")
        loaded = load_config(_recipe(args.config), args.overrides)
        print(format_plan(loaded))
        run = loaded.require_plan()
        if run.arch is None:
            print(f"memory: not planned, architecture unknown ({run.arch_source})")
            return 0
        report = plan_memory(memory_inputs(run, gpu_mem, args.margin))
        print(format_memory(report))
        if not args.trace:
            print(format_step_time(run, args.gpu_mem))
        else:
            from dapo_megatron.planning.trace import trace_recipe
            from dapo_megatron.planning.trace.compare import format_comparison

            rows, traces = trace_recipe(_recipe(args.config), args.overrides, report)
            print(format_comparison(rows, traces))
            ops = [t.ops for t in traces if t.ops is not None]
            # Every stage traced: its ops replace the analytic count (comm stays modelled).
            print(
                format_step_time(run, args.gpu_mem, traced=ops if len(ops) == len(traces) else ())
            )
        if report.fits or not report.inputs.on_gpu:
            return 0
        print(
            f"error: the recipe does not fit in {label} (safety margin "
            f"{report.inputs.margin:.1f} GiB): {report.reason}",
            file=sys.stderr,
        )
        return 1

    return _run_guarded(main)


RUN_CONFIG_FILE = "config.yaml"
"""The resolved config a run directory may hold (``resolved_config_yaml``): dapo-export's
default --config. dapo-train does not write it yet; without it, --config is required."""


def _export_config(args: argparse.Namespace, checkpoint: Path) -> LoadedConfig:
    """--config, else RUN_DIR/config.yaml of the checkpoint's run (RUN_DIR/checkpoints/step_N)."""
    if args.config is not None:
        return load_config(args.config, args.overrides, validate=False)
    run_dir = checkpoint.resolve().parent.parent
    saved = run_dir / RUN_CONFIG_FILE
    if not saved.is_file():
        raise ConfigError(
            f"--config is required: {run_dir} holds no {RUN_CONFIG_FILE} (dapo-train does not "
            f"save its config); pass the recipe and the overrides the run was trained with"
        )
    return load_saved_config(saved, args.overrides)


def load_saved_config(saved: Path, overrides: Sequence[str] = ()) -> LoadedConfig:
    """A run's resolved config.yaml, over today's configs/dapo_base.yaml: a key added to the
    package since the run was made takes its base value, which keeps the behaviour the run
    had (a new key's default is the old behaviour), so an upgrade never makes an older run
    unreadable. A key since removed or renamed is still an error naming it."""
    import tempfile

    from dapo_megatron.config.yaml_comments import BASE_YAML

    tree = yaml.safe_load(saved.read_text(encoding="utf-8")) or {}
    if not isinstance(tree, dict) or "defaults" in tree:
        return load_config(saved, overrides, validate=False)
    with tempfile.TemporaryDirectory() as tmp:
        layered = Path(tmp) / saved.name
        layered.write_text(
            yaml.safe_dump({"defaults": str(BASE_YAML), **tree}, sort_keys=False),
            encoding="utf-8",
        )
        return load_config(layered, overrides, validate=False)


def _rank_error(error: BaseException) -> str:
    """One line for a failed export rank: torch's message holds the rank's whole traceback
    (20 lines for a full disk); its last line is the exception itself."""
    lines = [x for x in str(error).strip().splitlines() if x.strip()]
    rank = getattr(error, "error_index", None)
    return (f"rank {rank}: " if rank is not None else "") + (lines[-1] if lines else repr(error))


def export_main(argv: Sequence[str] | None = None) -> int:
    """dapo-export: write a Hugging Face checkpoint from a dapo-train checkpoint.

    Exit status 2 on a user error (paths, config), 1 when a rank fails.
    """
    parser = argparse.ArgumentParser(
        prog="dapo-export",
        description="Write a Hugging Face checkpoint (config.json, safetensors, tokenizer) "
        "from a dapo-train checkpoint saved at any TP/PP layout.",
    )
    parser.add_argument(
        "--checkpoint",
        type=Path,
        required=True,
        metavar="DIR",
        help="a complete checkpoint: RUN_DIR/checkpoints/step_NNNNNN",
    )
    parser.add_argument(
        "--out",
        type=Path,
        required=True,
        metavar="DIR",
        help="HF directory to create (new or empty)",
    )
    parser.add_argument(
        "--config",
        type=Path,
        default=None,
        help=f"the run's recipe (default: RUN_DIR/{RUN_CONFIG_FILE} when the run holds one)",
    )
    parser.add_argument("--tp", type=int, default=None, help="export ranks' TP (default: saved)")
    parser.add_argument("--pp", type=int, default=None, help="export ranks' PP (default: saved)")
    parser.add_argument(
        "--max-shard-gb",
        type=float,
        default=5.0,
        metavar="GB",
        help="largest safetensors file in GB (10^9 bytes; default 5)",
    )
    parser.add_argument(
        "overrides",
        nargs="*",
        metavar="KEY=VALUE",
        help="overrides of the run's config, e.g. policy.model_name_or_path=/models/base",
    )
    args = parser.parse_args(argv)

    def main() -> int:
        # Megatron-free: the checks run (and fail) without starting anything.
        from dapo_megatron.megatron.export_hf import check_checkpoint_dir, check_out_dir
        from dapo_megatron.megatron.export_launch import launch_export, preflight

        if args.max_shard_gb <= 0:
            raise ConfigError(f"--max-shard-gb = {args.max_shard_gb}: must be > 0")
        for flag, value in (("--tp", args.tp), ("--pp", args.pp)):
            if value is not None and value < 1:
                raise ConfigError(f"{flag} = {value}: must be >= 1")
        marker = check_checkpoint_dir(args.checkpoint)
        check_out_dir(args.out)
        loaded = _export_config(args, args.checkpoint)
        tp, pp, _ = preflight(args.checkpoint, args.out, loaded.config, tp=args.tp, pp=args.pp)
        saved = marker["layout"]
        print(
            f"dapo-export: {args.checkpoint} (step {marker.get('step')}, saved at "
            f"TP{saved['tp']} PP{saved['pp']}) -> {args.out}, {tp * pp} rank(s) at TP{tp} PP{pp}",
            flush=True,
        )
        import torch.multiprocessing as mp

        try:
            out = launch_export(
                args.checkpoint,
                args.out,
                loaded.config,
                tp=tp,
                pp=pp,
                max_shard_size=max(1, int(args.max_shard_gb * 10**9)),
            )
        except (mp.ProcessRaisedException, mp.ProcessExitedException) as e:
            print(
                f"error: the export failed, {args.out} was not written: {_rank_error(e)}",
                file=sys.stderr,
            )
            return 1
        files = sorted(p.name for p in out.iterdir())
        size = sum(p.stat().st_size for p in out.iterdir()) / 1e9
        print(f"dapo-export: wrote {out} ({size:.3f} GB): {', '.join(files)}")
        return 0

    return _run_guarded(main)


if __name__ == "__main__":
    sys.exit(train_main())
