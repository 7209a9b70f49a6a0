"""Datasets, prompt templates, the synthetic task, tokenizers and the policy batch format."""
