"""Models whose layers can be split into stages with their parameter names (FQNs) kept."""
