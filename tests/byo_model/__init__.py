"""A model of a user's own, as docs/models.md describes: a torch-free spec module (spec.py), the module
(model.py), and the YAML a user would keep in their own config folder (``write_user_conf``)."""

from __future__ import annotations

from pathlib import Path

import yaml

#: the user's conf/model/mlp_lm.yaml
YAML = {
    "_target_": "tests.byo_model.model.MLPLM",
    "name": "mlp_lm",
    "spec": "tests.byo_model.spec:SPEC",
    "vocab_size": 256,
    "width": 32,
    "n_blocks": 4,
}


def write_user_conf(folder: Path) -> str:
    """Write ``folder/conf/model/mlp_lm.yaml``; returns the override that adds it to Hydra's search path."""
    conf = folder / "conf"
    (conf / "model").mkdir(parents=True)
    (conf / "model" / "mlp_lm.yaml").write_text(yaml.safe_dump(YAML))
    return f"hydra.searchpath=[file://{conf}]"
