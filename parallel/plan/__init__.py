"""The planner: model/hardware specs, cost model, layout search, calibration, parallel=auto, the CLI (python -m parallel.plan)."""
