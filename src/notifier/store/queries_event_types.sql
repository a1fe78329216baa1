-- Named queries of a tenant's event-type catalog (store/event_types.py). Each block starts
-- with `-- name: NAME`. The trigger event_types_notify (schema.sql) NOTIFYs every change.

-- name: event_type_put
-- Create or replace; a new name only while the tenant has fewer than $5 types, and only while
-- its schemas stay within $6 bytes in all, as Postgres prints them (no row otherwise).
INSERT INTO event_types AS t (tenant_id, name, description, schema)
SELECT $1, $2, $3, $4
WHERE (EXISTS (SELECT 1 FROM event_types WHERE tenant_id = $1 AND name = $2)
       OR (SELECT count(*) FROM event_types WHERE tenant_id = $1) < $5)
  AND (SELECT coalesce(sum(octet_length(schema::text)), 0) FROM event_types
       WHERE tenant_id = $1 AND name <> $2) + octet_length($4::jsonb::text) <= $6
ON CONFLICT (tenant_id, name) DO UPDATE
    SET description = EXCLUDED.description, schema = EXCLUDED.schema, updated_at = now()
RETURNING name, description, schema, created_at, updated_at, (xmax = 0) AS created;

-- name: event_catalog_usage
-- Why event_type_put stored nothing: the tenant's types and their schemas' bytes, but $2's.
SELECT count(*) FILTER (WHERE name <> $2) AS types,
       coalesce(sum(octet_length(schema::text)) FILTER (WHERE name <> $2), 0) AS bytes,
       octet_length($3::jsonb::text) AS new_bytes
FROM event_types WHERE tenant_id = $1;

-- name: event_type_get
SELECT name, description, schema, created_at, updated_at FROM event_types
WHERE tenant_id = $1 AND name = $2;

-- name: event_type_list
SELECT name, description, schema, created_at, updated_at FROM event_types
WHERE tenant_id = $1 ORDER BY name;

-- name: event_type_delete
DELETE FROM event_types WHERE tenant_id = $1 AND name = $2 RETURNING name;

-- name: event_catalog
-- What ingest checks a tenant's events with: its switch and every schema, in one statement
-- (no row: no such tenant).
SELECT t.strict_event_types, e.name, e.schema, md5(e.schema::text) AS digest
FROM tenants AS t LEFT JOIN event_types AS e ON e.tenant_id = t.id
WHERE t.id = $1;

-- name: tenant_strict_get
SELECT strict_event_types FROM tenants WHERE id = $1;

-- name: tenant_strict_set
UPDATE tenants SET strict_event_types = $2 WHERE id = $1 RETURNING strict_event_types;

-- name: tenant_strict_set_by_name
UPDATE tenants SET strict_event_types = $2 WHERE name = $1 RETURNING id;

-- name: stored_idempotency_keys
-- Which of the keys $2 the tenant's stored events hold (AMQP ingest: a redelivered message
-- whose event is stored already is not checked against the catalog again).
SELECT idempotency_key FROM event_keys WHERE tenant_id = $1 AND idempotency_key = ANY($2::text[]);
