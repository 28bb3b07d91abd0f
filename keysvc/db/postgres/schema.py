"""The schema on PostgreSQL, and how a database gets it: the counterpart of
``keysvc.db.sqlite.migrations`` for the second backend.

``schema_postgres.sql`` is the current schema, the PostgreSQL form of ``schema.sql``,
applied whole to a new database. Versions are numbered as SQLite's
(``keysvc.db.sqlite.migrations.schema_version``), recorded in meta's ``schema_version`` row
rather than a pragma. A database made by an older keysvc is brought up by the steps
in ``POSTGRES_MIGRATIONS``: the PostgreSQL form of each SQLite step added since
PostgreSQL's first schema, keyed by the version it makes. A database newer than this
code, or one with a step missing, is refused.

Several instances may start on one database at once: the whole upgrade runs in one
transaction under the migration's lock (``_migration_lock``: a row of keysvc_locks,
which only keysvc's role may lock), so one applies it and the others find it done.
"""

import asyncio
import logging
import re
import time
from collections.abc import Mapping
from importlib import resources
from typing import Any

import asyncpg

from keysvc.config import ConfigError
from keysvc.db.sqlite.migrations import (
    BULK_INSERT_PG,
    BULK_INSERT_STEP,
    FAIR_DELIVERY_STEP,
    GROWTH_STEP,
    IDENTITIES_STEP,
    KEY_DETAILS_STEP,
    KEY_IMPORTS_STEP,
    KEY_RATELIMITS_STEP,
    LEAK_LOOKUP_STEP,
    LISTENERS_STEP,
    MIGRATIONS,
    PENDING_LEAKS_STEP,
    REPLACED_SECRETS_STEP,
    SHARED_LIMITS_STEP,
    WEBHOOK_BINDING_STEP,
    WEBHOOK_CONTROLS_STEP,
    schema_version,
)

logger = logging.getLogger("keysvc")

# POSTGRES_MIGRATIONS[n] takes a PostgreSQL database from version n - 1 to n; add one
# with each step appended to keysvc.db.sqlite.migrations.MIGRATIONS, and change
# schema_postgres.sql to match.
POSTGRES_MIGRATIONS: Mapping[int, str] = {
    # 12: every change to a table, by hand included, is announced (see schema_postgres.sql).
    12: """
    -- Every commit that changes a table is announced on keysvc_data, hand edits included,
    -- as SQLite's data_version tells its own connections: an instance hearing it reads
    -- again what it had cached (keysvc.db.postgres.store). Within a transaction the
    -- notifications are one. A keysvc writer sets keysvc.token for its transaction: its
    -- instance knows its own commits heard back by it, the other instances do not.
    -- A new key's role rows leave the generation where it is (keysvc.db.postgres.store's
    -- create_key sets keysvc.new_key for them): nothing cached can hold a key not yet
    -- made, and the generation only ever moves forward, as the instances' acknowledgements
    -- of it need.
    create or replace function keysvc_auth_changed() returns trigger
    language plpgsql as $$
    begin
        if coalesce(current_setting('keysvc.new_key', true), '') <> 'on' then
            update meta set value = (value::bigint + 1)::text where name = 'auth_generation';
        end if;
        return null;
    end $$;
    create or replace function keysvc_data_changed() returns trigger
    language plpgsql as $$
    begin
        perform pg_notify('keysvc_data', coalesce(current_setting('keysvc.token', true), ''));
        return null;
    end $$;
    do $$
    declare
        name text;
    begin
        foreach name in array array['meta', 'organizations', 'roles', 'api_keys', 'key_roles',
            'deleted_credentials', 'key_usage', 'activities', 'activity_heads', 'webhooks',
            'webhook_deliveries', 'webhook_attempts', 'webhook_expiry_warnings'] loop
            execute format('create or replace trigger %I'
                ' after insert or update or delete or truncate on %I'
                ' for each statement execute function keysvc_data_changed()',
                name || '_data_changed', name);
        end loop;
    end $$;
    """,
    # The version SQLite's no-op step makes, wherever the lead's merge puts it.
    schema_version(MIGRATIONS[: MIGRATIONS.index(SHARED_LIMITS_STEP) + 1]): """
    create unlogged table if not exists shared_limits (
        name       text collate "C" not null,
        starts_at  bigint not null,
        expires_at double precision not null,
        count      bigint not null,
        primary key (name, starts_at)
    );
    create index if not exists shared_limits_expiry on shared_limits (expires_at);
    """,
    # 14: outbox MACs and bound webhook secrets (as SQLite's WEBHOOK_BINDING_STEP).
    schema_version(MIGRATIONS[: MIGRATIONS.index(WEBHOOK_BINDING_STEP) + 1]): """
    alter table webhooks add column if not exists secret_version bigint not null default 1;
    alter table webhook_deliveries add column if not exists mac bytea;
    update webhooks set nonce = sha256(nonce || convert_to(gen_random_uuid()::text, 'UTF8'))
    where exists (
        select 1 from webhooks w where w.nonce = webhooks.nonce and w.seq < webhooks.seq);
    create unique index if not exists webhooks_nonce on webhooks (nonce);
    """,
    # The instances' listening connections (keysvc.db.postgres.peers), which
    # only keysvc's role may write; numbered where SQLite's no-op step lands.
    schema_version(MIGRATIONS[: MIGRATIONS.index(LISTENERS_STEP) + 1]): """
    create unlogged table if not exists listeners (
        instance      text collate "C" primary key,
        pid           integer not null,
        backend_start timestamptz not null
    );
    revoke all on listeners from public;
    """,
    # Fair delivery: indexes for its choice (the same text as SQLite's).
    schema_version(MIGRATIONS[: MIGRATIONS.index(FAIR_DELIVERY_STEP) + 1]): FAIR_DELIVERY_STEP,
    # 17: the activity date index, the write budgets, the waiting deliveries' index and
    # the pruned log's anchors (as SQLite's GROWTH_STEP).
    schema_version(MIGRATIONS[: MIGRATIONS.index(GROWTH_STEP) + 1]): """
    create index if not exists activities_org_time
        on activities (organization_id, created_at, org_seq, type, key_update_type);
    create table if not exists activity_anchors (
        organization_id text collate "C" primary key,
        first_seq       bigint not null,
        prev_hash       bytea not null,
        state           text collate "C" not null,
        mac             bytea not null
    );

    create table if not exists write_budgets (
        organization_id text collate "C" primary key,
        window_start    bigint not null,
        bytes           bigint not null
    );
    create index if not exists webhook_deliveries_waiting
        on webhook_deliveries (webhook_id) where state = 'pending';
    create or replace trigger activity_anchors_data_changed
        after insert or update or delete or truncate on activity_anchors
        for each statement execute function keysvc_data_changed();
    create or replace trigger write_budgets_data_changed
        after insert or update or delete or truncate on write_budgets
        for each statement execute function keysvc_data_changed();
    """,
    # 18: keys found by their secret's keyed hash, and the secrets reported leaked (as
    # SQLite's LEAK_LOOKUP_STEP).
    schema_version(MIGRATIONS[: MIGRATIONS.index(LEAK_LOOKUP_STEP) + 1]): """
    create index if not exists api_keys_secret on api_keys (secret_hash);
    create index if not exists api_keys_previous_secret on api_keys (previous_secret_hash)
        where previous_secret_hash is not null;
    create table if not exists leak_reports (
        key_id      text collate "C" not null references api_keys (id) on delete cascade,
        secret_hash bytea not null,
        reported_at text collate "C" not null,
        primary key (key_id, secret_hash)
    );
    create or replace trigger leak_reports_data_changed
        after insert or update or delete or truncate on leak_reports
        for each statement execute function keysvc_data_changed();
    """,
    # Webhook secret rotation, failing since and disabled (as SQLite's WEBHOOK_CONTROLS_STEP).
    schema_version(MIGRATIONS[: MIGRATIONS.index(WEBHOOK_CONTROLS_STEP) + 1]): """
    alter table webhooks add column if not exists previous_nonce bytea;
    alter table webhooks add column if not exists previous_secret_version bigint;
    alter table webhooks add column if not exists previous_until double precision;
    alter table webhooks add column if not exists failing_since double precision;
    alter table webhooks add column if not exists disabled_at text collate "C";
    """,
    # Keys' externalId, meta and credits (as SQLite's KEY_DETAILS_STEP, issue 29).
    schema_version(MIGRATIONS[: MIGRATIONS.index(KEY_DETAILS_STEP) + 1]): """
    create table if not exists key_details (
        key_id                  text collate "C" primary key
                                references api_keys (id) on delete cascade,
        external_id             text collate "C",
        meta                    text collate "C",
        credits_remaining       bigint,
        credits_refill_interval text collate "C",
        credits_refill_amount   bigint,
        credits_refill_day      bigint,
        credits_next_refill     text collate "C",
        credits_base            bigint,
        credits_flags           bigint not null default 0
    );
    create index if not exists key_details_external_id
        on key_details (external_id) where external_id is not null;
    create or replace trigger key_details_data_changed
        after insert or update or delete or truncate on key_details
        for each statement execute function keysvc_data_changed();
    create table if not exists key_usage_credits (
        key_id    text collate "C" not null references api_keys (id) on delete cascade,
        minute    text collate "C" not null,
        exhausted bigint not null default 0,
        primary key (key_id, minute)
    );
    create index if not exists key_usage_credits_minute on key_usage_credits (minute);
    create or replace trigger key_usage_credits_data_changed
        after insert or update or delete or truncate on key_usage_credits
        for each statement execute function keysvc_data_changed();
    """,
    # Revoke-by-secret reports not yet acted on (as SQLite's PENDING_LEAKS_STEP).
    schema_version(MIGRATIONS[: MIGRATIONS.index(PENDING_LEAKS_STEP) + 1]): """
    create table if not exists pending_leak_reports (
        seq           bigint generated by default as identity primary key,
        secret_hash   bytea not null,
        actor_type    text collate "C" not null,
        actor_ip      text collate "C",
        user_agent    text collate "C",
        actor_details text collate "C",
        action        text collate "C" not null,
        reported_at   text collate "C" not null
    );
    create or replace trigger pending_leak_reports_data_changed
        after insert or update or delete or truncate on pending_leak_reports
        for each statement execute function keysvc_data_changed();
    """,
    # Tombstones found by their secret's keyed hash (as SQLite's REPLACED_SECRETS_STEP).
    schema_version(MIGRATIONS[: MIGRATIONS.index(REPLACED_SECRETS_STEP) + 1]): (
        REPLACED_SECRETS_STEP
    ),
    # Imported records' importIds (as SQLite's KEY_IMPORTS_STEP, issue 37).
    schema_version(MIGRATIONS[: MIGRATIONS.index(KEY_IMPORTS_STEP) + 1]): """
    create table if not exists key_imports (
        organization_id text collate "C" not null,
        import_id       text collate "C" not null,
        key_id          text collate "C" not null,
        imported_at     text collate "C" not null,
        primary key (organization_id, import_id)
    );
    create or replace trigger key_imports_data_changed
        after insert or update or delete or truncate on key_imports
        for each statement execute function keysvc_data_changed();
    """,
    # Keys' named rate limits (as SQLite's KEY_RATELIMITS_STEP, issue 36).
    schema_version(MIGRATIONS[: MIGRATIONS.index(KEY_RATELIMITS_STEP) + 1]): """
    alter table key_details add column if not exists ratelimits text collate "C";
    """,
    # Identities, and one for each externalId keys carry (as SQLite's IDENTITIES_STEP).
    schema_version(MIGRATIONS[: MIGRATIONS.index(IDENTITIES_STEP) + 1]): """
    create table if not exists identities (
        id                      text collate "C" primary key,
        organization_id         text collate "C" not null
                                references organizations (id) on delete cascade,
        org_seq                 bigint not null,
        external_id             text collate "C" not null,
        meta                    text collate "C",
        ratelimits              text collate "C",
        credits_remaining       bigint,
        credits_refill_interval text collate "C",
        credits_refill_amount   bigint,
        credits_refill_day      bigint,
        credits_next_refill     text collate "C",
        credits_base            bigint,
        credits_flags           bigint not null default 0,
        created_at              text collate "C" not null,
        updated_at              text collate "C" not null
    );
    create unique index if not exists identities_external_id
        on identities (organization_id, external_id);
    create unique index if not exists identities_org_position
        on identities (organization_id, org_seq);
    create or replace trigger identities_data_changed
        after insert or update or delete or truncate on identities
        for each statement execute function keysvc_data_changed();
    insert into identities (id, organization_id, org_seq, external_id, created_at, updated_at)
    select gen_random_uuid()::text, organization_id,
           row_number() over (partition by organization_id order by first_seq),
           external_id, to_char(now() at time zone 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"'),
           to_char(now() at time zone 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"')
    from (select k.organization_id, d.external_id, min(k.seq) as first_seq
          from key_details d join api_keys k on k.id = d.key_id
          where d.external_id is not null group by k.organization_id, d.external_id) found;
    """,
    # SQLite's import triggers stand aside for a batch (BULK_INSERT_STEP): nothing here.
    schema_version(MIGRATIONS[: MIGRATIONS.index(BULK_INSERT_STEP) + 1]): BULK_INSERT_PG,
}

# keysvc's locks, rows of a table of its own: taking one ``for update`` needs UPDATE on
# the table, which no role but keysvc's has (``revoke all ... from public``), where an
# advisory lock's key any role that may CONNECT can take and hold. The writes hold
# 'write' (keysvc.db.postgres.store.PgWriter), a schema change 'migration'; both for
# their transaction only. Made at every start where missing: code, not data, so a
# database of any version gets it without a numbered step.
LOCKS_TABLE = "keysvc_locks"
LOCKS_SQL = """
create table if not exists keysvc_locks (name text collate "C" primary key);
revoke all on keysvc_locks from public;
insert into keysvc_locks (name) values ('write'), ('migration') on conflict do nothing;
"""
TAKE_LOCK = "select name from keysvc_locks where name = $1 for update"
# The advisory lock a database without keysvc_locks (empty, or made by an older keysvc)
# is migrated under, waited for at most MIGRATION_WAIT_SECONDS: any role that may
# connect can hold it.
MIGRATION_LOCK = 0x6B657973
MIGRATION_WAIT_SECONDS = 60.0
_MIGRATION_LOG_SECONDS = 10.0
_HOLDERS = (
    "select coalesce(string_agg(distinct format('%s (pid %s)', a.usename, a.pid), ', '), '?')"
    " from pg_locks l join pg_stat_activity a using (pid)"
    " where l.locktype = 'advisory' and l.granted and l.objid = $1 and l.database ="
    " (select oid from pg_database where datname = current_database())"
)

_VERSION = "select value from meta where name = 'schema_version'"

# keysvc's own sessions are quiet (``QUIET``, set on every connection it makes): the
# triggers leave their changes unannounced, and keysvc announces them after the
# commit (``keysvc.db.postgres.store.PgWriter``). A NOTIFY inside a transaction makes
# its COMMIT depend on the NOTIFY queue, one per cluster, which any role that may log
# in anywhere on the server can fill. A hand edit still announces itself.
QUIET = {"keysvc.quiet": "on"}
_UNLESS_QUIET = "coalesce(current_setting('keysvc.quiet', true), '') <> 'on'"
# The trigger functions' bodies, replaced at every start when they differ: code, not
# data, so a database of any version gets them without a numbered step.
TRIGGER_FUNCTIONS = {
    "keysvc_data_changed": f"""
begin
    if {_UNLESS_QUIET} then
        perform pg_notify('keysvc_data', coalesce(current_setting('keysvc.token', true), ''));
    end if;
    return null;
end """,
    "keysvc_auth_announced": f"""
begin
    if {_UNLESS_QUIET} then
        perform pg_notify('keysvc_auth', new.value);
    end if;
    return null;
end """,
    # An import's batch counts its keys in one statement (keysvc.db.imports'
    # BULK_COUNTED, keysvc.bulk_insert set for its rows): row by row, each key updated
    # its organization's one row again, under the write lock every instance takes, and
    # a 10,000-key batch outlasted the statement bound (rt41 R5).
    "keysvc_key_counted": """
begin
    if coalesce(current_setting('keysvc.bulk_insert', true), '') <> 'on' then
        update organizations set key_count = key_count + 1,
                                 last_key_seq = greatest(last_key_seq, new.org_seq)
        where id = new.organization_id;
    end if;
    return null;
end """,
}
_BODY = "select prosrc from pg_proc where oid = to_regproc($1)"


async def _quiet_triggers(conn: Any) -> None:
    """Give the trigger functions ``TRIGGER_FUNCTIONS``' bodies where they differ."""
    for name, body in TRIGGER_FUNCTIONS.items():
        if await conn.fetchval(_BODY, name) != body:
            await conn.execute(
                f"create or replace function {name}() returns trigger"
                f" language plpgsql as $body${body}$body$"
            )


async def _locks_table(conn: Any) -> None:
    if await conn.fetchval("select to_regclass($1) is null", LOCKS_TABLE):
        await conn.execute(LOCKS_SQL)


async def _migration_lock(conn: Any) -> None:
    """The migration's lock, for the transaction under way: keysvc_locks' 'migration'
    row where the table is there; otherwise MIGRATION_LOCK, waited for at most
    MIGRATION_WAIT_SECONDS with a log line every few seconds naming its holders
    (pg_locks), then a ConfigError."""
    if await conn.fetchval("select to_regclass($1) is not null", LOCKS_TABLE):
        # Bounded as the advisory lock's wait: a keysvc that starts while another
        # holds the row (migrating, or frozen while it did) ends with a clear error
        # rather than waiting without end; systemd starts it again.
        await conn.execute(f"set local lock_timeout = {int(MIGRATION_WAIT_SECONDS * 1000)}")
        try:
            await conn.fetchval(TAKE_LOCK, "migration")
        except asyncpg.LockNotAvailableError:
            raise ConfigError(
                f"could not take keysvc's migration lock (the 'migration' row of {LOCKS_TABLE})"
                f" within {MIGRATION_WAIT_SECONDS:.0f} s: another keysvc is migrating the"
                " database, or holds the row; see pg_locks"
            ) from None
        await conn.execute("set local lock_timeout = default")
        return
    started = time.monotonic()
    logged = started
    while not await conn.fetchval("select pg_try_advisory_xact_lock($1)", MIGRATION_LOCK):
        now = time.monotonic()
        holders = await conn.fetchval(_HOLDERS, MIGRATION_LOCK)
        if now - started >= MIGRATION_WAIT_SECONDS:
            raise ConfigError(
                f"could not take keysvc's migration lock (pg_advisory_lock({MIGRATION_LOCK}))"
                f" within {MIGRATION_WAIT_SECONDS:.0f} s: held by {holders}; see pg_locks"
            )
        if now - logged >= _MIGRATION_LOG_SECONDS:
            logged = now
            logger.warning(
                "waiting for keysvc's migration lock (pg_advisory_lock(%d)), held by %s"
                " (pg_locks); giving up after %.0f s", MIGRATION_LOCK, holders,
                MIGRATION_WAIT_SECONDS,
            )  # fmt: skip
        await asyncio.sleep(0.5)


# keysvc's tables of the current schema (and the lock table) that a role keysvc's is
# not, or is not a member of, owns: made by someone else before keysvc made them, kept
# by ``create table if not exists``. Their owner could hold keysvc's locks, read every
# row and add triggers, so keysvc refuses to start on them.
_OTHERS_TABLES = """
with recursive mine (oid) as (
    select oid from pg_roles where rolname = current_user
    union select m.roleid from pg_auth_members m join mine on m.member = mine.oid
)
select c.relname::text, pg_get_userbyid(c.relowner)::text from pg_class c
where c.oid in (select to_regclass(name) from unnest($1::text[]) name)
  and c.relowner not in (select oid from mine)
  -- A superuser's table is trusted: a superuser can do anything to keysvc's data anyway.
  and not (select rolsuper from pg_roles where oid = c.relowner)
order by c.relname
"""
_TABLE_NAME = re.compile(r"create table if not exists (\w+)", re.IGNORECASE)


async def _refuse_others_tables(conn: Any) -> None:
    """ConfigError when a table keysvc makes is already there, owned by another role."""
    names = [LOCKS_TABLE, *_TABLE_NAME.findall(postgres_schema_sql())]
    found = await conn.fetch(_OTHERS_TABLES, names)
    if found:
        owned = ", ".join(f"{row[0]} is owned by {row[1]}" for row in found)
        raise ConfigError(
            f"refusing a database where another role made keysvc's tables first: {owned},"
            " not by keysvc's role (current_user) or a role it is a member of. Drop them,"
            " and revoke CREATE on schema public from PUBLIC (PostgreSQL 14's default)"
        )


def postgres_schema_sql() -> str:
    return resources.files("keysvc").joinpath("schema_postgres.sql").read_text()


async def recorded_version(conn: Any) -> int:
    """The version the database is at; 0 when keysvc has not made it."""
    if await conn.fetchval("select to_regclass('meta') is null"):
        return 0
    value = await conn.fetchval(_VERSION)
    return 0 if value is None else int(value)


async def migrate(
    conn: Any, *, create: bool = True, steps: Mapping[int, str] = POSTGRES_MIGRATIONS
) -> int:
    """Bring the database to the current version; returns the version it was at.

    ``conn`` is an asyncpg connection. ``create=False`` refuses a database keysvc has
    not made (version 0) instead of writing the schema into it.
    """
    target = schema_version()
    async with conn.transaction():
        # Before the lock: a lock table another role owns may be held by it for ever.
        await _refuse_others_tables(conn)
        await _migration_lock(conn)
        current = await recorded_version(conn)
        if current > target:
            raise ConfigError(
                f"database schema version {current} is newer than this keysvc supports ({target})"
            )
        if current == target:
            await _quiet_triggers(conn)
            await _locks_table(conn)
            return current
        if current == 0:
            if not create:
                raise ConfigError(
                    "the database has no keysvc schema: make one with `keysvc bootstrap`,"
                    " or correct the URL"
                )
            await conn.execute(postgres_schema_sql())
        else:
            missing = [n for n in range(current + 1, target + 1) if n not in steps]
            if missing:
                raise ConfigError(
                    f"this keysvc cannot upgrade a PostgreSQL database from schema version"
                    f" {current}: it has no PostgreSQL step for version {missing[0]}"
                )
            for version in range(current + 1, target + 1):
                await conn.execute(steps[version])
        await conn.execute(
            "insert into meta (name, value) values ('schema_version', $1)"
            " on conflict (name) do update set value = excluded.value",
            str(target),
        )
        await _quiet_triggers(conn)
        await _locks_table(conn)
    return current


async def schema_is_current(conn: Any) -> bool:
    """True when the database answers and its schema is the one this code expects."""
    return await recorded_version(conn) == schema_version()
