"""Validation's checks that are a concern of their own (``trainer/validate.py`` runs them with the generic ones)."""
