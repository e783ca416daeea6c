"""Model families that exist only for tests: each proves what adding a family takes (docs/models.md)."""
