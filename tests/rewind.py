"""SQLite databases taken back to an older schema version by hand, for the upgrade
tests: most later steps make what they make only where it is missing, and run again
harmlessly; the webhook binding step adds columns, which SQLite cannot add "if not
exists", so what it made is undone first."""

UNDO_WEBHOOK_BINDING = (
    "drop index if exists webhooks_nonce;"
    " alter table webhooks drop column secret_version;"
    " alter table webhook_deliveries drop column mac;"
)
