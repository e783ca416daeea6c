"""Third-party start-up noise filtered out, exactly: torchao (a dependency, for ``trainer.precision=fp8``) tries at import
to load its CUDA kernels' libraries and, on a CPU build, logs one ``Failed to load .../torchao/_C_....so`` warning per
library, and registers two enums with torch's pytree, which logs a deprecation for each. transformers, peft and
lm-eval import torchao whenever it is installed, so every call of theirs printed these. The filters drop those records
only: any other warning of torchao's, or of torch's pytree, still shows. Installed when ``conf``, ``models`` or
``trainer`` is imported (before torchao is)."""

from __future__ import annotations

import logging
import re

#: torchao's own logger: "Failed to load <torchao>/_C<name>.so: <why>"
KERNEL_LIBRARY = re.compile(r"^Failed to load \S*torchao[/\\]_C\w*\.\S*\.?so\b")
#: torch's pytree deprecation, for the enums torchao registers at import
TORCHAO_ENUMS = re.compile(r"^<enum '(KernelPreference|ScaleCalculationMode)'> is an Enum subclass")


class _Drop(logging.Filter):
    def __init__(self, pattern: re.Pattern[str]):
        super().__init__()
        self.pattern = pattern

    def filter(self, record: logging.LogRecord) -> bool:
        return not self.pattern.search(str(record.getMessage()))


def quiet_torchao() -> None:
    """Install the two filters once (idempotent)."""
    for name, pattern in (("torchao", KERNEL_LIBRARY), ("torch.utils._pytree", TORCHAO_ENUMS)):
        logger = logging.getLogger(name)
        if not any(isinstance(f, _Drop) and f.pattern is pattern for f in logger.filters):
            logger.addFilter(_Drop(pattern))
