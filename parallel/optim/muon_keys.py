"""The choices of ``optim=muon``'s keys, without torch (the config schema types its keys with them)."""

#: ``optim.muon_gather``: how a sharded matrix becomes whole for the orthogonalisation (parallel/optim/muon_shards.py)
GATHER_WAYS = ("spread", "everywhere")

#: ``optim.adjust_lr_fn``, as torch.optim.Muon names them (``original`` is torch's default, None)
ADJUST_LR_FNS = ("original", "match_rms_adamw")
