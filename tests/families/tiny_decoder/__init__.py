"""A dense decoder family added the documented way (docs/models.md, "Adding a family"), entirely inside tests/: its
schema (config.py), its ``ModelSpec`` (spec.py), its module (model.py: Llama's blocks), and the YAML a user writes
(``write_conf``). Nothing in conf/, models/, parallel/ or trainer/ names it."""

from __future__ import annotations

from pathlib import Path

import yaml

#: conf/model/tiny_decoder.yaml: extends the family's schema, which ConfigStore holds once the family is registered
YAML = {
    "defaults": ["/schema/model/tiny_decoder@_here_", "_self_"],
    "name": "tiny_decoder",
    "n_layers": 2,
    "d_model": 32,
    "n_heads": 4,
    "n_kv_heads": 2,
    "d_ff": 64,
    "max_seq_len": "${data.seq_len}",
}


def write_conf(folder: Path) -> str:
    """Write ``folder/conf/model/tiny_decoder.yaml``; returns the override adding it to Hydra's search path."""
    conf = folder / "conf"
    (conf / "model").mkdir(parents=True)
    (conf / "model" / "tiny_decoder.yaml").write_text(yaml.safe_dump(YAML))
    return f"hydra.searchpath=[file://{conf}]"
