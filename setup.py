"""dapo-megatron: DAPO training recipes on Megatron-Core."""

from pathlib import Path

from setuptools import find_packages, setup

setup(
    name="dapo-megatron",
    version="0.1.0",
    description="DAPO (Decoupled Clip and Dynamic sAmpling Policy Optimization) on Megatron-Core",
    long_description=(Path(__file__).parent / "README.md").read_text(encoding="utf-8"),
    long_description_content_type="text/markdown",
    python_requires=">=3.11",
    packages=find_packages(include=["dapo_megatron", "dapo_megatron.*"]),
    include_package_data=True,
    install_requires=[
        # torch is pinned by scripts/setup.sh (CPU wheel on disk); any >= 2.6 works here.
        "torch>=2.6",
        # 0.16.1 is the newest release with a Python 3.11 wheel; newer ones need 3.12.
        "megatron-core>=0.16.1",
        "ray>=2.40",
        "pyyaml>=6.0",
        "triton>=3.0",
        "math-verify>=0.7",
        "transformers>=4.45",
        "tokenizers>=0.20",
        "safetensors>=0.4",
        "numpy",
        "psutil",
        "pyarrow",  # parquet datasets (DAPO-Math-17k, AIME24)
        "tensorboardX",  # TensorBoard event files without the tensorboard server package
        "matplotlib",  # PNG plots of a run
        "tqdm",
    ],
    extras_require={
        "test": [
            "pytest>=8",
            "hypothesis>=6.100",
            "pytest-timeout>=2.3",
            # scripts/test.sh runs the suite on 2 workers (-n): CI time is a budget.
            "pytest-xdist>=3.5",
            "ruff>=0.6",
            "mypy==2.4.1",
        ],
        # Pinned: the code is written against vLLM 0.32.0's APIs (worker_extension_cls,
        # collective_rpc, reload_weights, sleep/wake_up tags); vllm 0.32.0 itself requires
        # torch==2.13.0. Transformer Engine: megatron-core 0.16.1 is tested with
        # >=2.9,<2.12 (its `dev` extra in the wheel's METADATA) and its TE layers call TE
        # internals that change between releases, so the newest release in that range.
        # `pip install --dry-run "transformer-engine[pytorch]==2.11.0" torch==2.13.0
        # vllm==0.32.0` resolves (transformer_engine_torch 2.11.0 is an sdist; core
        # transformer_engine_cu13). Install the GPU stack with `bash scripts/setup_gpu.sh`,
        # not with this extra alone: the sdist's [build-system] asks for an unpinned
        # torch>=2.1, so pip's isolated build compiles it against the newest torch instead of
        # 2.13.0 and its import then fails with an undefined symbol. The script installs
        # torch==2.13.0 (CUDA) first, then vllm==0.32.0, then TE with --no-build-isolation;
        # dapo-train --dry-run names an ABI mismatch in one line (config/run_plan.py).
        "gpu": ["vllm==0.32.0", "transformer-engine[pytorch]==2.11.0"],
    },
    entry_points={
        "console_scripts": [
            "dapo-train=dapo_megatron.cli:train_main",
            "dapo-plan=dapo_megatron.cli:plan_main",
            "dapo-export=dapo_megatron.cli:export_main",
            "dapo-import-config=dapo_megatron.migrate.import_config:main",
            "dapo-prepare=dapo_megatron.prepare:main",
        ]
    },
)
