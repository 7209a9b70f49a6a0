"""End to end on one device: dapo-train, resume, dapo-export and HF generate, per model.

For each model preset (``--models``; on a GPU qwen3-0.6b and qwen3-1.7b, on a CPU the tiny
tiny-qwen3), in ONE command (scripts/gpu_run.sh), in two rounds: first the timed run of
EVERY model (steps 1 to 3), then the later phases (4 to 6) model by model, so a run cut
short by its time limit still has every model's timed figures:

1. a random-weight HF checkpoint of the preset's real shape (vocabulary included; the
   char tokenizer's tokens are its first rows) by the package's own
   ``create_tiny_model``;
2. on CUDA, the kernel check (gpu_run_steps.kernel_check, a few seconds): the compiled
   Triton logprob and PG-loss kernels the policy runs (bf16 on CUDA: ``impl="auto"``
   picks them) at the preset's output layer against the torch paths; when it fails, the
   runs get ``DAPO_NO_TRITON=1`` (the torch paths) and the JSON says so. Skipped on a
   CPU (the policy runs the chunked torch path there). Before the first timed run, the
   decode check (bench/decode_step.py, ~20 s): the engine's CUDA-graph decode step
   against eager; when it fails, the runs decode eagerly (generation.engine.enforce_eager);
3. ``dapo-train`` (the real CLI, a subprocess) on configs/dapo_base.yaml with overrides:
   one device, colocated, Megatron-Core generation (vLLM cannot travel to the test
   machine), the synthetic arithmetic task and verifier, bf16 on a GPU (fp32 on a CPU),
   ``--steps`` steps without checkpoints: the timed run. A random model scores 0
   everywhere, so every group has zero variance: dynamic sampling is off (it would filter
   everything) and a small entropy bonus (``--entropy-coef``) gives the update a non-zero
   gradient, so the resume check below compares a real update. A random model almost never
   samples EOS: responses run to ``--response-length`` tokens. The old-logprob pass is
   forced (``policy.old_logprob_pass=always``) so the logprob phase is timed;
4. ``resume``: the same run for one step with a checkpoint, then resumed from it for
   steps 2 and 3 (without a second checkpoint: a 1.7B one is ~24 GB with its optimizer
   states); ``resume_bit_exact`` is whether those steps equal the timed run's exactly on
   every key of gpu_run_figures.RESUME_KEYS (step 3 also depends on the restored Adam
   moments); ``details.step1_mismatches`` compares step 1 of both, where no resume is
   involved: differences there are the device's non-determinism, not the checkpoint's;
5. ``export``: ``dapo-export`` (the CLI) of the step-1 checkpoint; ``export_ok``:
   transformers loads it, its parameter count is the preset's and a forward gives finite
   logits;
6. ``hf_generate``: ``transformers`` ``generate`` on the same card, same batch and length
   (forced with min_new_tokens), for the engine comparison (``hf_generate_tokens_per_s``).

Figures (gpu_run_figures.py): median phase times of the timed steps, throughputs, MFU over
the card's dense bf16 peak (null on a CPU), per-phase peak memory measured by the policy
rank (device/phase_memory.py; null on a CPU) and planned by dapo-plan's model
(planning/memory.py) for the same recipe.

Within one device call (gpu_run_guard.py): ``--out`` (default
bench/results/gpu_run_<gpu>.json) is written at the start and after every phase; a model's
entry appears with its timed run, ``phases_done`` and ``partial`` saying what is behind it.
``--hard-stop-s`` (default 560, from the start of gpu_run.sh) ends the phase in progress (a
child's process group; an in-process phase by SIGALRM), writes the JSON and exits; each
child's timeout is the time left, and no phase starts with under 15 s left. A SIGTERM does
the same. The work directory's free disk is checked first (gpu_run_guard.plan_disk): a
model that does not fit is left out, or runs its timed run only, with a note. The tails of
every child's and Ray worker's log and every error (a worker's traceback included) go to
one file beside the JSON (``<out stem>_logs.txt``). Exit status 0 when a model has its
timed figures, else 1. A summary table is printed at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

# Run as a file (bench/ is no package): its sibling helpers and the checkout import.
sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[1])]
import gpu_run_figures as figures  # noqa: E402
import gpu_run_guard as guard  # noqa: E402
import gpu_run_steps as steps  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
BASE = steps.BASE
GPU_MODELS = "qwen3-0.6b,qwen3-1.7b"
CPU_MODELS = "tiny-qwen3"
TRAIN = "import sys; from dapo_megatron.cli import train_main; sys.exit(train_main())"
EXPORT = "import sys; from dapo_megatron.cli import export_main; sys.exit(export_main())"
# Lines of dapo-train's output worth echoing as progress (the rest goes to the log file).
ECHO = ("step ", "[resume]", "dapo-train:", "dapo-export:", "error", "preempted")
LATER = ("resume", "export", "hf_generate")
"""The phases after the timed run, in order (module docstring)."""


def log(msg: str) -> None:
    """One progress line, flushed (the device returns only what was printed)."""
    print(f"[gpu-run {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def parse_args(argv: list[str] | None, cuda: bool) -> argparse.Namespace:
    """Command-line settings; defaults differ between a GPU and a CPU (CI)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument(
        "--models",
        default=GPU_MODELS if cuda else CPU_MODELS,
        help="model_arch presets, comma separated",
    )
    p.add_argument(
        "--out",
        type=Path,
        default=None,
        help="JSON to write (default bench/results/gpu_run_<gpu>.json)",
    )
    p.add_argument("--steps", type=int, default=3, help="timed steps (>= 2; the first is warm-up)")
    p.add_argument("--prompts", type=int, default=8 if cuda else 4, help="prompts per step")
    p.add_argument("--samples", type=int, default=8 if cuda else 4, help="samples per prompt")
    p.add_argument(
        "--response-length",
        type=int,
        default=1024 if cuda else 16,
        help="generation.max_response_length (a random model runs to it)",
    )
    p.add_argument(
        "--max-tokens-per-microbatch",
        type=int,
        default=8192 if cuda else 2048,
        help="packed micro-batch size of the logprob and train passes",
    )
    p.add_argument("--lr", type=float, default=1e-6)
    p.add_argument(
        "--entropy-coef",
        type=float,
        default=1e-3,
        help="entropy bonus: a non-zero gradient when every advantage is 0",
    )
    p.add_argument(
        "--work-dir",
        type=Path,
        default=None,
        help="models and run directories (default: a temporary directory, deleted)",
    )
    p.add_argument("--no-hf-generate", action="store_true", help="skip the transformers baseline")
    p.add_argument("--seed", type=int, default=42)
    p.add_argument(
        "--hard-stop-s",
        type=float,
        default=560.0,
        help="end everything this many seconds after gpu_run.sh started (GPU_RUN_STARTED) "
        "and write the JSON; 0: no hard stop",
    )
    p.add_argument(
        "--deadline-s",
        type=float,
        default=None,
        help="start no further phase after this many seconds (the JSON so far stays)",
    )
    p.add_argument(
        "train_overrides",
        nargs="*",
        metavar="KEY=VALUE",
        help="extra dapo-train overrides for every run",
    )
    args = p.parse_args(argv)
    if args.steps < 2:
        p.error("--steps must be >= 2: the resume check compares step 2")
    return args


def overrides(
    args: argparse.Namespace,
    preset: str,
    model: Path,
    run_dir: Path,
    *,
    device: str,
    steps: int,
    checkpoint: bool,
) -> list[str]:
    """dapo-train's overrides of configs/dapo_base.yaml for one run (module docstring)."""
    seq = 32 + args.response_length  # data.max_prompt_length + the response cap
    batch = args.prompts * args.samples
    return [
        f"run.output_dir={run_dir}",
        "run.name=gpu-run",
        f"run.seed={args.seed}",
        f"policy.model_name_or_path={model}",
        f"policy.model_arch={preset}",
        f"policy.precision={'bf16' if device == 'cuda' else 'fp32'}",
        "policy.allow_local_spec=true",  # no Transformer Engine on the test machine
        f"policy.optimizer.lr={args.lr}",
        f"policy.optimizer.min_lr={args.lr}",
        # Fixed, not derived from max_num_steps: the 1-step and 2-step runs of the resume
        # check must have the timed run's schedule.
        "policy.scheduler.lr_warmup_steps=0",
        "policy.scheduler.lr_decay_steps=1000",
        f"policy.train_global_batch_size={batch}",
        f"policy.max_tokens_per_microbatch={max(args.max_tokens_per_microbatch, seq)}",
        "policy.old_logprob_pass=always",
        f"policy.max_total_sequence_length={seq}",
        "generation.backend=megatron",
        f"generation.max_response_length={args.response_length}",
        f"generation.engine.max_num_seqs={batch}",
        f"dapo.num_prompts_per_step={args.prompts}",
        f"dapo.num_generations_per_prompt={args.samples}",
        f"dapo.max_num_steps={steps}",
        "dapo.dynamic_sampling.enabled=false",
        "dapo.overlong_buffer.enabled=false",
        f"dapo.loss.entropy_coef={args.entropy_coef}",
        "sft_warmup.num_steps=0",
        "validation.val_period=0",
        "validation.val_at_start=false",
        "data.format=arithmetic",
        "data.train_path=null",
        "data.val_path=null",
        "data.max_prompt_length=32",
        "data.apply_chat_template=false",
        "data.arithmetic.difficulty=3",
        "data.arithmetic.num_val=16",
        "reward.verifier=arithmetic",
        "reward.num_workers=1",
        "cluster.num_nodes=1",
        "cluster.gpus_per_node=1",
        f"cluster.device={device}",
        "cluster.colocated=true",
        f"checkpointing.enabled={'true' if checkpoint else 'false'}",
        "checkpointing.save_period=1",
        "checkpointing.keep_last=1",
        "logger.tensorboard_enabled=false",
        "logger.plots=false",
        "logger.progress_bar=false",
        *args.train_overrides,
    ]


class PhaseSkipped(Exception):
    """A phase was not started (no time left, or what it needs is missing)."""


def run_cli(
    code: str, cli_args: list[str], logfile: Path, label: str, stop: guard.HardStop
) -> float:
    """Run a dapo CLI in a subprocess (its own process group, timed out at the hard stop),
    echoing its progress lines; returns its wall seconds. Raises guard.Stopped when the
    hard stop ended it, RuntimeError with the log's tail when it failed."""
    env = dict(
        os.environ, RAY_AUTH_MODE="disabled", RAY_USAGE_STATS_ENABLED="0", PYTHONUNBUFFERED="1"
    )

    def echo(line: str) -> None:
        if line.startswith(ECHO):
            log(f"{label}: {line.rstrip()}")

    timeout = stop.child_timeout()
    code_, wall = guard.run_child(
        [sys.executable, "-c", code, *cli_args],
        logfile,
        timeout_s=timeout,
        echo=echo,
        env=env,
        cwd=REPO,
    )
    if code_ is None:
        raise guard.Stopped(f"hard stop: {label} ended after {wall:.0f} s (its timeout)")
    if code_ != 0:
        tail = logfile.read_text(errors="replace")[-6000:]
        raise RuntimeError(f"{label} exited {code_} after {wall:.0f} s; log {logfile}:\n{tail}")
    log(f"{label}: done in {wall:.1f} s")
    return wall


class GpuRun:
    """One run: the JSON so far (written after every phase), the hard stop, the logs."""

    def __init__(self, args: argparse.Namespace, ctx: dict[str, Any], out: Path) -> None:
        self.args, self.ctx, self.out = args, ctx, out
        self.logs_out = out.with_name(out.stem + "_logs.txt")
        started = os.environ.get("GPU_RUN_STARTED")
        self.stop = guard.HardStop(args.hard_stop_s or None, float(started) if started else None)
        self.work = args.work_dir or Path(tempfile.mkdtemp(prefix="gpu-run-"))
        self.work.mkdir(parents=True, exist_ok=True)
        self.stopped: str | None = None
        self.state: dict[str, dict[str, Any]] = {}  # per model: arch, paths, timed rows
        # The phases after the timed run this run plans (partial: one of them not done).
        self.later = tuple(p for p in LATER if not (p == "hf_generate" and args.no_hf_generate))
        self.tails: dict[str, str] = {}  # log path -> its last lines (kept once deleted)
        peak = ctx["peak"]
        self.result: dict[str, Any] = {
            "status": "running",
            "device": ctx["device"],
            "gpu_mem_gib": ctx["gpu_mem_gib"] if ctx["device_kind"] == "cuda" else None,
            "versions": steps.versions(),
            "spec": "local spec, no Transformer Engine",
            "generation_backend": "megatron (Megatron-Core inference on the policy's model)",
            "logprob_path": "triton (impl=auto, bf16 on CUDA)"
            if ctx["device_kind"] == "cuda"
            else "chunked torch (impl=auto on CPU)",
            "mfu_peak": None if peak is None else {"name": peak.name, "tflops": peak.tflops},
            "mfu_note": None
            if peak is not None
            else (
                "no CUDA device: MFU needs a card's dense bf16 peak"
                if ctx["device_kind"] == "cpu"
                else f"no known dense bf16 peak for {ctx['device']}"
            ),
            "peak_gib_measured_note": "torch.cuda max_memory_allocated/reserved of the policy "
            "rank per phase (device/phase_memory.py); null without CUDA",
            "peak_gib_planned_note": "dapo-plan's model (planning/memory.py) for the same "
            "recipe and card size; it plans a generation phase for vLLM engines only: null here",
            "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
            "logs": self.logs_out.name,
            "models": {},
            "details": {},
        }

    # -- bookkeeping ------------------------------------------------------------------

    def details(self, preset: str) -> dict[str, Any]:
        return self.result["details"].setdefault(
            preset, {"phases_done": [], "wall_s": {}, "errors": {}, "skipped": {}}
        )

    def save(self) -> None:
        """The JSON and the log tails so far (atomically: a kill never leaves half a file)."""
        self.result["wall_s"] = round(self.stop.elapsed(), 1)
        self.out.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.out.with_name(self.out.name + ".tmp")
        tmp.write_text(json.dumps(self.result, indent=2) + "\n")
        tmp.replace(self.out)
        self.save_logs()

    def save_logs(self) -> None:
        """Tails of every child's log and Ray worker's log under the work directory (a
        model's directory, once deleted, keeps its last tails), after every error."""
        logs = sorted(self.work.glob("*/*.log"), key=lambda p: p.stat().st_mtime)
        logs += sorted(self.work.glob("*/*/logs/workers/*.log"))
        for path in logs:
            with_tail = guard.tail(path, 60 if "workers" in path.parts else 80)
            self.tails[str(path.relative_to(self.work))] = with_tail
        errors = [
            f"===== error: {preset} {phase}\n{text}\n"
            for preset, d in self.result["details"].items()
            for phase, text in d.get("errors", {}).items()
        ]
        sections = [f"===== {name}\n{text}" for name, text in self.tails.items()]
        guard.write_text(self.logs_out, "".join(errors) + "".join(sections))

    def phase(self, preset: str, name: str, fn: Callable[[], None]) -> bool:
        """Run one phase of a model: not started past ``--deadline-s`` or too close to the
        hard stop; its error recorded (the run goes on); the JSON written after it. A hard
        stop or SIGTERM (guard.Stopped) ends the run: recorded, then raised."""
        d = self.details(preset)
        left = self.stop.left()
        elapsed = self.stop.elapsed()
        if self.args.deadline_s is not None and elapsed > self.args.deadline_s:
            d["skipped"][name] = f"--deadline-s {self.args.deadline_s:g} passed ({elapsed:.0f} s)"
        elif left < guard.MIN_PHASE_S:
            d["skipped"][name] = f"hard stop: {left:.0f} s left"
            self.stopped = self.stopped or f"hard stop: {left:.0f} s left, phases not started"
        if name in d["skipped"]:
            log(f"{preset} {name}: skipped ({d['skipped'][name]})")
            self.save()
            return False
        started = time.perf_counter()
        ok = False
        try:
            with guard.alarm(None if left == float("inf") else left):
                fn()
            ok = True
            d["phases_done"].append(name)
        except PhaseSkipped as e:
            d["skipped"][name] = str(e)
            log(f"{preset} {name}: skipped ({e})")
        except guard.Stopped as e:
            d["errors"][name] = self.stopped = str(e)
            log(f"{preset} {name}: STOPPED: {e}")
            raise
        except Exception as e:  # noqa: BLE001 - recorded; the other phases still run
            d["errors"][name] = f"{type(e).__name__}: {e}"[-8000:]
            log(f"{preset} {name}: FAILED: {str(e)[:2000]}")
        finally:
            d["wall_s"][name] = round(time.perf_counter() - started, 1)
            entry = self.result["models"].get(preset)
            if entry is not None:
                entry["phases_done"] = list(d["phases_done"])
                entry["partial"] = not set(("timed", *self.later)) <= set(d["phases_done"])
            self.save()
        return ok

    # -- the phases -------------------------------------------------------------------

    def run_all(self) -> None:
        """Every model's timed run, then every model's later phases (module docstring)."""
        from dapo_megatron.config.model_arch import PRESETS

        presets = [m for m in self.args.models.split(",") if m]
        free = shutil.disk_usage(self.work).free
        disk = guard.plan_disk(free, {p: PRESETS[p].num_parameters() for p in presets})
        self.result["disk"] = {
            "work_dir": str(self.work),
            "free_gib": round(free / 2**30, 1),
            "notes": disk.notes,
        }
        for preset, note in disk.notes.items():
            log(f"{preset}: disk: {note}")
            self.details(preset)["skipped"]["disk"] = note
        self.save()
        for preset in disk.timed:
            self.state[preset] = {"arch": PRESETS[preset], "root": self.work / preset}
            if not self.phase(preset, "checkpoint", lambda p=preset: self.make_model(p)):
                continue
            if self.ctx["device_kind"] == "cuda":
                self.phase(preset, "kernel_check", lambda p=preset: self.kernel_check(p))
                if "decode_check" not in self.result:
                    self.phase(preset, "decode_check", lambda p=preset: self.decode_check(p))
            self.phase(preset, "timed", lambda p=preset: self.timed(p))
        for preset in disk.timed:
            if preset in disk.full:
                for name in self.later:
                    self.phase(preset, name, lambda p=preset, n=name: getattr(self, n)(p))
            if not self.args.work_dir:  # 1.7B: model, checkpoint and export ~35 GB
                self.save_logs()  # its logs' tails before they go
                shutil.rmtree(self.state[preset]["root"], ignore_errors=True)

    def make_model(self, preset: str) -> None:
        from dapo_megatron.data.tiny_model import create_tiny_model

        st = self.state[preset]
        started = time.perf_counter()
        st["model"] = st["root"] / "model"
        create_tiny_model(st["model"], arch=st["arch"], seed=self.args.seed)
        log(
            f"{preset}: random checkpoint ({st['arch'].num_parameters() / 1e9:.3f} B "
            f"parameters) in {time.perf_counter() - started:.1f} s"
        )

    def overrides(self, preset: str, run: str, steps_: int, checkpoint: bool) -> list[str]:
        st = self.state[preset]
        return overrides(
            self.args,
            preset,
            st["model"],
            st["root"] / run,
            device=self.ctx["device_kind"],
            steps=steps_,
            checkpoint=checkpoint,
        )

    def kernel_check(self, preset: str) -> None:
        d = self.details(preset)
        try:
            d["kernel_check"] = steps.kernel_check(self.state[preset]["arch"])
        except guard.Stopped:
            raise
        except Exception as e:
            # The runs take the torch paths instead: timed figures rather than a crash.
            os.environ["DAPO_NO_TRITON"] = "1"
            self.result["logprob_path"] = "chunked torch (DAPO_NO_TRITON=1: kernel check failed)"
            d["kernel_check"] = {"ok": False, "error": f"{type(e).__name__}: {e}"[:4000]}
            raise
        log(f"{preset}: kernel check ok ({d['kernel_check']})")

    def decode_check(self, preset: str) -> None:
        """The engine's CUDA-graph decode against eager (bench/decode_step.py); on any
        failure the runs decode eagerly (generation.engine.enforce_eager) and say so."""
        out = self.work / "decode_step.json"
        self.result["decode_check"] = {"graph_check": {"graph_ok": False, "error": "no result"}}
        try:
            label = f"{preset} decode check"
            run_cli(
                steps.DECODE_CHECK,
                steps.decode_check_args(preset, out),
                out.with_suffix(".log"),
                label,
                self.stop,
            )
            self.result["decode_check"] = steps.decode_check_result(out)
        finally:
            if not self.result["decode_check"]["graph_check"]["graph_ok"]:
                self.args.train_overrides.append("generation.engine.enforce_eager=true")
        log(f"{preset}: decode check {self.result['decode_check']}")

    def timed(self, preset: str) -> None:
        st, args = self.state[preset], self.args
        arch = st["arch"]
        st["timed_ov"] = timed_ov = self.overrides(preset, "timed", args.steps, False)
        run_cli(
            TRAIN,
            ["--config", str(BASE), *timed_ov],
            st["root"] / "timed.log",
            f"{preset} timed",
            self.stop,
        )
        st["rows"] = rows = figures.metrics_rows(st["root"] / "timed")
        shape = figures.Shape(
            matmul_params=figures.matmul_params(
                arch.num_parameters(), arch.vocab_size, arch.hidden_size, arch.tie_word_embeddings
            ),
            num_layers=arch.num_layers,
            query_width=arch.query_width,
        )
        prompt_tokens = steps.mean_prompt_tokens(st["model"], timed_ov)
        step = figures.step_figures(
            rows,
            shape=shape,
            samples_per_step=args.prompts * args.samples,
            mean_prompt_tokens=prompt_tokens,
            peak=self.ctx["peak"],
        )
        self.details(preset).update(
            mean_prompt_tokens=prompt_tokens,
            train_tokens_per_step=step.pop("train_tokens_per_step"),
            mean_seq_len=step.pop("mean_seq_len"),
            response_length_mean=figures.median_of(
                figures.timed_rows(rows), "response_length/mean"
            ),
            timed_steps=len(figures.timed_rows(rows)),
        )
        entry = figures.model_entry(
            {
                "model": preset,
                "params": arch.num_parameters(),
                **step,
                "peak_gib_measured": figures.measured_peaks(rows),
                "peak_gib_planned": steps.planned_peaks(timed_ov, self.ctx["gpu_mem_gib"]),
                "resume_bit_exact": None,
                "export_ok": None,
                "hf_generate_tokens_per_s": None,
                "phases_done": [],
                "partial": True,
            }
        )
        self.result["models"][preset] = entry
        log(f"{preset}: " + ", ".join(f"{k}={figures.fmt(v)}" for k, v in entry.items()))

    def resume(self, preset: str) -> None:
        """One step with its checkpoint, then steps 2..last from it (no second checkpoint).
        Step 3 depends on the restored Adam moments too, step 2 only on the restored
        weights, data order and sampling state."""
        st, d = self.state[preset], self.details(preset)
        if "rows" not in st:
            raise PhaseSkipped("no timed run to compare with")
        last = min(self.args.steps, 3)
        root = st["root"]
        for part, (steps_, ckpt) in enumerate(((1, True), (last, False)), start=1):
            run_cli(
                TRAIN,
                ["--config", str(BASE), *self.overrides(preset, "resumed", steps_, ckpt)],
                root / f"resume{part}.log",
                f"{preset} resume {part}/2",
                self.stop,
            )
        resumed_text = (root / "resume2.log").read_text()
        straight, resumed = (
            figures.by_step(st["rows"]),
            figures.by_step(figures.metrics_rows(root / "resumed")),
        )
        if any(k not in resumed for k in range(2, last + 1)) or "[resume]" not in resumed_text:
            mismatches = ["the second part did not resume from the step-1 checkpoint"]
        else:
            mismatches = [
                f"step {k}: {m}"
                for k in range(2, last + 1)
                for m in figures.resume_mismatches(straight[k], resumed[k])
            ]
        d["resume_mismatches"] = mismatches
        # Step 1 of both runs starts from the same weights without any resume: a difference
        # there is the device's non-determinism, not the checkpoint's (it tells them apart).
        step1 = resumed.get(1)
        d["step1_mismatches"] = (
            figures.resume_mismatches(straight[1], step1) if step1 and 1 in straight else None
        )
        self.result["models"][preset]["resume_bit_exact"] = not mismatches

    def export(self, preset: str) -> None:
        st, d = self.state[preset], self.details(preset)
        checkpoint = st["root"] / "resumed" / "checkpoints" / "step_000001"
        if not checkpoint.is_dir():
            raise PhaseSkipped(f"no step-1 checkpoint ({checkpoint})")
        hf_dir = st["root"] / "hf"
        run_cli(
            EXPORT,
            ["--checkpoint", str(checkpoint), "--out", str(hf_dir)],
            st["root"] / "export.log",
            f"{preset} export",
            self.stop,
        )
        export_ok, d["export"] = steps.check_export(hf_dir, st["arch"])
        log(f"{preset}: export_ok={export_ok} ({d['export']})")
        if preset in self.result["models"]:
            self.result["models"][preset]["export_ok"] = export_ok

    def hf_generate(self, preset: str) -> None:
        try:
            tps = steps.hf_generate_tps(
                self.state[preset]["model"], self.args, self.ctx["device_kind"]
            )
        finally:
            steps.release_cuda_cache()  # its blocks back before the next model
        log(f"{preset}: transformers generate {tps:.0f} tokens/s")
        if preset in self.result["models"]:
            self.result["models"][preset]["hf_generate_tokens_per_s"] = tps


def main(argv: list[str] | None = None) -> int:
    """Run every model, write the JSON, print the table; 0 when a model has timed figures."""
    import signal

    ctx = steps.device_context()
    args = parse_args(argv, ctx["device_kind"] == "cuda")
    slug = figures.device_slug(ctx["device"] if ctx["device_kind"] == "cuda" else None)
    out = args.out or REPO / "bench" / "results" / f"gpu_run_{slug}.json"
    run = GpuRun(args, ctx, out)
    if ctx["device_kind"] != "cuda":
        run.result["kernel_check"] = (
            "skipped: no CUDA device (the policy runs the chunked torch path)"
        )
    log(
        f"device {ctx['device']}; models {args.models}; out {out}; hard stop "
        f"{run.stop.left():.0f} s from now"
    )
    previous = guard.stop_on_sigterm()
    try:
        run.save()  # the JSON exists from the first second
        run.run_all()
    except (guard.Stopped, KeyboardInterrupt) as e:
        run.stopped = run.stopped or str(e) or type(e).__name__
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the wrap-up is not interrupted
        guard.stop_children()
        run.result["status"] = "done" if run.stopped is None else f"stopped: {run.stopped}"
        run.save()
        if not args.work_dir:
            shutil.rmtree(run.work, ignore_errors=True)
        signal.signal(signal.SIGTERM, previous)
    if run.result["models"]:
        print(figures.summary_table(run.result["models"]), flush=True)
    log(f"wrote {out} and {run.logs_out.name} in {run.result['wall_s']} s: {run.result['status']}")
    timed = [p for p, e in run.result["models"].items() if "timed" in e["phases_done"]]
    return 0 if timed else 1


if __name__ == "__main__":
    raise SystemExit(main())
