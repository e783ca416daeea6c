"""Pipeline parallel: stages (split, build), torch schedules, per-action timing, timelines."""
