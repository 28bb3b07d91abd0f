"""Databases taken back to an older schema version by hand, for the upgrade tests: most
later steps make what they make only where it is missing, and run again harmlessly;
the webhook binding step adds columns, which SQLite cannot add "if not exists", so
what it made is undone first. The statements are valid on both backends."""

WEBHOOK_BINDING_UNDO = (
    "drop index if exists webhooks_nonce",
    "alter table webhooks drop column secret_version",
    "alter table webhook_deliveries drop column mac",
)
# The same, as one script for sqlite3's executescript.
UNDO_WEBHOOK_BINDING = "".join(f" {statement};" for statement in WEBHOOK_BINDING_UNDO)
