"""Tests of dapo_megatron/planning/trace (the memory tracer's planner side)."""
