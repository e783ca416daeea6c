"""``optim=muon`` on one process (parallel/optim/muon.py): the blocks' matrices get exactly torch.optim.Muon's update
(experts' 3-D tensors one expert matrix at a time), everything else exactly torch.optim.AdamW's, each group with its
own lr and weight decay; the lr schedule keeps each group's own base."""

from __future__ import annotations

import copy

import pytest
import torch

from parallel.optim.muon import Muon, muon_role

SETTINGS = dict(lr=0.02, weight_decay=0.1, momentum=0.95, nesterov=True, adjust_lr_fn="match_rms_adamw")
ADAMW = dict(adamw_lr=3e-3, adamw_weight_decay=0.01, adamw_betas=(0.9, 0.95), adamw_eps=1e-8)


def _params() -> dict[str, torch.nn.Parameter]:
    torch.manual_seed(0)
    shapes = {
        "tok_embeddings.weight": (32, 16),
        "layers.0.attention_norm.weight": (16,),
        "layers.0.attention.wq.weight": (24, 16),
        "layers.0.feed_forward.w2.weight": (16, 40),
        "layers.0.feed_forward.router.weight": (4, 16),
        "layers.0.feed_forward.experts.w1": (4, 12, 16),
        "layers.0.attention.wq.bias": (24,),
        "norm.weight": (16,),
        "output.weight": (32, 16),
    }
    return {n: torch.nn.Parameter(torch.randn(s)) for n, s in shapes.items()}


def test_roles_follow_the_block_matrices():
    roles = {n: muon_role(n, p) for n, p in _params().items()}
    muon = sorted(n for n, r in roles.items() if r == "muon")
    assert muon == [
        "layers.0.attention.wq.weight",
        "layers.0.feed_forward.experts.w1",
        "layers.0.feed_forward.w2.weight",
    ]
    # compiled or checkpoint-wrapped blocks keep the block in their names
    assert muon_role("layers.3._orig_mod.attention.wo.weight", torch.empty(2, 2)) == "muon"
    # transformers' own modelling code (model.init_from of a family meshtrain has no native code for)
    assert muon_role("model.layers.0.mlp.gate.weight", torch.empty(4, 2)) == "adamw"
    assert muon_role("model.layers.0.mlp.experts.1.gate_proj.weight", torch.empty(4, 2)) == "muon"
    assert muon_role("model.embed_tokens.weight", torch.empty(4, 2)) == "adamw"


def _reference(params: dict[str, torch.nn.Parameter]):
    """torch's own optimizers over copies: Muon per matrix (an expert tensor as its expert matrices), AdamW."""
    copies = {n: torch.nn.Parameter(p.detach().clone()) for n, p in params.items()}
    matrices, experts = [], {}
    for n, p in copies.items():
        if muon_role(n, p) == "muon" and p.ndim == 2:
            matrices.append(p)
        elif muon_role(n, p) == "muon":
            experts[n] = [torch.nn.Parameter(p.detach()[e].clone()) for e in range(p.shape[0])]
    muon = torch.optim.Muon(matrices + [m for ms in experts.values() for m in ms], **SETTINGS)
    rest = [p for n, p in copies.items() if muon_role(n, p) == "adamw"]
    adamw = torch.optim.AdamW(
        rest, lr=ADAMW["adamw_lr"], weight_decay=ADAMW["adamw_weight_decay"], betas=ADAMW["adamw_betas"], foreach=False
    )
    return copies, experts, muon, adamw


def test_single_update_equals_torch_muon_and_adamw():
    params = _params()
    ours = Muon(list(params.items()), **SETTINGS, **ADAMW, implementation="for-loop")
    copies, experts, muon, adamw = _reference(params)
    for step in range(3):
        torch.manual_seed(100 + step)
        grads = {n: torch.randn_like(p) for n, p in params.items()}
        for n, p in params.items():
            p.grad = grads[n].clone()
            copies[n].grad = grads[n].clone()
            for e, m in enumerate(experts.get(n, [])):
                m.grad = grads[n][e].clone()
        ours.step()
        muon.step()
        adamw.step()
    for n, p in params.items():
        if n in experts:
            want = torch.stack([m.detach() for m in experts[n]])
        else:
            want = copies[n].detach()
        assert torch.equal(p.detach(), want), n
        assert not torch.equal(p.detach(), _params()[n].detach()), f"{n} did not move"
    # one momentum buffer per Muon matrix, AdamW's two moments for the rest
    for n, p in params.items():
        keys = set(ours.state[p])
        assert keys == ({"momentum_buffer"} if muon_role(n, p) == "muon" else {"step", "exp_avg", "exp_avg_sq"}), n


def test_groups_keep_their_own_lr_and_weight_decay_under_the_schedule():
    from omegaconf import OmegaConf

    from trainer.loop.optim import build_scheduler

    ours = Muon(list(_params().items()), **SETTINGS, **ADAMW)
    by_role = {g["role"]: g for g in ours.param_groups}
    assert by_role["muon"]["weight_decay"] == 0.1 and by_role["adamw"]["weight_decay"] == 0.01
    cfg = OmegaConf.create({"warmup_steps": 2, "decay": "cosine", "min_lr_ratio": 0.1})
    sched = build_scheduler(ours, cfg, max_steps=10)
    for _ in range(10):
        ratio = by_role["muon"]["lr"] / by_role["adamw"]["lr"]
        assert ratio == pytest.approx(0.02 / 3e-3, rel=1e-12)
        ours.step()
        sched.step()
    # the cosine ends at min_lr_ratio of each group's own lr
    assert (by_role["muon"]["lr"], by_role["adamw"]["lr"]) == pytest.approx((0.02 * 0.1, 3e-3 * 0.1), rel=1e-9)


def test_torch_refuses_what_it_refuses_and_there_must_be_a_matrix():
    with pytest.raises(ValueError, match="Adjust learning rate function"):
        Muon(list(_params().items()), adjust_lr_fn="spectral")
    with pytest.raises(ValueError, match="no block weight matrix"):
        Muon([("output.weight", torch.nn.Parameter(torch.zeros(2, 2)))])


def test_state_dict_round_trip_keeps_momentum():
    params = _params()
    ours = Muon(list(params.items()), **SETTINGS, **ADAMW)
    for p in params.values():
        p.grad = torch.ones_like(p)
    ours.step()
    state = copy.deepcopy(ours.state_dict())
    again = Muon(list(params.items()), **SETTINGS, **ADAMW)
    again.load_state_dict(state)
    p = params["layers.0.attention.wq.weight"]
    assert torch.equal(again.state[p]["momentum_buffer"], ours.state[p]["momentum_buffer"])
    again.step()  # the inner AdamW follows the loaded groups and state
    assert int(again.state[params["norm.weight"]]["step"]) == 2
