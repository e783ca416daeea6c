"""The assembly of parallel/: what stands on techniques/ and pipeline/ (compose, the engines, the strategy registry)."""
