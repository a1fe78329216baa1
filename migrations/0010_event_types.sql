-- 0010: the event-type catalog. A tenant may register event types, each with a JSON Schema
-- (draft 2020-12) that `POST /v1/events` (and AMQP ingest) checks the payloads of that type
-- against; with `strict_event_types` on, a type it has not registered is refused.
ALTER TABLE tenants ADD COLUMN IF NOT EXISTS strict_event_types boolean NOT NULL DEFAULT false;
CREATE TABLE IF NOT EXISTS event_types (
    tenant_id    uuid NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    name         text NOT NULL,
    description  text NOT NULL DEFAULT '',
    schema       jsonb NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT now(),
    updated_at   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant_id, name)
);
-- A change to a tenant's catalog is NOTIFYed on `notifier_catalogs` with the tenant's id: each
-- ingest process forgets the tenant's compiled catalog at once. A channel of its own, not
-- `notifier_tenants`: that one also empties the caches of API keys (the unknown ones of every
-- tenant), which a tenant must not be able to do at will by writing its catalog.
CREATE OR REPLACE FUNCTION notifier_event_types_changed() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE' THEN
        PERFORM pg_notify('notifier_catalogs', OLD.tenant_id::text);
    ELSE
        PERFORM pg_notify('notifier_catalogs', NEW.tenant_id::text);
    END IF;
    RETURN NULL;
END;
$$;
DROP TRIGGER IF EXISTS event_types_notify ON event_types;
CREATE TRIGGER event_types_notify AFTER INSERT OR UPDATE OR DELETE ON event_types
    FOR EACH ROW EXECUTE FUNCTION notifier_event_types_changed();
