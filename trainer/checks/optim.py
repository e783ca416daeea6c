"""``optim.*``: hyper-parameters torch.optim and the lr schedule would reject (or silently misuse) in a worker.
``optim.decay`` and ``optim.implementation`` are enum-typed by the schema (conf/schema.py): a wrong value fails at
compose. No torch import, except to read the optimizer class's arguments when ``optim.implementation`` asks for
``fused`` or ``foreach``."""

from __future__ import annotations

from omegaconf import DictConfig, ListConfig

from models.spec import import_object
from parallel.foundation.optimizer import KERNEL_ARGUMENTS, implementation_problem
from trainer.checks.findings import Findings, finite, number


def check_optim(cfg: DictConfig, layout: object, f: Findings) -> None:
    o = cfg.optim
    lr = number(o.get("lr"))
    f.require("optim.lr", o.get("lr"), finite(lr) and lr >= 0, "must be a number >= 0, e.g. optim.lr=3e-3")
    if lr == 0:  # torch accepts it: a round trip, or timing a run, without changing the weights
        f.warn("optim.lr=0: the weights will not change (every update is scaled by 0); set optim.lr > 0 to train")
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
    check_implementation(cfg, layout, f)
    if str(o.get("_target_", "")) == MUON_TARGET:
        check_muon(cfg, f)


#: the class ``optim=muon`` builds (conf/schema.py's MuonConfig)
MUON_TARGET = "parallel.optim.muon.Muon"


def check_muon(cfg: DictConfig, f: Findings) -> None:
    """``optim=muon``'s own keys, and what it cannot train: LoRA's adapters, a model without decoder blocks."""
    o = cfg.optim
    steps = o.get("ns_steps")
    ok = isinstance(steps, int) and 1 <= steps < 100
    f.require("optim.ns_steps", steps, ok, "must be an integer in [1, 99] (torch.optim.Muon refuses 100 or more)")
    coefficients = o.get("ns_coefficients")
    ok = isinstance(coefficients, (list, tuple, ListConfig)) and len(coefficients) == 3
    ok = ok and all(finite(number(c)) for c in coefficients)
    f.require("optim.ns_coefficients", coefficients, ok, "must be three numbers (a, b, c), e.g. [3.4445,-4.775,2.0315]")
    for key in ("adamw_lr", "adamw_weight_decay"):
        value = number(o.get(key))
        f.require(f"optim.{key}", o.get(key), finite(value) and value >= 0, "must be a number >= 0")
    eps = number(o.get("adamw_eps"))
    f.require("optim.adamw_eps", o.get("adamw_eps"), finite(eps) and eps > 0, "must be a number > 0, e.g. 1e-8")
    betas = o.get("adamw_betas")
    ok = isinstance(betas, (list, tuple, ListConfig)) and len(betas) == 2
    ok = ok and all((b := number(x)) is not None and 0 <= b < 1 for x in betas)
    f.require("optim.adamw_betas", betas, ok, "must be two numbers in [0, 1), e.g. optim.adamw_betas=[0.9,0.95]")
    rank = number((cfg.model.get("lora") or {}).get("rank", 0))
    if rank:
        f.error(
            f"optim=muon with model.lora.rank={int(rank)}: under LoRA the only trainable matrices are the adapters' "
            f"rank-{int(rank)} factors A and B (the block weights are frozen); orthogonalising each factor does not "
            "orthogonalise their product, the update Muon is defined for. Use optim=adamw for LoRA"
        )
    if "n_layers" not in cfg.model:
        f.error(
            f"optim=muon with model={cfg.model.get('name')}: Muon updates the weight matrices of decoder blocks "
            "(layers.<i>.*) and this model has none; use optim=adamw"
        )


def check_implementation(cfg: DictConfig, layout: object, f: Findings) -> None:
    """``optim.implementation=fused|foreach`` the optimizer class has no kernel for, on this layout's parameters
    (DTensors under FSDP2 or TP): refused here rather than at the workers' first build."""
    o = cfg.optim
    implementation = str(o.get("implementation", "auto"))
    if implementation not in KERNEL_ARGUMENTS or set(KERNEL_ARGUMENTS) & set(o) or "_target_" not in o:
        return  # torch's defaults, or the optimizer's own fused/foreach argument, which wins
    try:
        cls = import_object(str(o._target_))
    except (ImportError, AttributeError, ValueError) as exc:
        f.error(f"optim._target_={o._target_}: cannot be imported ({exc}); name a torch.optim class or your own")
        return
    over_dtensors = layout.dp_shard or layout.tp > 1
    problem = implementation_problem(cls, implementation=implementation, over_dtensors=over_dtensors)
    if problem:
        f.error(problem)
