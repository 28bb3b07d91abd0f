-- keysvc: the current schema. Applied as a whole to a new database; an older
-- database is brought up to date by the numbered steps in keysvc/db/migrations.py, and
-- PRAGMA user_version records which step it is at.

create table if not exists meta (
    name  text primary key,
    value text not null
) strict;

-- Bumped by every write that can change an authorization answer; each
-- process drops its credential cache when it sees the value move.
insert or ignore into meta (name, value) values ('auth_generation', '0');

create table if not exists organizations (
    id         text primary key,           -- uuid
    name       text not null,
    created_at text not null,
    key_count  integer not null default 0, -- its rows in api_keys, kept by the triggers below
    -- The highest api_keys.org_seq given out here, kept by api_keys_counted; it never
    -- goes back, so a deleted key's place is never given again.
    last_key_seq integer not null default 0
) strict;

-- System roles have no organization: they exist in every organization with
-- the same fixed UUID. Custom roles belong to one organization.
create table if not exists roles (
    id              text primary key,      -- uuid
    organization_id text references organizations (id) on delete cascade,
    name            text not null,
    type            text not null check (type in ('system', 'custom')),
    permissions     text not null,         -- JSON array of permission strings
    created_at      text not null,
    updated_at      text not null
) strict;

create unique index if not exists roles_org_name on roles (coalesce(organization_id, ''), name);

insert or ignore into roles (id, organization_id, name, type, permissions, created_at, updated_at) values
    ('0b5d3c8e-6c1a-4c59-9d8a-7a1f0e000001', null, 'admin', 'system', '["*"]',
     '2026-01-01T00:00:00Z', '2026-01-01T00:00:00Z'),
    ('0b5d3c8e-6c1a-4c59-9d8a-7a1f0e000002', null, 'developer', 'system',
     '["keys:read","roles:read"]', '2026-01-01T00:00:00Z', '2026-01-01T00:00:00Z'),
    ('0b5d3c8e-6c1a-4c59-9d8a-7a1f0e000003', null, 'query_endpoints', 'system',
     '["endpoints:query"]', '2026-01-01T00:00:00Z', '2026-01-01T00:00:00Z');

-- Neither the key ID nor the secret is stored: only HMAC-SHA256(pepper,
-- base64(SHA-256(value))) of each. seq gives creation order; org_seq the key's
-- place in its own organization's (1, 2, ...), which list cursors carry, so that
-- they tell nothing of other organizations.
create table if not exists api_keys (
    seq             integer primary key,
    id              text not null unique,  -- uuid, used in paths
    organization_id text not null references organizations (id) on delete cascade,
    name            text not null,
    state           text not null check (state in ('enabled', 'disabled')),
    key_id_hash     blob not null unique,
    secret_hash     blob not null,
    key_suffix      text not null,
    ip_access_list  text not null default '[]',  -- JSON array of {source, description}
    created_at      text not null,
    expire_at       text,
    used_at         text,
    rate_limit      integer,               -- this key's own request limit, per rate_window
    rate_window     integer,               -- seconds
    org_seq         integer not null default 0,
    -- The credentials a rotation replaced, as keyed hashes like the current ones, and
    -- when they stop working (keysvc.keys.rotate_key); null when there are none.
    previous_key_id_hash blob,
    previous_secret_hash blob,
    previous_until       text
) strict;

create unique index if not exists api_keys_org_position on api_keys (organization_id, org_seq);
-- A previous key ID is looked up like a current one (keysvc.db.keys.CREDENTIAL).
create unique index if not exists api_keys_previous_key_id on api_keys (previous_key_id_hash);
-- A key found by its secret's keyed hash alone (keysvc.db.keys.BY_SECRET: revoke-by-secret
-- and secret scanning), current or a rotation's previous one; not unique (hashData keys
-- may share a secret).
create index if not exists api_keys_secret on api_keys (secret_hash);
create index if not exists api_keys_previous_secret on api_keys (previous_secret_hash)
    where previous_secret_hash is not null;
-- Nor may a new key take a key ID that another key's replaced credentials still
-- answer to (a rotation checks its own new key ID: keysvc.keys.rotate_key).
-- An import's batch makes this check for all its keys at once, in its transaction
-- (keysvc.db.imports), while meta's 'bulk_insert' row, which only the batch's own
-- transaction ever sees, stands the three row triggers aside.
create trigger if not exists api_keys_key_id_not_previous before insert on api_keys
when not exists (select 1 from meta where name = 'bulk_insert')
 and exists (select 1 from api_keys where previous_key_id_hash = new.key_id_hash)
begin
    select raise(abort, 'api_keys.key_id_hash: another key''s previous key ID');
end;

-- organizations.key_count, so that the per-organization cap and totalCount need
-- not count the organization's keys: a create batch did, and it grew with them.
create trigger if not exists api_keys_counted after insert on api_keys
when not exists (select 1 from meta where name = 'bulk_insert')
begin
    update organizations set key_count = key_count + 1,
                             last_key_seq = max(last_key_seq, new.org_seq)
    where id = new.organization_id;
end;
create trigger if not exists api_keys_uncounted after delete on api_keys begin
    update organizations set key_count = key_count - 1 where id = old.organization_id;
end;

create table if not exists key_roles (
    key_id  text not null references api_keys (id) on delete cascade,
    role_id text not null references roles (id) on delete restrict,
    primary key (key_id, role_id)
) strict, without rowid;

create index if not exists key_roles_role on key_roles (role_id);

-- The secrets reported leaked per key, as keyed hashes (keysvc.domain.leaks), so that
-- the same report again records nothing. Gone with the key.
create table if not exists leak_reports (
    key_id      text not null references api_keys (id) on delete cascade,
    secret_hash blob not null,
    reported_at text not null,
    primary key (key_id, secret_hash)
) strict, without rowid;

-- Revoke-by-secret reports received and not yet acted on (keysvc.db.pendingleaks): each
-- written before its answer, acted on and deleted in one transaction by a background
-- task. The secret's keyed hash (as api_keys.secret_hash), never the secret.
create table if not exists pending_leak_reports (
    seq           integer primary key,
    secret_hash   blob not null,
    actor_type    text not null,
    actor_ip      text,
    user_agent    text,
    actor_details text,
    action        text not null,             -- KEYSVC_LEAKED_KEY_ACTION when received
    reported_at   text not null
) strict;

-- The cascade above runs only where foreign keys are on: keysvc turns them on, the
-- sqlite3 shell does not. A key deleted there by hand (docs/SECURITY.md) would leave
-- role rows that no API call can clear, and its roles could never be deleted.
create trigger if not exists api_keys_roles_dropped after delete on api_keys begin
    delete from key_roles where key_id = old.id;
end;

-- Tombstones: the credentials of deleted keys, as the same keyed hashes, so that a
-- deleted key's use is logged (keysvc.auth) while it fails as an unknown key ID
-- does; pruned after the usage retention (keysvc.db.core). The trigger also runs
-- for a delete by hand. A rotation's previous key ID is kept while its grace runs.
-- A rotated key's replaced credentials are kept here too once they stop working
-- (keysvc.db.keys ENTOMB_*), key_id then naming a key that still exists, so that
-- their use is answered "rotated" rather than counted as a failed login.
create table if not exists deleted_credentials (
    key_id_hash     blob primary key,
    secret_hash     blob not null,
    key_id          text not null,         -- the deleted api_keys.id (uuid)
    organization_id text not null,
    deleted_at      text not null
) strict, without rowid;
-- A secret a rotation replaced, found by its keyed hash (keysvc.db.keys.BY_SECRET).
create index if not exists deleted_credentials_secret on deleted_credentials (secret_hash);

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

-- Authentications of each key per minute, by outcome (keysvc.db.usage): written by
-- each process in batches, as upserts that add. No foreign key: a key's rows go with
-- it by the trigger below, which also runs for a delete by hand with foreign keys
-- off, and a count for a key already deleted is not written.
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

-- Old rows are pruned by minute (KEYSVC_USAGE_RETENTION_DAYS).
create index if not exists key_usage_minute on key_usage (minute);

-- Issue 29: a key's externalId (the caller's own ID for who the key is for), its meta
-- (a JSON object, as given) and its credits (credits_remaining null: unlimited; the
-- refill and its next moment; the last set or refill amount; the credit events sent,
-- keysvc.models.LOW_SENT and EXHAUSTED_SENT). A row only for a key with one of them; a
-- spend writes here, never api_keys, whose triggers move auth_generation.
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
    credits_flags           integer not null default 0,
    ratelimits              text  -- issue 36: keysvc.domain.namedlimits' stored form
) strict, without rowid;
create index if not exists key_details_external_id
    on key_details (external_id) where external_id is not null;

-- Issue 29: verifies refused for exhausted credits, per key and minute: the usage
-- series' creditsExhausted (beside key_usage, whose rows keysvc.db.usage writes).
create table if not exists key_usage_credits (
    key_id    text not null references api_keys (id) on delete cascade,
    minute    text not null,
    exhausted integer not null default 0,
    primary key (key_id, minute)
) strict, without rowid;
create index if not exists key_usage_credits_minute on key_usage_credits (minute);

-- Issue 36: identities. A key belongs to the identity of its organization whose
-- external_id is the key's (no column on the key); org_seq is its place in its
-- organization's list; ratelimits is keysvc.domain.namedlimits' stored form; the
-- credit columns are key_details'.
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

create trigger if not exists api_keys_usage_dropped after delete on api_keys begin
    delete from key_usage where key_id = old.id;
end;

-- Any change to what a key may do moves auth_generation, whoever makes it: the
-- API, or an operator editing the file by hand (docs/SECURITY.md, "Emergency
-- revocation"). Not usedAt alone, which moves every minute a key is used and
-- would otherwise drop every cache as often. A create's own key_roles rows move
-- it too; the create puts it back, since no cache can hold a key not yet committed.
create trigger if not exists api_keys_access_changed
after update of id, organization_id, name, state, key_id_hash, secret_hash, key_suffix,
    ip_access_list, created_at, expire_at, rate_limit, rate_window on api_keys
begin
    update meta set value = cast(value as integer) + 1 where name = 'auth_generation';
end;
-- A rotation's previous credentials, by hand included (docs/SECURITY.md, "Emergency
-- revocation"): a trigger of their own, so that the one above stays as it was.
create trigger if not exists api_keys_previous_changed
after update of previous_key_id_hash, previous_secret_hash, previous_until on api_keys
begin
    update meta set value = cast(value as integer) + 1 where name = 'auth_generation';
end;
create trigger if not exists api_keys_access_removed after delete on api_keys begin
    update meta set value = cast(value as integer) + 1 where name = 'auth_generation';
end;
create trigger if not exists key_roles_granted after insert on key_roles
when not exists (select 1 from meta where name = 'bulk_insert')
begin
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
-- The activity log (audit log): every key and role write records its activity in
-- its own transaction. Each organization's records form a hash chain: hash is an
-- HMAC, keyed from the pepper, over the record's content and prev_hash (the hash of
-- the record before it in the organization, zero bytes for the first). The head
-- keeps each organization's count and last hash, with an HMAC of both, so that
-- removing the last records is caught too (`keysvc audit verify`). before and after
-- are JSON objects of the public values that changed, never secrets or hashes.
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
-- The date filter and the counts of a list read this, not the records themselves.
create index if not exists activities_org_time
    on activities (organization_id, created_at, org_seq, type, key_update_type);

-- Where a pruned organization's chain starts (keysvc.db.retention): the first record
-- kept, the hash of the one before it, and what the pruned records left (the keys and
-- custom roles as they replay, JSON), with an HMAC of all of them.
create table if not exists activity_anchors (
    organization_id text primary key,
    first_seq       integer not null,
    prev_hash       blob not null,
    state           text not null,
    mac             blob not null
) strict, without rowid;

-- What each organization wrote this hour, in bytes of activities and webhook
-- deliveries (keysvc.db.quota): the write budget's counter.
create table if not exists write_budgets (
    organization_id text primary key,
    window_start    integer not null,
    bytes           integer not null
) strict, without rowid;

create table if not exists activity_heads (
    organization_id text primary key,
    count           integer not null,
    last_hash       blob not null,
    mac             blob not null
) strict;

-- Webhooks (keysvc.webhooks): where an organization's key events are POSTed. The
-- signing secret is not stored: only a random nonce, from which the secret is derived
-- with a key that comes from the pepper (keysvc.credentials), so the database alone
-- cannot sign. secret_version 2 binds the secret to the webhook's id, organization and
-- url as well; 1 (webhooks made before it) derives it from the nonce alone. A nonce is
-- unique, so that no second row can share a webhook's secret. A rotation's previous
-- secret (previous_nonce, previous_secret_version) signs beside the new one until
-- previous_until (unix seconds); failing_since: since when every attempt has failed
-- (null: the last one was delivered); disabled_at: when it was disabled (null: enabled).
create table if not exists webhooks (
    seq             integer primary key,
    id              text not null unique,  -- uuid
    organization_id text not null references organizations (id) on delete cascade,
    url             text not null,
    events          text not null,         -- JSON array of event types
    expiring_days   integer not null,
    nonce           blob not null,
    created_at      text not null,
    secret_version  integer not null default 1,
    previous_nonce  blob,
    previous_secret_version integer,
    previous_until  real,
    failing_since   real,
    disabled_at     text
) strict;

create index if not exists webhooks_org on webhooks (organization_id, seq);
create unique index if not exists webhooks_nonce on webhooks (nonce);

-- The outbox: one row per event and webhook, written in the transaction of the write
-- that made the event, and delivered by a background task (keysvc.delivery). Instants
-- the scheduler compares are unix seconds. mac: HMAC with a key from the pepper over
-- what the row sends and where (keysvc.db.seal.Seal); a row without a valid one is
-- not sent.
create table if not exists webhook_deliveries (
    seq             integer primary key,
    id              text not null unique,  -- uuid
    webhook_id      text not null references webhooks (id) on delete cascade,
    event_id        text not null,         -- the same for every webhook the event goes to
    event_type      text not null,
    body            text not null,         -- the JSON POSTed, signed as it is
    created_at      text not null,
    give_up_at      real not null,
    state           text not null check (state in ('pending', 'delivered', 'failed')),
    attempts        integer not null default 0,
    next_attempt_at real,                  -- null once delivered or failed
    lease_until     real,                  -- a process is attempting it until then
    lease_owner     text,
    mac             blob                   -- null: queued before MACs, or not keysvc's
) strict;

create index if not exists webhook_deliveries_due on webhook_deliveries (next_attempt_at)
    where state = 'pending';
create index if not exists webhook_deliveries_of on webhook_deliveries (webhook_id, seq);
-- Fair delivery's choice (keysvc.db.outbox.DUE): each webhook's next due delivery in
-- one seek, and the few leased deliveries without a scan.
create index if not exists webhook_deliveries_next
    on webhook_deliveries (webhook_id, next_attempt_at) where state = 'pending';
create index if not exists webhook_deliveries_leased
    on webhook_deliveries (lease_until) where lease_until is not null;
-- The deliveries still waiting, counted per webhook against its queue limit.
create index if not exists webhook_deliveries_waiting
    on webhook_deliveries (webhook_id) where state = 'pending';
create index if not exists webhook_deliveries_done on webhook_deliveries (give_up_at)
    where state <> 'pending';

create table if not exists webhook_attempts (
    delivery_seq integer not null references webhook_deliveries (seq) on delete cascade,
    n            integer not null,         -- 1, 2, ...
    at           text not null,
    status       integer,                  -- the receiver's HTTP status
    error        text,                     -- or why there was none: an error class
    primary key (delivery_seq, n)
) strict, without rowid;

-- Which key.expiring warnings were enqueued: one per webhook, key and expiry date.
create table if not exists webhook_expiry_warnings (
    webhook_id text not null references webhooks (id) on delete cascade,
    key_id     text not null references api_keys (id) on delete cascade,
    expire_at  text not null,
    primary key (webhook_id, key_id, expire_at)
) strict, without rowid;

create index if not exists webhook_expiry_warnings_key on webhook_expiry_warnings (key_id);

-- Issue 37: each imported record's importId per organization, and the key it made
-- (keysvc.db.imports), so that importing the same record again makes nothing. No
-- foreign key: kept after its key is deleted, so that a repeated import never brings a
-- deleted key back.
create table if not exists key_imports (
    organization_id text not null,
    import_id       text not null,
    key_id          text not null,
    imported_at     text not null,
    primary key (organization_id, import_id)
) strict, without rowid;
