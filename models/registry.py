"""The models meshtrain knows, by config schema name. No torch import: validation and the planner read it."""

from __future__ import annotations

from models.cnn.config import CNNConfig
from models.gpt.config import GPTConfig, GPTDescriptionConfig

#: schema name in ConfigStore's ``model`` group -> dataclass (conf/model/*.yaml extend one of these)
MODEL_SCHEMAS = {
    "gpt_schema": GPTConfig,
    "gpt_description_schema": GPTDescriptionConfig,
    "cnn_schema": CNNConfig,
}
