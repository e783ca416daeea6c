"""A small convolutional classifier with BatchNorm (the BatchNorm-under-data-parallel example)."""
