-- A round of job lifecycles in rollserve's PostgreSQL job store, for pgbench (rollserve bench
-- store's baseline): the statements the store sends for them, in order, one per store call, as
-- rollserve bench store's clients make them. Each client is a node ('pg-' and its number) whose
-- workers take :batch jobs a round: it submits them together, its idle init workers claim
-- them in one statement (perhaps another client's), each is passed on to run and to eval, one
-- heartbeat renews the node's leases, and each job finishes.
--
-- The lines "-- @each" and "-- @once" split the script: rollserve.bench.pgbench writes an
-- "@each" part once for each of the :batch jobs the claim may have taken, under
-- "\if :got >= N", with "[N]" in place of "[@]" (pgbench has no loops). Each job's id is
-- random. The store's parameters are written in: ":now" is the database's clock in the store
-- too (coalesce of a NULL clock), and the JSON the store sends as a parameter is built here by
-- jsonb_build_object. pgbench keeps one row of an answer, so the claim's rows are folded into
-- one array of their ids in the same statement. Run with --protocol=prepared, as psycopg
-- prepares the store's statements, and with --define batch=B --define request_bytes=N
-- --define output_bytes=M: the length of the text in each job's request and in the run output
-- handed to evaluation.
\set r random(1, 9000000000000000000)
\set got 0
-- 1. submit([NewJob(id, {"task": {"task_id": id, "text": "x" * N}}) for each of B ids],
--    max_queued=10**9)
INSERT INTO jobs (job_id, group_id, request, priority, stage, status, created, updated)
  SELECT n.job_id, n.group_id, n.request, n.priority, 'init', 'queued',
    coalesce(NULL::float8, extract(epoch FROM transaction_timestamp())::float8),
    coalesce(NULL::float8, extract(epoch FROM transaction_timestamp())::float8)
  FROM (SELECT (e.value ->> 'job_id') AS job_id, (e.value ->> 'group_id') AS group_id,
      e.value -> 'request' AS request, (e.value ->> 'priority')::integer AS priority, e.ord
    FROM jsonb_array_elements((SELECT jsonb_agg(jsonb_build_object(
      'job_id', 'pg-' || (:client_id)::text || '-' || (:r)::text || '-' || i::text,
      'group_id', NULL, 'priority', 0,
      'request', jsonb_build_object('task', jsonb_build_object(
        'task_id', 'pg-' || (:client_id)::text || '-' || (:r)::text || '-' || i::text,
        'text', repeat('x', :request_bytes)))))
      FROM generate_series(1, :batch) AS i)) WITH ORDINALITY AS e(value, ord)) AS n
  WHERE NOT EXISTS (SELECT 1 FROM jobs WHERE job_id = ANY(ARRAY(
      SELECT 'pg-' || (:client_id)::text || '-' || (:r)::text || '-' || i::text
      FROM generate_series(1, :batch) AS i)))
    AND (SELECT count(*) FROM jobs WHERE stage <> 'done') + :batch <= 1000000000
  ORDER BY n.ord ON CONFLICT (job_id) DO NOTHING
  RETURNING job_id, pg_notify('rollserve', 'init');
-- 2. claim_many(INIT, owner, 60, B): the oldest jobs waiting, perhaps another client's
WITH claimed AS (UPDATE jobs SET lease_owner = 'pg-' || :client_id,
    lease_expires = coalesce(NULL::float8, extract(epoch FROM transaction_timestamp())::float8) + 60,
    status = 'initializing',
    updated = coalesce(NULL::float8, extract(epoch FROM transaction_timestamp())::float8),
    attempts = attempts + CASE WHEN true OR lease_owner IS NOT NULL THEN 1 ELSE 0 END
  WHERE seq IN (SELECT seq FROM jobs WHERE stage = 'init' AND stage <> 'done'
      AND NOT cancel_requested AND (lease_owner IS NULL
        OR lease_expires < coalesce(NULL::float8, extract(epoch FROM transaction_timestamp())::float8))
      AND (node IS NULL OR node = 'pg-' || :client_id)
      AND (not_before IS NULL
        OR not_before <= coalesce(NULL::float8, extract(epoch FROM transaction_timestamp())::float8))
      ORDER BY priority DESC, seq LIMIT :batch FOR UPDATE SKIP LOCKED)
  RETURNING seq, job_id, group_id, request, priority, stage, status, attempts, created, updated,
    lease_owner, lease_expires, node, cancel_requested, stage_output, result, error, timing,
    finished, done_seq, not_before)
  SELECT count(*) AS got,
    coalesce(array_agg(job_id ORDER BY priority DESC, seq), '{}')::text AS ids
  FROM claimed \gset
-- @each
-- 3. pass_on(job, owner, RUN, 60, timing={}), for each job claimed
UPDATE jobs SET stage = 'run', status = 'running',
    lease_expires = coalesce(NULL::float8, extract(epoch FROM transaction_timestamp())::float8) + 60,
    node = 'pg-' || :client_id, stage_output = NULL, timing = timing || '{}'::jsonb,
    updated = coalesce(NULL::float8, extract(epoch FROM transaction_timestamp())::float8)
  WHERE job_id = (:ids::text[])[@] AND lease_owner = 'pg-' || :client_id AND stage <> 'done'
    AND NOT cancel_requested
  RETURNING lease_expires, updated, timing;
-- @each
-- 4. pass_on(job, owner, EVAL, 60, output={"text": "x" * M}, timing={}), for each
UPDATE jobs SET stage = 'eval', status = 'evaluating',
    lease_expires = coalesce(NULL::float8, extract(epoch FROM transaction_timestamp())::float8) + 60,
    node = NULL, stage_output = jsonb_build_object('text', repeat('x', :output_bytes)),
    timing = timing || '{}'::jsonb,
    updated = coalesce(NULL::float8, extract(epoch FROM transaction_timestamp())::float8)
  WHERE job_id = (:ids::text[])[@] AND lease_owner = 'pg-' || :client_id AND stage <> 'done'
    AND NOT cancel_requested
  RETURNING lease_expires, updated, timing;
-- @once
-- 5. heartbeat([the jobs claimed], owner, 60)
WITH returned AS (SELECT job_id FROM jobs WHERE job_id = ANY(:ids::text[])
    AND ((stage <> 'done' AND (cancel_requested
      OR (lease_owner IS NOT NULL AND lease_owner <> 'pg-' || :client_id)))
      OR (stage = 'done' AND status = 'cancelled'))),
  after_0 AS (UPDATE jobs
    SET lease_expires = coalesce(NULL::float8, extract(epoch FROM transaction_timestamp())::float8) + 60
    WHERE job_id = ANY(:ids::text[]) AND lease_owner = 'pg-' || :client_id
      AND NOT cancel_requested)
  SELECT * FROM returned;
-- @each
-- 6. finish(job, owner, COMPLETED, result={}), for each
WITH returned AS (UPDATE jobs SET stage = 'done', status = 'completed', lease_owner = NULL,
      lease_expires = NULL, node = NULL, stage_output = NULL, result = '{}'::jsonb,
      error = NULL, timing = timing || '{}'::jsonb,
      updated = coalesce(NULL::float8, extract(epoch FROM transaction_timestamp())::float8),
      finished = coalesce(NULL::float8, extract(epoch FROM transaction_timestamp())::float8),
      done_seq = (SELECT nextval('jobs_done_seq')
        FROM (SELECT pg_advisory_xact_lock(1919904876)) AS l)
    WHERE job_id = (:ids::text[])[@] AND lease_owner = 'pg-' || :client_id AND stage <> 'done'
    RETURNING job_id, pg_notify('rollserve', 'done')),
  after_0 AS (DELETE FROM job_events WHERE job_id IN (SELECT job_id FROM returned))
  SELECT * FROM returned;
