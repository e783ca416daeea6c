"""``python -m trainer.generate SRC --prompt TEXT [--max-new-tokens N]``: meshtrain's own greedy decoding of a
checkpoint, without exporting it first.

SRC is what ``python -m trainer.export`` takes (a run folder: its newest complete checkpoint; or a
``checkpoints/step_N`` folder, saved under any layout). One process, no workers: the model is built from the
checkpoint's own model config, its tensors are read whole by DCP (the exporter's reader), the prompt is encoded
with the tokenizer the export would ship (``trainer/hf/tokenizer.py``), and the most likely next token is appended
``N`` times (stopping at the tokenizer's end-of-text token, as ``generate`` does). It prints the prompt and its
continuation: what transformers' ``pipeline("text-generation", ..., do_sample=False)`` prints on the export
(tests/integration/test_readme_commands.py compares the two on the default job).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from typing import Any

from trainer.checkpoint.files import MARKER, CheckpointError
from trainer.data.user_files import read_tokenizer
from trainer.export import ExportError, checkpoint_model, find_checkpoint, full_state, run_config
from trainer.hf.tokenizer import TOKENIZER, write_tokenizer


def load_model(checkpoint: Path) -> tuple[Any, dict[str, Any]]:
    """The checkpoint's model, built on CPU from its own config and holding its weights, in eval mode."""
    import torch
    from hydra.utils import instantiate

    from models.spec import builder_kwargs

    model_cfg = checkpoint_model(checkpoint)
    state = full_state(checkpoint)
    try:
        with torch.device("cpu"):
            model = instantiate(builder_kwargs(model_cfg))
        model.load_state_dict(state)
    except Exception as exc:  # noqa: BLE001 - Hydra's InstantiationException, load_state_dict's RuntimeError
        raise CheckpointError(
            f"checkpoint {checkpoint}: its weights do not build the model its {MARKER} describes "
            f"({type(exc).__name__}: {str(exc)[:300]}); an edited marker: use an earlier checkpoint"
        ) from None
    return model.eval(), model_cfg


def run_tokenizer(checkpoint: Path, model_cfg: dict[str, Any]) -> tuple[Any, int | None]:
    """The tokenizer the run's data was encoded with and its end-of-text id (None: it names none)."""
    run = run_config(checkpoint)
    with tempfile.TemporaryDirectory() as folder:
        info = write_tokenizer(Path(folder), data=run.data if run is not None else None, model=model_cfg)
        if info is None:
            raise ExportError(
                f"{checkpoint}: the run's data names no tokenizer meshtrain knows (a pre-tokenised file without "
                "model.init_from); export it and decode with the tokenizer its tokens came from"
            )
        # the byte vocabulary names none: its export's stand-in (NUL), where generate stops too
        eos = info["eos_token_id"] if info["eos_token_id"] is not None else info.get("default_eos")
        return read_tokenizer(Path(folder) / TOKENIZER, error=ExportError), eos


def greedy(model: Any, ids: list[int], *, max_new_tokens: int, context: int, eos: int | None) -> list[int]:
    """``ids`` and up to ``max_new_tokens`` most likely next tokens (the last ``context`` tokens as input)."""
    import torch

    out = list(ids)
    with torch.no_grad():
        for _ in range(max_new_tokens):
            logits = model(torch.tensor([out[-context:]]))
            token = int(logits[0, -1].argmax())
            out.append(token)
            if token == eos:
                break
    return out


def generate(src: str | Path, prompt: str, *, max_new_tokens: int = 40) -> str:
    """The prompt and its greedy continuation by the checkpoint ``src`` names."""
    checkpoint = find_checkpoint(src)
    model, model_cfg = load_model(checkpoint)
    tokenizer, eos = run_tokenizer(checkpoint, model_cfg)
    ids = tokenizer.encode(prompt, add_special_tokens=False).ids
    context = int(model_cfg.get("max_seq_len") or len(ids) + max_new_tokens)
    new = greedy(model, ids, max_new_tokens=max_new_tokens, context=context, eos=eos)[len(ids) :]
    return prompt + tokenizer.decode([i for i in new if i != eos], skip_special_tokens=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m trainer.generate", description=__doc__.split("\n\n")[0])
    p.add_argument("src", help="a run folder (its newest checkpoint) or a checkpoints/step_N folder")
    p.add_argument("--prompt", required=True, help="the text to continue")
    p.add_argument("--max-new-tokens", type=int, default=40, help="tokens to append at most (40)")
    args = p.parse_args(argv)
    if args.max_new_tokens < 1:
        print(f"generate: --max-new-tokens {args.max_new_tokens}: must be at least 1", file=sys.stderr)
        return 2
    try:
        print(generate(args.src, args.prompt, max_new_tokens=args.max_new_tokens))
    except (ExportError, CheckpointError, ValueError) as exc:
        print(f"generate: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
