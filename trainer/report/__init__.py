"""The sweep report (python -m trainer.report): table, plots, best and Pareto front, W&B summary run."""
