"""One module per parallel=NAME strategy; each builds an Engine from the model."""
