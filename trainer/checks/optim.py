"""``optim.*``: hyper-parameters torch.optim and the lr schedule would reject (or silently misuse) in a worker.
``optim.decay`` is enum-typed by the schema (conf/schema.py): a wrong value fails at compose. No torch import."""

from __future__ import annotations

from omegaconf import DictConfig, ListConfig

from trainer.checks.findings import Findings, finite, number


def check_optim(cfg: DictConfig, layout: object, f: Findings) -> None:
    o = cfg.optim
    lr = number(o.get("lr"))
    f.require("optim.lr", o.get("lr"), finite(lr) and lr > 0, "must be a number > 0, e.g. optim.lr=3e-3")
    if "weight_decay" in o:
        wd = number(o.weight_decay)
        f.require(
            "optim.weight_decay", o.weight_decay, finite(wd) and wd >= 0, "must be >= 0 (0 disables weight decay)"
        )
    if "betas" in o:
        betas = o.betas
        ok = isinstance(betas, (list, tuple, ListConfig)) and len(betas) == 2
        ok = ok and all((b := number(x)) is not None and 0 <= b < 1 for x in betas)
        shown = list(betas) if isinstance(betas, ListConfig) else betas
        f.require("optim.betas", shown, ok, "must be two numbers in [0, 1), e.g. optim.betas=[0.9,0.95]")
    if "eps" in o:
        f.require("optim.eps", o.eps, finite(o.eps) and number(o.eps) > 0, "must be a number > 0, e.g. 1e-8")
    if "momentum" in o:
        mom = number(o.momentum)
        ok = mom is not None and 0 <= mom < 1
        f.require("optim.momentum", o.momentum, ok, "must be in [0, 1) (0 disables momentum)")
    ratio = number(o.get("min_lr_ratio", 1.0))
    ok = ratio is not None and 0 <= ratio <= 1
    f.require(
        "optim.min_lr_ratio",
        o.get("min_lr_ratio"),
        ok,
        "must be in [0, 1] (the share of optim.lr the cosine decays to)",
    )
    warm = o.get("warmup_steps", 0)
    ok = isinstance(warm, int) and warm >= 0
    f.require("optim.warmup_steps", warm, ok, "must be an integer >= 0 (0: no warm-up)")
