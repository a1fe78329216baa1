-- 0013: the customer portal (README "Customer portal", docs/architecture.md). A channel may carry
-- a `customer` label: the tenant's own customer it belongs to, which a portal link can be scoped
-- to. A portal link is scoped to one customer label or to a fixed list of the tenant's channels,
-- and is kept by the SHA-256 of its token only (the token is in the link's URL, never stored).
-- It opens sessions until it expires or is revoked; a session is read only while its link is
-- neither (so revoking a link ends its sessions at once), and revoking deletes them too.
ALTER TABLE channels ADD COLUMN IF NOT EXISTS customer text NULL;
CREATE INDEX IF NOT EXISTS channels_customer_idx ON channels (tenant_id, customer)
    WHERE customer IS NOT NULL;

CREATE TABLE IF NOT EXISTS portal_links (
    id           uuid PRIMARY KEY,
    tenant_id    uuid NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    token_hash   text NOT NULL UNIQUE,
    customer     text NULL,
    channel_ids  uuid[] NULL,
    created_at   timestamptz NOT NULL DEFAULT now(),
    expires_at   timestamptz NOT NULL,
    revoked_at   timestamptz NULL,
    CONSTRAINT portal_links_scope_check CHECK ((customer IS NULL) <> (channel_ids IS NULL))
);
CREATE INDEX IF NOT EXISTS portal_links_tenant_idx ON portal_links (tenant_id, created_at, id);

CREATE TABLE IF NOT EXISTS portal_sessions (
    id_hash       text PRIMARY KEY,
    link_id       uuid NOT NULL REFERENCES portal_links (id) ON DELETE CASCADE,
    created_at    timestamptz NOT NULL DEFAULT now(),
    last_seen_at  timestamptz NOT NULL DEFAULT now(),
    expires_at    timestamptz NOT NULL
);
CREATE INDEX IF NOT EXISTS portal_sessions_link_idx ON portal_sessions (link_id);
