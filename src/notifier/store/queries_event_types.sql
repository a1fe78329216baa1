-- Named queries of a tenant's event-type catalog (store/event_types.py). Each block starts
-- with `-- name: NAME`. The trigger event_types_notify (schema.sql) NOTIFYs every change.

-- name: event_type_put
-- Create or replace; a new name only while the tenant has fewer than $5 types (no row then).
INSERT INTO event_types AS t (tenant_id, name, description, schema)
SELECT $1, $2, $3, $4
WHERE EXISTS (SELECT 1 FROM event_types WHERE tenant_id = $1 AND name = $2)
   OR (SELECT count(*) FROM event_types WHERE tenant_id = $1) < $5
ON CONFLICT (tenant_id, name) DO UPDATE
    SET description = EXCLUDED.description, schema = EXCLUDED.schema, updated_at = now()
RETURNING name, description, schema, created_at, updated_at, (xmax = 0) AS created;

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
SELECT t.strict_event_types, e.name, e.schema
FROM tenants AS t LEFT JOIN event_types AS e ON e.tenant_id = t.id
WHERE t.id = $1;

-- name: tenant_strict_get
SELECT strict_event_types FROM tenants WHERE id = $1;

-- name: tenant_strict_set
UPDATE tenants SET strict_event_types = $2 WHERE id = $1 RETURNING strict_event_types;

-- name: tenant_strict_set_by_name
UPDATE tenants SET strict_event_types = $2 WHERE name = $1 RETURNING id;
