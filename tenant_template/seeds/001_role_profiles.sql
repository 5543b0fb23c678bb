-- The role profiles every tenant of the example template starts with.
--
-- A seed runs in the provisioning step's transaction with search_path set to the tenant's
-- schema alone, so names are unqualified; the tenant id is current_setting('provisioner.tenant_id').
-- Seeds run again when a job is re-run or a seed changes: keep them idempotent.
INSERT INTO role_profiles (key, name, permissions, is_default)
VALUES
    ('owner', 'Owner', '["*"]'::jsonb, false),
    ('admin', 'Administrator', '["members:manage", "datasets:write", "datasets:read", "audit:read"]'::jsonb, false),
    ('analyst', 'Analyst', '["datasets:write", "datasets:read"]'::jsonb, true),
    ('viewer', 'Viewer', '["datasets:read"]'::jsonb, false)
ON CONFLICT (key) DO NOTHING;
