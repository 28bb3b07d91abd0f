"""The schema and its numbered migrations.

``schema.sql`` is the current schema and is applied whole to a new database.
A database made by an older keysvc is upgraded at start by the numbered steps
in ``MIGRATIONS``, all in one transaction; ``PRAGMA user_version`` records the
step a database is at. A database newer than this code is refused.
"""

from collections.abc import Sequence
from importlib import resources

import aiosqlite

from keysvc.config import ConfigError

# The shared rate counters' step: a table on PostgreSQL only (keysvc.db.postgres.schema keys
# its PostgreSQL form by this step's place), nothing on SQLite, where one instance
# serves a file and counts in its own memory; kept so both number their versions alike.
SHARED_LIMITS_STEP = "-- shared rate counters: PostgreSQL only\n"
# The instances' listening connections, registered (keysvc.db.postgres.peers): a table
# on PostgreSQL only, nothing on SQLite, whose one instance has no one to wait for.
LISTENERS_STEP = "-- listening instances: PostgreSQL only\n"

# The webhook binding step (h/whmac): outbox rows get a MAC column (existing rows have
# none, and are not sent: keysvc.db.outbox), webhooks a secret_version (existing ones
# keep 1, the nonce-only secret their receivers hold), and nonces become unique. A row
# whose nonce repeats an older row's can only have been copied by hand, so its nonce is
# replaced first by a random one: it no longer derives the older webhook's secret.
WEBHOOK_BINDING_STEP = """
    alter table webhooks add column secret_version integer not null default 1;
    alter table webhook_deliveries add column mac blob;
    update webhooks set nonce = randomblob(32) where exists (
        select 1 from webhooks w where w.nonce = webhooks.nonce and w.seq < webhooks.seq);
    create unique index if not exists webhooks_nonce on webhooks (nonce);
"""

# Fair webhook delivery's step (keysvc.db.outbox.DUE): each webhook's next due delivery
# in one seek, and the few leased deliveries without a scan. The same text on both
# backends; PostgreSQL keys it by its place too.
FAIR_DELIVERY_STEP = """
    create index if not exists webhook_deliveries_next
        on webhook_deliveries (webhook_id, next_attempt_at) where state = 'pending';
    create index if not exists webhook_deliveries_leased
        on webhook_deliveries (lease_until) where lease_until is not null;
"""

# The growth step: the index the activity log's date filter and counts read,
# the organizations' write budgets (keysvc.db.quota), the index of the deliveries still
# waiting (the webhook queue limit), and the anchors a pruned activity log starts from
# (keysvc.db.retention).
GROWTH_STEP = """
    create index if not exists activities_org_time
        on activities (organization_id, created_at, org_seq, type, key_update_type);
    create table if not exists write_budgets (
        organization_id text primary key,
        window_start    integer not null,
        bytes           integer not null
    ) strict, without rowid;
    create index if not exists webhook_deliveries_waiting
        on webhook_deliveries (webhook_id) where state = 'pending';
    create table if not exists activity_anchors (
        organization_id text primary key,
        first_seq       integer not null,
        prev_hash       blob not null,
        state           text not null,
        mac             blob not null
    ) strict, without rowid;
"""

# The leaked-secret step (h/30a, issue 30): a key found by its secret's keyed hash alone
# (keysvc.db.keys.BY_SECRET), current or a rotation's previous one, for revoke-by-secret
# and GitHub's secret scanning; not unique, as two hashData keys may share a secret.
# leak_reports: the secrets reported leaked per key, as keyed hashes, so that the same
# report again records nothing (keysvc.domain.leaks). PostgreSQL's form is keyed by
# this step's place.
LEAK_LOOKUP_STEP = """
    create index if not exists api_keys_secret on api_keys (secret_hash);
    create index if not exists api_keys_previous_secret on api_keys (previous_secret_hash)
        where previous_secret_hash is not null;
    create table if not exists leak_reports (
        key_id      text not null references api_keys (id) on delete cascade,
        secret_hash blob not null,
        reported_at text not null,
        primary key (key_id, secret_hash)
    ) strict, without rowid;
"""

# The webhook controls step (h/30b): a webhook's previous secret during a rotation's
# overlap (its nonce and secret_version, and until when, unix seconds: keysvc.domain.signing),
# since when every attempt to it has failed (unix seconds; null: its last attempt was
# delivered) and when it was disabled for it (null: enabled). Existing webhooks are
# enabled, not failing, and have no previous secret.
WEBHOOK_CONTROLS_STEP = """
    alter table webhooks add column previous_nonce blob;
    alter table webhooks add column previous_secret_version integer;
    alter table webhooks add column previous_until real;
    alter table webhooks add column failing_since real;
    alter table webhooks add column disabled_at text;
"""

# Issue 29's step: keys' externalId, meta and credits, in a table of their own
# (key_details: a row only for a key that has one of them), and the usage count of
# refusals for exhausted credits (key_usage_credits, beside key_usage). Tables of their
# own, made if not there: a spend writes no api_keys row (whose triggers move the
# authorization generation), and the keys' and usage's own columns stay as they were.
# The same text on both backends but for the types (keysvc.db.postgres.schema keys
# its form by this step's place).
KEY_DETAILS_STEP = """
    create table if not exists key_details (
        key_id                  text primary key references api_keys (id) on delete cascade,
        external_id             text,
        meta                    text,
        credits_remaining       integer,
        credits_refill_interval text,
        credits_refill_amount   integer,
        credits_refill_day      integer,
        credits_next_refill     text,
        credits_base            integer,
        credits_flags           integer not null default 0
    ) strict, without rowid;
    create index if not exists key_details_external_id
        on key_details (external_id) where external_id is not null;
    create table if not exists key_usage_credits (
        key_id    text not null references api_keys (id) on delete cascade,
        minute    text not null,
        exhausted integer not null default 0,
        primary key (key_id, minute)
    ) strict, without rowid;
    create index if not exists key_usage_credits_minute on key_usage_credits (minute);
"""

# Identities (issue 36): a customer's keys share its credits and limits. A key belongs
# to the identity of its organization whose external_id is the key's (no column on the
# key); org_seq is the identity's place in its organization's list. The columns of its
# credits are key_details' (keysvc.db.rows.credits_from_row reads both). Every
# (organization, externalId) that keys already carry gets an identity with no limits.
IDENTITIES_STEP = """
    create table if not exists identities (
        id                      text primary key,
        organization_id         text not null references organizations (id) on delete cascade,
        org_seq                 integer not null,
        external_id             text not null,
        meta                    text,
        ratelimits              text,
        credits_remaining       integer,
        credits_refill_interval text,
        credits_refill_amount   integer,
        credits_refill_day      integer,
        credits_next_refill     text,
        credits_base            integer,
        credits_flags           integer not null default 0,
        created_at              text not null,
        updated_at              text not null
    ) strict;
    create unique index if not exists identities_external_id
        on identities (organization_id, external_id);
    create unique index if not exists identities_org_position
        on identities (organization_id, org_seq);
    insert into identities (id, organization_id, org_seq, external_id, created_at, updated_at)
    select lower(hex(randomblob(4))) || '-' || lower(hex(randomblob(2))) || '-4'
           || substr(lower(hex(randomblob(2))), 2) || '-'
           || substr('89ab', 1 + abs(random()) % 4, 1) || substr(lower(hex(randomblob(2))), 2)
           || '-' || lower(hex(randomblob(6))),
           organization_id,
           row_number() over (partition by organization_id order by first_seq),
           external_id, strftime('%Y-%m-%dT%H:%M:%SZ', 'now'),
           strftime('%Y-%m-%dT%H:%M:%SZ', 'now')
    from (select k.organization_id, d.external_id, min(k.seq) as first_seq
          from key_details d join api_keys k on k.id = d.key_id
          where d.external_id is not null group by k.organization_id, d.external_id);
"""

# MIGRATIONS[n] takes a database from version n + 1 to n + 2. Version 1 is the
# first release of schema.sql; append steps here and change schema.sql to match.
# The pending leak reports' step (issue 35): revoke-by-secret reports received and not yet
# acted on (keysvc.db.pendingleaks), by the secret's keyed hash, never the secret.
# PostgreSQL's form is keyed by this step's place.
PENDING_LEAKS_STEP = """
    create table if not exists pending_leak_reports (
        seq           integer primary key,
        secret_hash   blob not null,
        actor_type    text not null,
        actor_ip      text,
        user_agent    text,
        actor_details text,
        action        text not null,
        reported_at   text not null
    ) strict;
"""

# Issue 35's replaced secrets: a report of a secret a rotation replaced finds its key's
# tombstone by the secret's keyed hash (keysvc.db.keys.BY_SECRET), one seek rather than
# a scan of every tombstone under the write lock. The same text on both backends
# (keysvc.db.postgres.schema keys it by this step's place).
REPLACED_SECRETS_STEP = """
    create index if not exists deleted_credentials_secret on deleted_credentials (secret_hash);
"""

# Issue 37's imports: each imported record's own ID (importId) per organization, and the
# key it made, so that the same record imported again makes nothing. Kept after its key
# is deleted (no foreign key): importing a file again never brings back a key that was
# deleted, a revoked token's included. The same text on both backends, but for types.
KEY_IMPORTS_STEP = """
    create table if not exists key_imports (
        organization_id text not null,
        import_id       text not null,
        key_id          text not null,
        imported_at     text not null,
        primary key (organization_id, import_id)
    ) strict, without rowid;
"""

# Issue 36's step: a key's named rate limits, a JSON array of
# keysvc.domain.namedlimits' stored form (null: none), beside its other details. The
# same text on both backends but for the collation (keysvc.db.postgres.schema).
KEY_RATELIMITS_STEP = """
    alter table key_details add column ratelimits text;
"""

# Issue 37, import round 3: the three row triggers an import's batch does the work of
# in one statement each (keysvc.db.imports.insert_batch) stand aside while its
# transaction holds meta's 'bulk_insert' row, which the batch adds at its start and
# deletes before its commit: no other connection ever sees the row, and the schema no
# longer changes for a batch (dropping and making the triggers again did, and every
# other connection prepared its statements again after each batch). SQLite only:
# PostgreSQL's triggers fire for each row (its step is a comment).
BULK_INSERT_STEP = """
    drop trigger if exists api_keys_counted;
    create trigger api_keys_counted after insert on api_keys
    when not exists (select 1 from meta where name = 'bulk_insert')
    begin
        update organizations set key_count = key_count + 1,
                                 last_key_seq = max(last_key_seq, new.org_seq)
        where id = new.organization_id;
    end;
    drop trigger if exists key_roles_granted;
    create trigger key_roles_granted after insert on key_roles
    when not exists (select 1 from meta where name = 'bulk_insert')
    begin
        update meta set value = cast(value as integer) + 1 where name = 'auth_generation';
    end;
    drop trigger if exists api_keys_key_id_not_previous;
    create trigger api_keys_key_id_not_previous before insert on api_keys
    when not exists (select 1 from meta where name = 'bulk_insert')
     and exists (select 1 from api_keys where previous_key_id_hash = new.key_id_hash)
    begin
        select raise(abort, 'api_keys.key_id_hash: another key''s previous key ID');
    end;
"""
# Its PostgreSQL form: nothing to change (a statement that does nothing, as PostgreSQL
# refuses an empty one), PostgreSQL's triggers firing for each row.
BULK_INSERT_PG = "select 0 -- import triggers standing aside: SQLite only\n"

MIGRATIONS: Sequence[str] = (
    # 2: per-key request limits, and the generation that invalidates credential caches.
    """
    alter table api_keys add column rate_limit integer;
    alter table api_keys add column rate_window integer;
    insert or ignore into meta (name, value) values ('auth_generation', '0');
    """,
    # 3: each organization's key count, kept by triggers (see schema.sql).
    """
    alter table organizations add column key_count integer not null default 0;
    update organizations set key_count =
        (select count(*) from api_keys where api_keys.organization_id = organizations.id);
    create trigger if not exists api_keys_counted after insert on api_keys begin
        update organizations set key_count = key_count + 1 where id = new.organization_id;
    end;
    create trigger if not exists api_keys_uncounted after delete on api_keys begin
        update organizations set key_count = key_count - 1 where id = old.organization_id;
    end;
    """,
    # 4: changes to keys, their roles and roles, by hand included, move auth_generation.
    """
    create trigger if not exists api_keys_access_changed
    after update of id, organization_id, name, state, key_id_hash, secret_hash, key_suffix,
        ip_access_list, created_at, expire_at, rate_limit, rate_window on api_keys
    begin
        update meta set value = cast(value as integer) + 1 where name = 'auth_generation';
    end;
    create trigger if not exists api_keys_access_removed after delete on api_keys begin
        update meta set value = cast(value as integer) + 1 where name = 'auth_generation';
    end;
    create trigger if not exists key_roles_granted after insert on key_roles begin
        update meta set value = cast(value as integer) + 1 where name = 'auth_generation';
    end;
    create trigger if not exists key_roles_revoked after delete on key_roles begin
        update meta set value = cast(value as integer) + 1 where name = 'auth_generation';
    end;
    create trigger if not exists roles_changed after update on roles begin
        update meta set value = cast(value as integer) + 1 where name = 'auth_generation';
    end;
    create trigger if not exists roles_removed after delete on roles begin
        update meta set value = cast(value as integer) + 1 where name = 'auth_generation';
    end;
    """,
    # 5: each key's place in its organization, for list cursors (see schema.sql).
    """
    alter table organizations add column last_key_seq integer not null default 0;
    alter table api_keys add column org_seq integer not null default 0;
    update api_keys set org_seq = ranked.n
    from (select seq, row_number() over (partition by organization_id order by seq) as n
          from api_keys) as ranked
    where ranked.seq = api_keys.seq;
    update organizations set last_key_seq = coalesce(
        (select max(org_seq) from api_keys where api_keys.organization_id = organizations.id), 0);
    drop index if exists api_keys_org_seq;
    create unique index if not exists api_keys_org_position on api_keys (organization_id, org_seq);
    drop trigger if exists api_keys_counted;
    create trigger api_keys_counted after insert on api_keys begin
        update organizations set key_count = key_count + 1,
                                 last_key_seq = max(last_key_seq, new.org_seq)
        where id = new.organization_id;
    end;
    """,
    # 6: a key deleted by hand with foreign keys off (the sqlite3 shell's default) takes
    # its role rows with it, as the cascade would; rows such a delete left behind go.
    """
    delete from key_roles where key_id not in (select id from api_keys);
    create trigger if not exists api_keys_roles_dropped after delete on api_keys begin
        delete from key_roles where key_id = old.id;
    end;
    """,
    # 7: authentications per key per minute by outcome (keysvc.db.usage), which go
    # with their key (see schema.sql).
    """
    create table if not exists key_usage (
        key_id       text not null,            -- api_keys.id
        minute       text not null,            -- the minute's start, in keysvc's text form
        success      integer not null default 0,
        disabled     integer not null default 0,
        expired      integer not null default 0,
        ip_denied    integer not null default 0,
        forbidden    integer not null default 0,
        rate_limited integer not null default 0,
        primary key (key_id, minute)
    ) strict, without rowid;
    create index if not exists key_usage_minute on key_usage (minute);
    create trigger if not exists api_keys_usage_dropped after delete on api_keys begin
        delete from key_usage where key_id = old.id;
    end;
    """,
    # 8: key rotation: the credentials a rotation replaced, kept (as keyed hashes) until
    # their grace period ends, whose key ID no new key may take; changing them by hand
    # moves auth_generation too.
    """
    alter table api_keys add column previous_key_id_hash blob;
    alter table api_keys add column previous_secret_hash blob;
    alter table api_keys add column previous_until text;
    create unique index if not exists api_keys_previous_key_id on api_keys (previous_key_id_hash);
    create trigger if not exists api_keys_key_id_not_previous before insert on api_keys
    when exists (select 1 from api_keys where previous_key_id_hash = new.key_id_hash)
    begin
        select raise(abort, 'api_keys.key_id_hash: another key''s previous key ID');
    end;
    create trigger if not exists api_keys_previous_changed
    after update of previous_key_id_hash, previous_secret_hash, previous_until on api_keys
    begin
        update meta set value = cast(value as integer) + 1 where name = 'auth_generation';
    end;
    """,
    # 9: the activity log and its per-organization hash chains (see schema.sql).
    """
    create table if not exists activities (
        seq             integer primary key,
        id              text not null unique,  -- uuid
        organization_id text not null,
        org_seq         integer not null,      -- its place in the organization's chain: 1, 2, ...
        created_at      text not null,
        type            text not null,
        key_update_type text,
        actor_type      text not null,
        actor_id        text,
        actor_ip        text,
        user_agent      text,
        actor_details   text,
        target_key_id   text,
        target_role_id  text,
        before          text,
        after           text,
        prev_hash       blob not null,
        hash            blob not null
    ) strict;

    create unique index if not exists activities_org_position
        on activities (organization_id, org_seq);

    create table if not exists activity_heads (
        organization_id text primary key,
        count           integer not null,
        last_hash       blob not null,
        mac             blob not null
    ) strict;
    """,
    # 10: webhooks, their outbox, its attempts and the key.expiring warnings sent (see
    # schema.sql).
    """
    create table if not exists webhooks (
        seq integer primary key,
        id text not null unique,
        organization_id text not null references organizations (id) on delete cascade,
        url text not null,
        events text not null,
        expiring_days integer not null,
        nonce blob not null,
        created_at text not null
    ) strict;
    create index if not exists webhooks_org on webhooks (organization_id, seq);
    create table if not exists webhook_deliveries (
        seq integer primary key,
        id text not null unique,
        webhook_id text not null references webhooks (id) on delete cascade,
        event_id text not null,
        event_type text not null,
        body text not null,
        created_at text not null,
        give_up_at real not null,
        state text not null check (state in ('pending', 'delivered', 'failed')),
        attempts integer not null default 0,
        next_attempt_at real,
        lease_until real,
        lease_owner text
    ) strict;
    create index if not exists webhook_deliveries_due on webhook_deliveries (next_attempt_at)
        where state = 'pending';
    create index if not exists webhook_deliveries_of on webhook_deliveries (webhook_id, seq);
    create index if not exists webhook_deliveries_done on webhook_deliveries (give_up_at)
        where state <> 'pending';
    create table if not exists webhook_attempts (
        delivery_seq integer not null references webhook_deliveries (seq) on delete cascade,
        n integer not null,
        at text not null,
        status integer,
        error text,
        primary key (delivery_seq, n)
    ) strict, without rowid;
    create table if not exists webhook_expiry_warnings (
        webhook_id text not null references webhooks (id) on delete cascade,
        key_id text not null references api_keys (id) on delete cascade,
        expire_at text not null,
        primary key (webhook_id, key_id, expire_at)
    ) strict, without rowid;
    create index if not exists webhook_expiry_warnings_key on webhook_expiry_warnings (key_id);
    """,
    # 11: deleted keys' credentials, kept a while as tombstones (see schema.sql).
    """
    create table if not exists deleted_credentials (
        key_id_hash     blob primary key,
        secret_hash     blob not null,
        key_id          text not null,
        organization_id text not null,
        deleted_at      text not null
    ) strict, without rowid;

    create trigger if not exists api_keys_tombstoned after delete on api_keys begin
        insert or replace into deleted_credentials
            (key_id_hash, secret_hash, key_id, organization_id, deleted_at)
        values (old.key_id_hash, old.secret_hash, old.id, old.organization_id,
                strftime('%Y-%m-%dT%H:%M:%SZ', 'now'));
        insert or replace into deleted_credentials
            (key_id_hash, secret_hash, key_id, organization_id, deleted_at)
        select old.previous_key_id_hash, old.previous_secret_hash, old.id, old.organization_id,
               strftime('%Y-%m-%dT%H:%M:%SZ', 'now')
        where old.previous_key_id_hash is not null and old.previous_secret_hash is not null
          and julianday(old.previous_until) > julianday('now');
    end;
    """,
    # 12: nothing on SQLite, whose data_version announces every commit already; on
    # PostgreSQL, triggers that announce each change (keysvc.db.postgres.schema).
    "",
    # 13: the shared rate counters, a table on PostgreSQL only (see SHARED_LIMITS_STEP).
    SHARED_LIMITS_STEP,
    # 14: outbox MACs and webhook secrets bound to their webhook (WEBHOOK_BINDING_STEP).
    WEBHOOK_BINDING_STEP,
    # 15: the instances' listening connections, PostgreSQL only (LISTENERS_STEP).
    LISTENERS_STEP,
    # 16: indexes for fair delivery's choice (see FAIR_DELIVERY_STEP).
    FAIR_DELIVERY_STEP,
    # 17: the activity date index, the write budgets, the waiting deliveries' index and
    # the pruned log's anchors (GROWTH_STEP).
    GROWTH_STEP,
    # 18: keys found by their secret's keyed hash (LEAK_LOOKUP_STEP).
    LEAK_LOOKUP_STEP,
    # 19: webhook secret rotation, failing since and disabled (WEBHOOK_CONTROLS_STEP).
    WEBHOOK_CONTROLS_STEP,
    # 20: keys' externalId, meta and credits, and the usage count of refusals for
    # exhausted credits (KEY_DETAILS_STEP, issue 29).
    KEY_DETAILS_STEP,
    # 21: revoke-by-secret reports not yet acted on (PENDING_LEAKS_STEP, issue 35).
    PENDING_LEAKS_STEP,
    # 22: tombstones found by their secret's keyed hash (REPLACED_SECRETS_STEP, issue 35).
    REPLACED_SECRETS_STEP,
    # 23: imported records' importIds (KEY_IMPORTS_STEP, issue 37).
    KEY_IMPORTS_STEP,
    # 24: keys' named rate limits (KEY_RATELIMITS_STEP, issue 36).
    KEY_RATELIMITS_STEP,
    # 25: identities, and one for each externalId keys carry (IDENTITIES_STEP, issue 36).
    IDENTITIES_STEP,
    # 26: an import's batch does its row triggers' work without dropping them
    # (BULK_INSERT_STEP, issue 37).
    BULK_INSERT_STEP,
)


def schema_sql() -> str:
    return resources.files("keysvc").joinpath("schema.sql").read_text()


def schema_version(migrations: Sequence[str] = MIGRATIONS) -> int:
    return 1 + len(migrations)


async def migrate(
    conn: aiosqlite.Connection, migrations: Sequence[str] = MIGRATIONS, *, create: bool = True
) -> int:
    """Bring the database to the current version; returns the version it was at.

    ``create=False`` refuses a file keysvc has not made (version 0) instead of
    writing the schema into it.
    """
    target = schema_version(migrations)
    async with conn.execute("pragma user_version") as cursor:
        row = await cursor.fetchone()
    current = int(row[0]) if row else 0
    if current > target:
        raise ConfigError(
            f"database schema version {current} is newer than this keysvc supports ({target})"
        )
    if current == target:
        return current
    if current == 0 and not create:
        raise ConfigError(
            "the database has no keysvc schema: make one with `keysvc bootstrap`,"
            " or correct the path"
        )
    steps = [schema_sql()] if current == 0 else list(migrations[current - 1 :])
    # executescript runs the whole text; BEGIN inside it keeps every step and
    # the version bump in one transaction, rolled back together on failure.
    script = "begin immediate;\n" + "\n".join(steps) + f"\npragma user_version = {target};\ncommit;"
    try:
        await conn.executescript(script)
    except BaseException:
        if conn.in_transaction:
            await conn.rollback()
        raise
    return current
