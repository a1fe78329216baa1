-- Named queries of AMQP ingest (notifier/ingest/amqp_ingest.py). Each block starts with
-- `-- name: NAME`.

-- name: amqp_tenants_by_names
SELECT name, id FROM tenants WHERE name = ANY($1::text[]);

-- name: amqp_channels_owned
-- The channels among $1, with their tenants: a batch may span tenants.
SELECT tenant_id, id FROM channels WHERE id = ANY($1::uuid[]);
