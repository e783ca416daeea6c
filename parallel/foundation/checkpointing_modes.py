"""``trainer.activation_checkpointing``'s modes, which are also the planner's recomputation choices: the one list
(the schema types the key with it, the registry, the planner and parallel/techniques/checkpointing.py read it).

- ``none``: every activation is kept for the backward pass;
- ``selective``: matmul outputs kept, the cheap element-wise and softmax ops recomputed (with
  ``trainer.ac_every=k > 1``: every k-th block recomputed in full instead);
- ``full``: each block recomputed in backward from its input.

No torch import: the schema and validation read it.
"""

from __future__ import annotations

#: in the order of less memory and more recomputation
AC_MODES = ("none", "selective", "full")
