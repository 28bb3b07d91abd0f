"""Databases taken back to an older schema version by hand, for the upgrade tests: most
later steps make what they make only where it is missing, and run again harmlessly;
the webhook binding step adds columns, which SQLite cannot add "if not exists", so
what it made is undone first. The statements are valid on both backends."""

# The webhook controls step's columns (keysvc.db.sqlite.migrations.WEBHOOK_CONTROLS_STEP),
# added after the binding step: a database taken back before that step loses them too.
WEBHOOK_CONTROLS_UNDO = (
    # The named rate limits step's column (KEY_RATELIMITS_STEP, issue 36), later still.
    "alter table key_details drop column ratelimits",
    "alter table webhooks drop column previous_nonce",
    "alter table webhooks drop column previous_secret_version",
    "alter table webhooks drop column previous_until",
    "alter table webhooks drop column failing_since",
    "alter table webhooks drop column disabled_at",
)
WEBHOOK_BINDING_UNDO = (
    *WEBHOOK_CONTROLS_UNDO,
    "drop index if exists webhooks_nonce",
    "alter table webhooks drop column secret_version",
    "alter table webhook_deliveries drop column mac",
)
# The same, as one script for sqlite3's executescript.
UNDO_WEBHOOK_BINDING = "".join(f" {statement};" for statement in WEBHOOK_BINDING_UNDO)
