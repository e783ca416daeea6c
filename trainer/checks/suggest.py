"""The layouts a refusal suggests, each validated for the run before it is suggested.

A refusal that says "use parallel=hybrid" or lists "layouts that fit 4 workers" must not send the user to a layout
that is refused in turn (hybrid's own degrees dp2 x tp2 x pp2 on top of the run's cp2 need 16 ranks; expert
parallel for a model without experts). So each candidate is written in full (the strategy and every degree it needs,
``parallel=hybrid dp.size=2 tp.size=1 pp.size=1 cp.size=2``), applied to a copy of the run's config as the command
line would apply it (the ``parallel`` option's YAML, then the degrees), and validated (``Findings.runs``, set by
``trainer.validate.validate``); only the ones that pass are named. The candidates' own validation suggests nothing.
"""

from __future__ import annotations

import copy
import functools
import pickle
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

import yaml
from omegaconf import DictConfig, OmegaConf

from parallel.assembly.registry import strategy_for
from parallel.foundation import dims
from parallel.foundation.layout import ParallelLayout, factorizations
from trainer.checks.findings import Findings


def layout_words(sizes: Mapping[str, int], *, current: Mapping[str, int], strategy: str | None = None) -> list[str]:
    """``parallel=NAME dp.size=D tp.size=T pp.size=P [cp.size=C ...]``: a layout as command-line words, every degree
    the option's own YAML or the run's current config would otherwise set named (a dimension at 1 in both is left
    out)."""
    full = dims.full_sizes(dict(sizes))
    name = strategy or strategy_for(**full)
    named = [n for n in dims.names() if n in dims.ALWAYS_NAMED or full[n] > 1 or int(current.get(n, 1)) > 1]
    return [f"parallel={name}", *(f"{dims.dim(n).key}={full[n]}" for n in named)]


def applied(cfg: DictConfig, words: Sequence[str]) -> DictConfig:
    """A copy of ``cfg`` with ``words`` applied as Hydra applies them after the run's own: ``parallel=NAME`` merges
    conf/parallel/NAME.yaml (its degrees and pipeline defaults), then each ``key=value``. The copy is a pickle round
    trip (a refusal validates up to a dozen candidates: 2.5 ms a copy where ``copy.deepcopy`` took 5 ms)."""
    out = pickle.loads(pickle.dumps(cfg))
    for word in words:
        key, _, value = word.partition("=")
        if key == "parallel":
            out.merge_with(copy.deepcopy(_parallel_option(value)))
        else:
            OmegaConf.update(out, key, yaml.safe_load(value), merge=False)
    return out


@functools.cache
def _parallel_option(name: str) -> DictConfig:
    """conf/parallel/NAME.yaml without its defaults list, read once (callers merge a copy)."""
    import conf

    option = OmegaConf.load(Path(conf.__file__).parent / "parallel" / f"{name}.yaml")
    option.pop("defaults", None)
    return option


def runnable(cfg: DictConfig, f: Findings, candidates: Iterable[Sequence[str]], *, limit: int = 6) -> list[str]:
    """The first ``limit`` candidates (command-line words) that pass validation for this run, joined by spaces;
    none inside a candidate's own validation (``f.runs`` is unset there)."""
    if f.runs is None:
        return []
    out: list[str] = []
    for words in candidates:
        try:
            ok = f.runs(applied(cfg, words))
        except Exception:  # noqa: BLE001 - a candidate that cannot even be applied is not suggested
            ok = False
        if ok:
            out.append(" ".join(words))
            if len(out) == limit:
                break
    return out


def layouts_that_fit(cfg: DictConfig, layout: ParallelLayout, f: Findings, workers: int) -> str:
    """``Layouts that fit N workers: A; B.``: the factorizations of ``workers`` that pass validation for this run."""
    candidates = (layout_words(dict(zip(dims.names(), t)), current=layout.sizes) for t in factorizations(workers))
    fits = runnable(cfg, f, candidates)
    if fits:
        return f"Layouts that fit {workers} workers and pass validation for this run: {'; '.join(fits)}."
    return f"No layout of {workers} workers passes validation for this run."
