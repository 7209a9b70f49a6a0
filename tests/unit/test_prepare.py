"""dapo-prepare and dry runs of recipes that name hub inputs, against the fake hub of
unit/fake_hub.py (never the network; the HF cache and every output in tmp_path)."""

from __future__ import annotations

from pathlib import Path

import pytest

from dapo_megatron.cli import train_main
from dapo_megatron.data import hub
from dapo_megatron.data.tiny_model import create_tiny_model
from dapo_megatron.prepare import main as prepare_main
from dapo_megatron.shared.commands import tool_command
from unit.fake_hub import (
    COMMIT,
    REAL_OFFLINE_REASON,
    FakeHub,
    add_gsm8k,
    add_model,
    fake_hub,  # noqa: F401 - the fixture
)

REPO = Path(__file__).resolve().parents[2]
RECIPE = REPO / "recipes" / "dapo-tiny-cpu.yaml"
MODEL = "fake-org/Tiny-Model"


def hub_overrides(tmp_path: Path, model: str = MODEL) -> list[str]:
    """The tiny recipe reading GSM8K from the hub, with a hub (or local) model."""
    return [
        f"run.output_dir={tmp_path / 'run'}",
        f"policy.model_name_or_path={model}",
        "policy.init_model_if_missing=false",
        "data.format=gsm8k",
        "data.train_path=hf://openai/gsm8k",
        "data.val_path=hf://openai/gsm8k:test",
        "reward.verifier=gsm8k",
    ]


def test_prepare_fetches_data_and_model_and_prints_where(
    fake_hub: FakeHub,  # noqa: F811
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    add_gsm8k(fake_hub)
    add_model(fake_hub)
    assert prepare_main(["--config", str(RECIPE), *hub_overrides(tmp_path)]) == 0
    out = capsys.readouterr().out
    snapshot = fake_hub.cache / "models--fake-org--Tiny-Model" / "snapshots" / COMMIT
    assert f"policy.model_name_or_path = {MODEL} -> {snapshot}" in out
    converted = tmp_path / "dapo-megatron" / "datasets" / "openai--gsm8k" / COMMIT
    assert f"data.train_path = hf://openai/gsm8k -> {converted / 'train.gsm8k.jsonl'}" in out
    assert "data.val_path=hf://openai/gsm8k:test" not in out  # printed as the local path
    assert f"data.val_path={converted / 'test.gsm8k.jsonl'}" in out
    assert hub.model_snapshot_complete(snapshot)
    # Everything is cached now: a second run downloads nothing.
    downloads = len(fake_hub.downloads)
    assert prepare_main(["--config", str(RECIPE), *hub_overrides(tmp_path)]) == 0
    assert len(fake_hub.downloads) == downloads
    assert not (tmp_path / "run").exists()


def test_prepare_of_a_local_recipe_fetches_nothing(
    fake_hub: FakeHub,  # noqa: F811
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    model = f"policy.model_name_or_path={tmp_path / 'model'}"
    assert prepare_main(["--config", str(RECIPE), model]) == 0
    assert "names nothing on the hub" in capsys.readouterr().out
    assert fake_hub.downloads == []


def test_prepare_offline_names_what_is_missing(
    fake_hub: FakeHub,  # noqa: F811
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setattr(hub, "offline_reason", REAL_OFFLINE_REASON)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert prepare_main(["--config", str(RECIPE), *hub_overrides(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "error: data.train_path = hf://openai/gsm8k: not in the Hugging Face cache" in err
    assert "error: policy.model_name_or_path = fake-org/Tiny-Model: not in the" in err


def test_dry_run_of_hub_names_downloads_and_plans(
    fake_hub: FakeHub,  # noqa: F811
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    add_gsm8k(fake_hub)
    add_model(fake_hub)
    args = ["--config", str(RECIPE), "--dry-run", *hub_overrides(tmp_path)]
    assert train_main(args) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    assert "dry run: configuration, data, model, tokenizer and devices are valid" in out
    assert f"[setup] policy.model_name_or_path = {MODEL} -> " in out
    assert "[setup] data.val_path = hf://openai/gsm8k:test -> " in out
    assert not (tmp_path / "run").exists()


def test_dry_run_offline_names_dapo_prepare(
    fake_hub: FakeHub,  # noqa: F811
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    add_model(fake_hub)
    # Validation found config.json (fetched earlier); the weights never came.
    fake_hub.download(MODEL, "model", ["config.json"], fake_hub.cache)
    monkeypatch.setattr(hub, "offline_reason", REAL_OFFLINE_REASON)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    args = ["--config", str(RECIPE), "--dry-run", *hub_overrides(tmp_path)]
    assert train_main(args) == 2
    err = capsys.readouterr().err
    assert "3 problems found before starting" in err, err
    assert "data.train_path = hf://openai/gsm8k: not in the Hugging Face cache" in err
    assert "data.val_path = hf://openai/gsm8k:test: not in the Hugging Face cache" in err
    assert f"policy.model_name_or_path = {MODEL}: not complete in the Hugging Face cache" in err
    assert err.count(f"`{tool_command('dapo-prepare')} --config RECIPE`") == 3
    # A local model and only the data on the hub: one problem, one line.
    local = create_tiny_model(tmp_path / "local-model", seed=0)
    args = ["--config", str(RECIPE), "--dry-run", *hub_overrides(tmp_path, str(local))]
    assert train_main(args) == 2
    err = capsys.readouterr().err
    assert "2 problems found before starting" in err, err
    assert "- data.train_path = hf://openai/gsm8k: not in the Hugging Face" in err
    assert (
        "HF_HUB_OFFLINE is set" in err and f"{tool_command('dapo-prepare')} --config RECIPE" in err
    )


# --------------------------------------------------------------- local inputs that are missing


def hint(local: str, hub_id: str, args: str) -> str:
    """The one line of a missing local model named like a released one."""
    key = "policy.model_name_or_path"
    command = f"{tool_command('dapo-prepare')} {args} {key}={hub_id}"
    return (
        f"{key} = {local} does not exist; "
        + (
            f"it names the hub model {hub_id}"
            if not hub_id.startswith("ORG/")
            else "if it is a hub model, its org is unknown here (ORG: its owner on huggingface.co)"
        )
        + f": fetch it with `{command}` (where there is internet) and run with {key}={hub_id}, "
        f"or copy the model into {local}"
    )


@pytest.mark.parametrize(
    ("local", "hub_id", "arch"),
    [  # arch: null where the name is a preset's (validation plans it by its name)
        ("models/Qwen3-0.6B-Base", "Qwen/Qwen3-0.6B-Base", "null"),
        ("models/Qwen2.5-Math-7B", "Qwen/Qwen2.5-Math-7B", "null"),
        ("/data/Meta-Llama-3.1-8B-Instruct", "meta-llama/Meta-Llama-3.1-8B-Instruct", "null"),
        (
            "checkpoints/DeepSeek-R1-Distill-Qwen-7B",
            "deepseek-ai/DeepSeek-R1-Distill-Qwen-7B",
            "tiny-qwen2",
        ),
        ("models/Foo-7B-Chat", "ORG/Foo-7B-Chat", "tiny-qwen2"),
    ],
)
def test_a_missing_local_model_names_its_hub_id_and_the_command(
    local: str,
    hub_id: str,
    arch: str,
    fake_hub: FakeHub,  # noqa: F811
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # The README: "the model in models/<HF name>". Before, models/Qwen3-0.6B-Base (no
    # models/ folder yet) was taken for a hub id: the hub was asked for "models/Qwen3-0.6B-
    # Base" and, offline, the error sent the user to run dapo-prepare, which asked the same.
    monkeypatch.chdir(tmp_path)
    run = tmp_path / "run"
    rest = f"policy.init_model_if_missing=false policy.model_arch={arch}"
    overrides = [f"run.output_dir={run}", f"policy.model_name_or_path={local}", *rest.split()]
    assert train_main(["--config", str(RECIPE), "--dry-run", *overrides]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        f"error: {hint(local, hub_id, f'--config {RECIPE} run.output_dir={run} {rest}')}"
    ]
    # dapo-prepare says the same, with its own arguments, and asks the hub nothing.
    assert prepare_main(["--config", str(RECIPE), *overrides[1:]]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"error: {hint(local, hub_id, f'--config {RECIPE} {rest}')}"]
    assert fake_hub.downloads == []


def test_prepare_names_every_missing_data_file(
    fake_hub: FakeHub,  # noqa: F811
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # Before: a recipe whose data were local paths "names nothing on the hub", exit 0, with
    # both files missing; the cluster run was the first to notice.
    model = create_tiny_model(tmp_path / "model", seed=0)
    common = ["--config", str(RECIPE), f"policy.model_name_or_path={model}", "data.format=gsm8k"]
    train, val = tmp_path / "data" / "train.jsonl", tmp_path / "data" / "val.jsonl"
    assert prepare_main([*common, f"data.train_path={train}", f"data.val_path={val}"]) == 2
    out = capsys.readouterr()
    assert out.err.splitlines() == [
        f"error: data.train_path: {train} does not exist; point it at a local .jsonl or "
        ".parquet file or name a hub dataset as hf://Org/Name (docs/guides/data.md)",
        f"error: data.val_path: {val} does not exist; point it at a local .jsonl or "
        ".parquet file or name a hub dataset as hf://Org/Name (docs/guides/data.md)",
    ]
    assert "names nothing on the hub" not in out.out
    # One on the hub that cannot be fetched, one local file missing: both named, each by its
    # key and its source.
    monkeypatch.setattr(hub, "offline_reason", REAL_OFFLINE_REASON)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert prepare_main([*common, "data.train_path=hf://openai/gsm8k", f"data.val_path={val}"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 2, err
    assert err[0].startswith("error: data.train_path = hf://openai/gsm8k: not in the Hugging")
    assert err[1].startswith(f"error: data.val_path: {val} does not exist")
    # Both present: nothing on the hub, nothing missing.
    for path in (train, val):
        path.parent.mkdir(exist_ok=True)
        path.write_text('{"question": "1+1", "answer": "#### 2"}\n')
    assert prepare_main([*common, f"data.train_path={train}", f"data.val_path={val}"]) == 0
    assert "names nothing on the hub" in capsys.readouterr().out
