"""Job history and accounting: the store (SQLite or PostgreSQL) and the leader's exporter."""
