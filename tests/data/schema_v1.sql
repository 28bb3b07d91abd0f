-- keysvc: the current schema. Applied as a whole to a new database; an older
-- database is brought up to date by the numbered steps in keysvc/db.py, and
-- PRAGMA user_version records which step it is at.

create table if not exists meta (
    name  text primary key,
    value text not null
) strict;

create table if not exists organizations (
    id         text primary key,           -- uuid
    name       text not null,
    created_at text not null
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
-- base64(SHA-256(value))) of each. seq gives creation order for paging.
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
    used_at         text
) strict;

create index if not exists api_keys_org_seq on api_keys (organization_id, seq);

create table if not exists key_roles (
    key_id  text not null references api_keys (id) on delete cascade,
    role_id text not null references roles (id) on delete restrict,
    primary key (key_id, role_id)
) strict, without rowid;

create index if not exists key_roles_role on key_roles (role_id);
