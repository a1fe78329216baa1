-- 0003: tenants' changes are NOTIFYed, so that ingest stops accepting a rotated or disabled
-- key at once instead of when its tenant cache expires.
CREATE OR REPLACE FUNCTION notifier_tenant_changed() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('notifier_tenants', OLD.id::text);
    RETURN NULL;
END;
$$;
DROP TRIGGER IF EXISTS tenants_notify ON tenants;
CREATE TRIGGER tenants_notify AFTER UPDATE OR DELETE ON tenants
    FOR EACH ROW EXECUTE FUNCTION notifier_tenant_changed();
