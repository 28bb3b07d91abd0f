"""SQLite's store: one file, its connections, migrations, write batches and commit watch."""
