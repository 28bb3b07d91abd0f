"""Operators' tools and background jobs: backup, migrate, audit, workers, webhook delivery."""
