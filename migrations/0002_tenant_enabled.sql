-- 0002: a tenant can be disabled (`notifier tenant disable NAME`): its API key is refused and
-- its events fan out to no channel. Every tenant of an earlier release stays enabled.
ALTER TABLE tenants ADD COLUMN IF NOT EXISTS enabled boolean NOT NULL DEFAULT true;
