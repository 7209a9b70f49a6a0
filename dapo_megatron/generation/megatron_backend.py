"""The Megatron-Core generation backend (implementation: ``dapo_megatron.megatron.inference``).

Everything that imports megatron.core lives under ``dapo_megatron/megatron``; this module
gives the backend its place next to the other backends of the generation interface.
"""

from dapo_megatron.megatron.inference import MegatronGenerationBackend, sample_next_tokens

__all__ = ["MegatronGenerationBackend", "sample_next_tokens"]
