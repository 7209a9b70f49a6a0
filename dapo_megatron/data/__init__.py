"""Datasets, prompt templates, the synthetic task, tokenizers and the policy batch format.

Importing the package stays light: transformers, tokenizers and pyarrow are imported only by
the functions that need them. `create_tiny_model` is imported from dapo_megatron.data.tiny_model
(not re-exported here, so that ``python -m dapo_megatron.data.tiny_model`` runs cleanly).
"""

from dapo_megatron.data.arithmetic import make_problems, make_train_val_split
from dapo_megatron.data.datasets import (
    DatasetSplits,
    EncodedPrompts,
    PromptDataset,
    build_datasets,
    encode_prompts,
    load_prompt_file,
)
from dapo_megatron.data.records import PromptRecord
from dapo_megatron.data.sampler import PromptSampler
from dapo_megatron.data.tokenizer import build_char_tokenizer

__all__ = [
    "DatasetSplits",
    "EncodedPrompts",
    "PromptDataset",
    "PromptRecord",
    "PromptSampler",
    "build_char_tokenizer",
    "build_datasets",
    "encode_prompts",
    "load_prompt_file",
    "make_problems",
    "make_train_val_split",
]
