"""Foreign-config translation: NeMo RL, SkyRL, RLinf and verl configs -> our recipes.

    dialects.py       entry builders (ForeignKey, same/mapped/choice/custom), tiers
    dialect_keys.py   the table FOREIGN_KEYS (the four systems' tables joined) and its
                      lookups (foreign_key, explain_foreign)
    nemo_keys.py, skyrl_keys.py, rlinf_keys.py, verl_keys.py
                      one system's keys and their converters each
    shared_keys.py    the system names and the notes several tables share
    foreign_source.py reading a source: YAML, Hydra defaults, shell scripts, overrides
    import_config.py  `dapo-import-config`: translate, refuse, write the recipe

migrate/ may import config/; config/ never imports migrate/. Importing this package
registers the table's explainer with config/foreign_hint.py, so the loader's "unknown key"
errors name our equivalent of another system's key.
"""

from dapo_megatron.config.foreign_hint import register_foreign_explainer
from dapo_megatron.migrate.dialect_keys import explain_foreign

register_foreign_explainer(explain_foreign)
