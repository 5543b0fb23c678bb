-- Reference data every workspace starts with. Runs in the tenant's schema (search_path) with
-- the tenant id in current_setting('provisioner.tenant_id'); idempotent.
INSERT INTO sla_policies (priority, first_response_minutes, resolve_minutes)
VALUES ('low', 1440, 10080), ('normal', 480, 2880), ('high', 60, 480), ('urgent', 15, 120)
ON CONFLICT (priority) DO NOTHING;

INSERT INTO labels (name, color)
VALUES ('Billing', '#1f77b4'), ('Bug', '#d62728'), ('Question', '#2ca02c')
ON CONFLICT (name) DO NOTHING;

INSERT INTO settings (key, value)
VALUES ('workspace', jsonb_build_object('tenant', current_setting('provisioner.tenant_id'),
                                        'locale', 'en'))
ON CONFLICT (key) DO NOTHING;
