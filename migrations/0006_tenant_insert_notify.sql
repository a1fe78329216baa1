-- 0006: a new tenant is NOTIFYed too, so that ingest forgets the API keys it remembered as
-- matching no tenant (notifier.ingest.tenants) and takes the new tenant's key at once.
CREATE OR REPLACE FUNCTION notifier_tenant_changed() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        PERFORM pg_notify('notifier_tenants', NEW.id::text);
    ELSE
        PERFORM pg_notify('notifier_tenants', OLD.id::text);
    END IF;
    RETURN NULL;
END;
$$;
DROP TRIGGER IF EXISTS tenants_notify ON tenants;
CREATE TRIGGER tenants_notify AFTER INSERT OR UPDATE OR DELETE ON tenants
    FOR EACH ROW EXECUTE FUNCTION notifier_tenant_changed();
