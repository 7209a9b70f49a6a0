# Shortcuts for the scripts in scripts/ (the README's commands work without make).
.PHONY: setup test train lint format

setup:
	bash scripts/setup.sh

test:
	bash scripts/test.sh

train:
	bash scripts/train_tiny.sh

lint:
	.venv/bin/ruff check dapo_megatron tests bench

format:
	.venv/bin/ruff format dapo_megatron tests bench
