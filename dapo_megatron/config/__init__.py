"""Configuration: typed schema, YAML loading with `defaults:` inheritance, validation."""

from dapo_megatron.config.errors import ConfigError
from dapo_megatron.config.loader import LoadedConfig, load_config
from dapo_megatron.config.schema import DapoMegatronConfig

__all__ = ["ConfigError", "DapoMegatronConfig", "LoadedConfig", "load_config"]
