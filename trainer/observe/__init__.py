"""Where measurements go: metrics.jsonl, summary.json, console, rank logs, W&B."""
