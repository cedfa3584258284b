"""Configs (draccus dataclasses) as users write them in YAML, and what they build: caches, datasets, loaders.

Sources and mixtures (``sources``, ``mixture``), the tokenizer settings that make a cache's identity
(``tokenization``), building and opening a config's caches (``caches``), reading a config from YAML
or a mapping (``loading``). Nothing in the stages below imports a config class.
"""

from typing import TYPE_CHECKING

from tokenmix._lazy import lazy_exports

if TYPE_CHECKING:
    from tokenmix.config.caches import CacheTarget, build_caches, cache_targets, open_cache
    from tokenmix.config.loading import ConfigError, load_data_config
    from tokenmix.config.mixture import DataConfig, LMDatasetConfig, LMMixtureDatasetConfig
    from tokenmix.config.sources import LMDatasetSourceConfig, PackingConfig
    from tokenmix.config.token_file_source import TokenFilesConfig
    from tokenmix.config.tokenization import TokenizationConfig

__all__ = [
    "CacheTarget",
    "ConfigError",
    "DataConfig",
    "LMDatasetConfig",
    "LMDatasetSourceConfig",
    "LMMixtureDatasetConfig",
    "PackingConfig",
    "TokenFilesConfig",
    "TokenizationConfig",
    "build_caches",
    "cache_targets",
    "load_data_config",
    "open_cache",
]
_exports, __getattr__, __dir__ = lazy_exports(__name__, __file__)
