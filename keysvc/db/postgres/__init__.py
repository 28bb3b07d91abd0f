"""PostgreSQL's store: a database several instances share, its schema and notifications."""
