"""dapo-megatron: DAPO training recipes on Megatron-Core."""

__version__ = "0.1.0"
