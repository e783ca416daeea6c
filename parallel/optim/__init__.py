"""Optimizers meshtrain builds itself around torch's own update functions (``optim=muon``)."""
