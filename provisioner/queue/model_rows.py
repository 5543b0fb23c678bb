"""A tenant's control rows copied from a model tenant: how the test factory hands out a tenant
in milliseconds (its schema comes from a spare; its tenant row, its job, the job's runs and step
runs are the model's, written for the new id). The queue's tables are written here, not in
:mod:`provisioner.testing`.
"""

# The model's control rows (tenant, job, job runs, step runs) written for a new id
# (``jsonb_populate_record`` over the table's own row type: whatever columns the tables have).
COPY_MODEL_ROWS = """
INSERT INTO control.tenants
SELECT (jsonb_populate_record(NULL::control.tenants, %(tenant)s::jsonb || jsonb_build_object(
            'tenant_id', %(id)s::text, 'schema_name', %(schema)s::text, 'created_at', now(),
            'updated_at', now(), 'onboarding_started_at', now()))).*;
INSERT INTO control.platform_jobs
SELECT (jsonb_populate_record(NULL::control.platform_jobs, %(job)s::jsonb || jsonb_build_object(
            'id', %(job_id)s::uuid, 'tenant_id', %(id)s::text, 'idempotency_key', %(key)s::text,
            'created_at', now(), 'available_at', now(), 'updated_at', now(),
            'finished_at', now()))).*;
INSERT INTO control.job_runs
SELECT (jsonb_populate_record(NULL::control.job_runs, run || jsonb_build_object(
            'job_id', %(job_id)s::uuid, 'started_at', now()))).*
  FROM jsonb_array_elements(%(job_runs)s::jsonb) AS x(run);
INSERT INTO control.job_step_runs OVERRIDING SYSTEM VALUE
SELECT (jsonb_populate_record(NULL::control.job_step_runs, run || jsonb_build_object(
            'id', nextval(pg_get_serial_sequence('control.job_step_runs', 'id')),
            'job_id', %(job_id)s::uuid, 'tenant_id', %(id)s::text))).*
  FROM jsonb_array_elements(%(runs)s::jsonb) WITH ORDINALITY AS x(run, n) ORDER BY n;
"""


# The model's control rows as JSON: its tenant row, its one job, its runs (which command
# started each: ``status`` shows it), its step history.
MODEL_ROWS = """
SELECT (SELECT to_jsonb(t) FROM control.tenants t WHERE t.tenant_id = %(id)s) AS tenant,
       (SELECT to_jsonb(j) FROM control.platform_jobs j WHERE j.tenant_id = %(id)s) AS job,
       (SELECT coalesce(jsonb_agg(to_jsonb(r) ORDER BY r.id), '[]'::jsonb)
          FROM control.job_step_runs r WHERE r.tenant_id = %(id)s) AS runs,
       (SELECT coalesce(jsonb_agg(to_jsonb(r) ORDER BY r.run), '[]'::jsonb)
          FROM control.job_runs r JOIN control.platform_jobs j ON j.id = r.job_id
         WHERE j.tenant_id = %(id)s) AS job_runs
"""


# The tenants and jobs there are now: taken before a test, to sweep after it what the
# application under test signed up or queued (:class:`provisioner.testing.signups.Sweep`).
SWEEP_SNAPSHOT = """
SELECT (SELECT coalesce(array_agg(tenant_id), '{}') FROM control.tenants),
       (SELECT coalesce(array_agg(id), '{}') FROM control.platform_jobs)
"""

# The jobs added since that snapshot that belong to no kept tenant (a dropped tenant's jobs
# went with its row).
SWEEP_NEW_JOBS = """
DELETE FROM control.platform_jobs
 WHERE NOT (id = ANY(%(before)s)) AND (tenant_id IS NULL OR NOT (tenant_id = ANY(%(keep)s)))
"""
