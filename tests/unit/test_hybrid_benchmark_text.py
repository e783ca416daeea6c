"""benchmarks/hybrid.py writes what it measured: its docs section is computed from the rows it is given."""

from __future__ import annotations

from benchmarks.hybrid import agreed_decimals, loss_sentence, merge_repeats, section, write_docs

JOB = {
    "model": "gpt_small",
    "n_layers": 4,
    "d_model": 128,
    "global_batch_size": 16,
    "seq_len": 64,
    "optim": "adamw",
    "micro_batches": 4,
    "schedule": "1f1b",
    "threads_per_rank": 1,
    "device": "cpu",
}
MACHINE = {
    "arch": "x86_64",
    "torch": "2.13.0+cpu",
    "backend": "gloo",
    "cores": 2,
    "load": (6.5, 7.25),
    "torch_import_rss_mib": 281.4,
}


def row(layout: str, loss: float, tokens: float = 10_000.0, bubble: float | None = None) -> dict:
    return {
        "layout": layout,
        "tokens_per_s": tokens,
        "step_ms": 16 * 64 / tokens * 1e3,
        "peak_mib_per_rank": [350.0, 351.0, 352.0, 353.0],
        "bubble": bubble,
        "final_loss": loss,
        "wall_s": 10.0,
    }


def test_agreed_decimals_counts_what_the_values_share():
    assert agreed_decimals([3.62414, 3.62411]) == 4
    assert agreed_decimals([3.6241, 3.7000]) == 0
    assert agreed_decimals([3.6, 4.7]) is None
    assert agreed_decimals([1.5, 1.5]) == 6


def test_section_states_the_numbers_it_was_given():
    rows = [row("dp4", 3.62414, 15_187), row("pp4", 3.62411, 14_040, bubble=0.61)]
    text = section(rows, reference=row("single", 3.62413), job=JOB, steps=12, repeats=1, machine=MACHINE)
    assert "agree to 4 decimals (largest difference 3.0e-05)" in text
    assert "parallel=single (one worker, same job) ended at 3.6241" in text
    assert "| dp4 | 15,187 |" in text and "| pp4 | 14,040 |" in text and "| 61% |" in text
    assert "global batch 16 × 64 tokens" in text and "12 steps" in text and "1f1b" in text
    assert "4 workers on 2 CPU cores (1 thread each)" in text and "torch 2.13.0+cpu" in text
    assert "imports torch peaks at 281 MiB" in text
    assert "Load average (1 min) 6.5 before the runs and 7.2 after" in text
    assert "Read with care: 4 threads time-share 2 cores" in text


def test_losses_that_differ_are_reported_as_differing_and_failures_named():
    rows = [row("dp4", 3.6241), row("tp4", 3.7000), {"layout": "tp2×pp2", "error": "boom", "wall_s": 1.0}]
    text = section(rows, reference=row("single", 3.6241), job=JOB, steps=12, repeats=1, machine=MACHINE)
    assert "agree to" not in text
    assert "Final losses of the 2 completed layouts differ by up to 0.0759." in text
    assert "largest relative difference from it is 2.1e-02" in text
    assert "1 layout(s) failed: tp2×pp2" in text and "| tp2×pp2 | failed: boom |" in text
    assert "differ by up to 1.1000" in loss_sentence([row("a", 3.6), row("b", 4.7)], None)


def test_no_time_sharing_warning_when_the_cores_suffice_and_repeats_give_the_spread():
    repeats = [row("dp4", 3.6241, 6_233), row("dp4", 3.6241, 15_187), row("dp4", 3.6241, 12_000)]
    merged = merge_repeats(repeats)
    assert merged["tokens_per_s"] == 12_000 and merged["repeats_tokens_per_s"] == [6_233, 15_187, 12_000]
    text = section([merged], reference=None, job=JOB, steps=12, repeats=3, machine={**MACHINE, "cores": 8})
    assert "Read with care" not in text
    assert "varied by up to 2.44× (dp4: 6,233, 15,187, 12,000)" in text
    assert "Only dp4 completed: no comparison between layouts." in text


def test_write_docs_replaces_only_its_own_section(tmp_path):
    doc = tmp_path / "benchmarks.md"
    doc.write_text("# Benchmarks\n\n## Overhead\n\nkept\n\n## Hybrid\n\nold text\n\n## Planner\n\nalso kept\n")
    write_docs("\nnew text\n", doc=doc)
    write_docs("\nnewer text\n", doc=doc)
    out = doc.read_text()
    assert out.count("## Hybrid") == 1 and "newer text" in out
    assert "old text" not in out and "new text\n" not in out.replace("newer text", "")
    assert "## Overhead\n\nkept" in out and "## Planner\n\nalso kept" in out
