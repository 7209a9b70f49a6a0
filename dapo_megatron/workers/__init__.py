"""Ray actor classes: PolicyWorker (one per Megatron rank)."""
