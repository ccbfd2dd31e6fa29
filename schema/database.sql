-- The current database schema of record, generated from a database migrated to head by
-- `agent-engine export-schema --database` (or `make schema`). Do not edit: write a
-- migration, then regenerate. tests/integration/db/test_schema_file.py checks it.

-- Name: agent_models_fallback_acyclic(); Type: FUNCTION; Schema: public; Owner: -

CREATE FUNCTION public.agent_models_fallback_acyclic() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
DECLARE
    cursor_id bigint := NEW.fallback_model_id;
    hops integer := 0;
BEGIN
    PERFORM pg_advisory_xact_lock(hashtext('agent_models.fallback_model_id'));
    WHILE cursor_id IS NOT NULL LOOP
        IF cursor_id = NEW.id THEN
            RAISE EXCEPTION 'the fallback chain of model % comes back to it', NEW.id
                USING ERRCODE = 'check_violation',
                      CONSTRAINT = 'ck_agent_models_fallback_acyclic';
        END IF;
        hops := hops + 1;
        EXIT WHEN hops > 10000;
        SELECT fallback_model_id INTO cursor_id FROM agent_models WHERE id = cursor_id;
    END LOOP;
    RETURN NEW;
END $$;

-- Name: agent_run_steps_notify(); Type: FUNCTION; Schema: public; Owner: -

CREATE FUNCTION public.agent_run_steps_notify() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
BEGIN
    PERFORM pg_notify('agent_run_steps', json_build_object(
        'run_id', NEW.run_id, 'index', NEW.index)::text);
    RETURN NULL;
END $$;

-- Name: agent_runs_cost_at_finish(); Type: FUNCTION; Schema: public; Owner: -

CREATE FUNCTION public.agent_runs_cost_at_finish() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
DECLARE
    fb_prompt bigint;
    fb_completion bigint;
    fb_cost numeric;
    fb_unpriced boolean;
    own_prompt bigint;
    own_completion bigint;
    own_unsplit bigint;
BEGIN
    SELECT COALESCE(sum(COALESCE(s.prompt_tokens, 0)), 0),
           COALESCE(sum(COALESCE(s.completion_tokens, 0)), 0),
           sum(COALESCE(s.prompt_tokens, 0) * m.input_price_per_million
               + COALESCE(s.completion_tokens, 0) * m.output_price_per_million),
           COALESCE(bool_or(m.input_price_per_million IS NULL
                            OR m.output_price_per_million IS NULL), false)
      INTO fb_prompt, fb_completion, fb_cost, fb_unpriced
      FROM agent_run_steps s LEFT JOIN agent_models m ON m.id = s.model_id
     WHERE s.run_id = NEW.id AND s.fallback AND NOT s.reused;
    IF fb_unpriced THEN
        NEW.cost := NULL;
        RETURN NEW;
    END IF;
    own_prompt := GREATEST(NEW.prompt_tokens - fb_prompt, 0);
    own_completion := GREATEST(NEW.completion_tokens - fb_completion, 0);
    own_unsplit := GREATEST(NEW.tokens_used - NEW.prompt_tokens - NEW.completion_tokens, 0);
    SELECT (own_prompt * m.input_price_per_million
            + own_completion * m.output_price_per_million
            + own_unsplit * m.input_price_per_million
            + COALESCE(fb_cost, 0)) * 0.000001
      INTO NEW.cost
      FROM agent_models m
     WHERE m.id = COALESCE(NEW.model_id, (SELECT a.model_id FROM agents a WHERE a.id = NEW.agent_id))
       AND m.input_price_per_million IS NOT NULL
       AND m.output_price_per_million IS NOT NULL;
    IF NOT FOUND THEN
        -- The run's own model is not priced: a run answered by fallbacks alone is still priced.
        IF fb_cost IS NOT NULL AND own_prompt + own_completion + own_unsplit = 0 THEN
            NEW.cost := fb_cost * 0.000001;
        ELSE
            NEW.cost := NULL;
        END IF;
    END IF;
    RETURN NEW;
END $$;

-- Name: agent_runs_notify(); Type: FUNCTION; Schema: public; Owner: -

CREATE FUNCTION public.agent_runs_notify() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
DECLARE
    previous text := NULL;
    owner bigint;
    hidden boolean;
BEGIN
    SELECT user_id, deleted_at IS NOT NULL INTO owner, hidden FROM agents WHERE id = NEW.agent_id;
    IF hidden THEN
        RETURN NULL;
    END IF;
    IF TG_OP = 'UPDATE' THEN
        previous := OLD.state;
    END IF;
    PERFORM pg_notify('agent_run_events', json_build_object(
        'run_id', NEW.id,
        'agent_id', NEW.agent_id,
        'owner_id', owner,
        'state', NEW.state,
        'previous_state', previous
    )::text);
    RETURN NULL;
END $$;

-- Name: agent_runs_on_finish(); Type: FUNCTION; Schema: public; Owner: -

CREATE FUNCTION public.agent_runs_on_finish() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
DECLARE
    finished timestamptz := COALESCE(NEW.finished_at, now());
    stamp text := to_char(finished AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"+00:00"');
BEGIN
    IF TG_OP = 'UPDATE' THEN
        UPDATE agent_run_steps SET finished_at = finished,
            error = COALESCE(error, 'the run ended (' || NEW.state
                                    || COALESCE('/' || NEW.reason, '') || ') during this step')
        WHERE run_id = NEW.id AND finished_at IS NULL;
    END IF;
    INSERT INTO run_deliveries (run_id, target_id, webhook_id, event_type, payload,
                                next_attempt_at)
    SELECT NEW.id, t.id, 'msg_' || replace(gen_random_uuid()::text, '-', ''),
           'run.' || NEW.state,
           jsonb_build_object(
               'type', 'run.' || NEW.state,
               'timestamp', stamp,
               'data', jsonb_build_object(
                   'runId', NEW.id::text,
                   'agentId', NEW.agent_id::text,
                   'agentName', a.name,
                   'ownerId', a.user_id::text,
                   'trigger', NEW.trigger,
                   'state', NEW.state,
                   'reason', NEW.reason,
                   'output', NEW.output,
                   'tokensUsed', NEW.tokens_used,
                   'cost', to_jsonb(NEW) ->> 'cost',
                   'finishedAt', stamp)),
           now()
    FROM agent_delivery_targets adt
    JOIN delivery_targets t ON t.id = adt.target_id AND t.enabled
    JOIN agents a ON a.id = adt.agent_id
    WHERE adt.agent_id = NEW.agent_id;
    RETURN NULL;
END $$;

-- Name: agent_runs_token_split(); Type: FUNCTION; Schema: public; Owner: -

CREATE FUNCTION public.agent_runs_token_split() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
DECLARE
    steps_prompt bigint;
    steps_completion bigint;
BEGIN
    SELECT COALESCE(sum(prompt_tokens), 0), COALESCE(sum(completion_tokens), 0)
    INTO steps_prompt, steps_completion
    FROM agent_run_steps WHERE run_id = NEW.id AND NOT reused;
    NEW.tokens_used := GREATEST(NEW.tokens_used, steps_prompt + steps_completion);
    NEW.prompt_tokens := LEAST(steps_prompt, NEW.tokens_used);
    NEW.completion_tokens := NEW.tokens_used - NEW.prompt_tokens;
    RETURN NEW;
END $$;

-- Name: agent_runs_week_tokens(); Type: FUNCTION; Schema: public; Owner: -

CREATE FUNCTION public.agent_runs_week_tokens() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
DECLARE
    owner bigint;
    week record;
    total bigint;
BEGIN
    SELECT a.user_id INTO owner FROM agents a WHERE a.id = NEW.agent_id;
    IF owner IS NULL THEN
        RETURN NEW;
    END IF;
    IF TG_OP = 'UPDATE' AND OLD.finished_at IS NOT NULL AND OLD.tokens_used <> 0 THEN
        UPDATE budget_weeks b SET tokens_used = b.tokens_used - OLD.tokens_used
        WHERE b.user_id = owner
          AND b.window_start <= OLD.finished_at AND b.window_end > OLD.finished_at;
    END IF;
    IF NEW.finished_at IS NULL OR NEW.tokens_used = 0 THEN
        RETURN NEW;
    END IF;
    SELECT * INTO week FROM budget_week_of(NEW.finished_at);
    WITH added AS (
        UPDATE budget_weeks b SET tokens_used = b.tokens_used + NEW.tokens_used
        WHERE b.user_id = owner
          AND b.window_start <= NEW.finished_at AND b.window_end > NEW.finished_at
        RETURNING b.tokens_used,
                  b.window_start = week.window_start AND b.window_end = week.window_end AS this
    )
    SELECT max(added.tokens_used) FILTER (WHERE added.this) INTO total FROM added;
    IF total IS NULL THEN
        INSERT INTO budget_weeks AS b (user_id, window_start, window_end, tokens_used)
        SELECT owner, week.window_start, week.window_end,
               NEW.tokens_used + COALESCE(SUM(w.used), 0)
        FROM agents a CROSS JOIN LATERAL (
            SELECT SUM(r.tokens_used) AS used FROM agent_runs r
            WHERE r.agent_id = a.id AND r.id <> NEW.id
              AND r.finished_at >= week.window_start AND r.finished_at < week.window_end) w
        WHERE a.user_id = owner
        ON CONFLICT (user_id, window_start, window_end)
        DO UPDATE SET tokens_used = b.tokens_used + NEW.tokens_used
        RETURNING b.tokens_used INTO total;
    END IF;
    -- The week's total with this run, read under the row's lock (so in commit order), for the
    -- statement that wrote the run: `db.runs.FINISH` returns both (`runs/alerts.py`).
    PERFORM set_config('agent_engine.week_start', week.window_start::text, true),
            set_config('agent_engine.week_tokens', total::text, true);
    RETURN NEW;
END $$;

-- Name: agent_runs_week_tokens_deleted(); Type: FUNCTION; Schema: public; Owner: -

CREATE FUNCTION public.agent_runs_week_tokens_deleted() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
BEGIN
    UPDATE budget_weeks b SET tokens_used = b.tokens_used - d.tokens
    FROM (SELECT w.user_id, w.window_start, w.window_end, SUM(g.tokens_used) AS tokens
          FROM gone g
          JOIN agents a ON a.id = g.agent_id
          JOIN budget_weeks w ON w.user_id = a.user_id
           AND w.window_start <= g.finished_at AND w.window_end > g.finished_at
          WHERE g.tokens_used <> 0
          GROUP BY w.user_id, w.window_start, w.window_end) d
    WHERE b.user_id = d.user_id AND b.window_start = d.window_start
      AND b.window_end = d.window_end;
    RETURN NULL;
END $$;

-- Name: agents_clear_next_run_at(); Type: FUNCTION; Schema: public; Owner: -

CREATE FUNCTION public.agents_clear_next_run_at() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
BEGIN
    IF NOT (NEW.enabled AND NOT NEW.admin_paused AND NEW.model_id IS NOT NULL
            AND NEW.schedule IS NOT NULL) THEN
        NEW.next_run_at := NULL;
    END IF;
    RETURN NEW;
END $$;

-- Name: agents_forget_budget_weeks(); Type: FUNCTION; Schema: public; Owner: -

CREATE FUNCTION public.agents_forget_budget_weeks() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
BEGIN
    IF TG_OP = 'DELETE' THEN
        DELETE FROM budget_weeks WHERE user_id = OLD.user_id;
        RETURN OLD;
    END IF;
    IF OLD.user_id = NEW.user_id THEN
        RETURN NEW;
    END IF;
    DELETE FROM budget_weeks WHERE user_id IN (OLD.user_id, NEW.user_id);
    RETURN NEW;
END $$;

-- Name: agents_touch_updated_at(); Type: FUNCTION; Schema: public; Owner: -

CREATE FUNCTION public.agents_touch_updated_at() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
BEGIN
    IF ROW(NEW.user_id, NEW.name, NEW.description, NEW.prompt, NEW.schedule, NEW.model_id,
           NEW.enabled, NEW.admin_paused, NEW.meta)
       IS DISTINCT FROM
       ROW(OLD.user_id, OLD.name, OLD.description, OLD.prompt, OLD.schedule, OLD.model_id,
           OLD.enabled, OLD.admin_paused, OLD.meta) THEN
        NEW.updated_at := now();
    END IF;
    RETURN NEW;
END $$;

-- Name: audit_log_append_only(); Type: FUNCTION; Schema: public; Owner: -

CREATE FUNCTION public.audit_log_append_only() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
BEGIN
    RAISE EXCEPTION 'audit_log is append-only: % refused', TG_OP
        USING ERRCODE = 'insufficient_privilege';
END $$;

-- Name: budget_alerts_notify(); Type: FUNCTION; Schema: public; Owner: -

CREATE FUNCTION public.budget_alerts_notify() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
BEGIN
    PERFORM pg_notify('budget_alert_events', json_build_object(
        'id', NEW.id,
        'owner_id', NEW.owner_id,
        'window_start', NEW.window_start,
        'percent', NEW.percent,
        'used_tokens', NEW.used_tokens,
        'cap_tokens', NEW.cap_tokens,
        'crossed_at', NEW.crossed_at
    )::text);
    RETURN NULL;
END $$;

-- Name: budget_local_midnight(date, text); Type: FUNCTION; Schema: public; Owner: -

CREATE FUNCTION public.budget_local_midnight(day date, zone text) RETURNS timestamp with time zone
    LANGUAGE plpgsql STABLE
    AS $$
DECLARE
    local timestamp := day::timestamp;
    later timestamptz := local AT TIME ZONE zone;
    before timestamptz := later - interval '6 hours';
    earlier timestamptz := (local - ((before AT TIME ZONE zone) - (before AT TIME ZONE 'UTC')))
                           AT TIME ZONE 'UTC';
BEGIN
    -- A midnight the clocks went back across is its first occurrence, as Python's zoneinfo
    -- reads it (fold=0); PostgreSQL reads the second.
    IF earlier < later AND (earlier AT TIME ZONE zone) = local THEN
        RETURN earlier;
    END IF;
    RETURN later;
END $$;

-- Name: budget_week_of(timestamp with time zone); Type: FUNCTION; Schema: public; Owner: -

CREATE FUNCTION public.budget_week_of(at timestamp with time zone, OUT window_start timestamp with time zone, OUT window_end timestamp with time zone) RETURNS record
    LANGUAGE plpgsql STABLE
    AS $$
DECLARE
    zone text := COALESCE(NULLIF((SELECT p.value #>> '{}' FROM platform_settings p
                                  WHERE p.key = 'timezone'), ''), 'UTC');
    sunday date;
BEGIN
    BEGIN
        sunday := (at AT TIME ZONE zone)::date;
    EXCEPTION WHEN invalid_parameter_value THEN
        zone := 'UTC';
        sunday := (at AT TIME ZONE zone)::date;
    END;
    sunday := sunday - extract(dow FROM sunday)::int;
    window_start := budget_local_midnight(sunday, zone);
    window_end := budget_local_midnight(sunday + 7, zone);
END $$;

-- Name: budget_weeks_forget_all(); Type: FUNCTION; Schema: public; Owner: -

CREATE FUNCTION public.budget_weeks_forget_all() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
BEGIN
    DELETE FROM budget_weeks;
    RETURN NULL;
END $$;

-- Name: agent_delivery_targets; Type: TABLE; Schema: public; Owner: -

CREATE TABLE public.agent_delivery_targets (
    agent_id bigint NOT NULL,
    target_id bigint NOT NULL,
    created_at timestamp with time zone DEFAULT now() NOT NULL
);

-- Name: agent_models; Type: TABLE; Schema: public; Owner: -

CREATE TABLE public.agent_models (
    id bigint NOT NULL,
    name text NOT NULL,
    provider text NOT NULL,
    model text NOT NULL,
    base_url text,
    api_key_env text,
    is_default boolean DEFAULT false NOT NULL,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    max_concurrent_runs integer,
    input_price_per_million numeric,
    output_price_per_million numeric,
    fallback_model_id bigint,
    CONSTRAINT ck_agent_models_input_price_per_million_range CHECK (((input_price_per_million IS NULL) OR ((input_price_per_million >= (0)::numeric) AND (input_price_per_million <= (10000)::numeric)))),
    CONSTRAINT ck_agent_models_max_concurrent_runs_positive CHECK (((max_concurrent_runs IS NULL) OR (max_concurrent_runs >= 1))),
    CONSTRAINT ck_agent_models_output_price_per_million_range CHECK (((output_price_per_million IS NULL) OR ((output_price_per_million >= (0)::numeric) AND (output_price_per_million <= (10000)::numeric)))),
    CONSTRAINT ck_agent_models_provider CHECK ((provider = ANY (ARRAY['openai'::text, 'builtin'::text])))
);

-- Name: agent_models_id_seq; Type: SEQUENCE; Schema: public; Owner: -

ALTER TABLE public.agent_models ALTER COLUMN id ADD GENERATED BY DEFAULT AS IDENTITY (
    SEQUENCE NAME public.agent_models_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);

-- Name: agent_run_steps; Type: TABLE; Schema: public; Owner: -

CREATE TABLE public.agent_run_steps (
    run_id bigint NOT NULL,
    index integer NOT NULL,
    kind text NOT NULL,
    name text NOT NULL,
    input jsonb,
    output text,
    error text,
    prompt_tokens bigint,
    completion_tokens bigint,
    started_at timestamp with time zone NOT NULL,
    finished_at timestamp with time zone,
    authority text,
    account text,
    fallback boolean DEFAULT false NOT NULL,
    model_id bigint,
    reused boolean DEFAULT false NOT NULL,
    CONSTRAINT ck_agent_run_steps_authority CHECK (((authority IS NULL) OR (authority = ANY (ARRAY['none'::text, 'shared'::text, 'owner_oauth'::text])))),
    CONSTRAINT ck_agent_run_steps_kind CHECK ((kind = ANY (ARRAY['model_call'::text, 'tool_call'::text])))
);

-- Name: agent_runs; Type: TABLE; Schema: public; Owner: -

CREATE TABLE public.agent_runs (
    id bigint NOT NULL,
    agent_id bigint NOT NULL,
    trigger text NOT NULL,
    state text NOT NULL,
    reason text,
    output text,
    tokens_used bigint DEFAULT '0'::bigint NOT NULL,
    error text,
    started_at timestamp with time zone,
    finished_at timestamp with time zone,
    heartbeat_at timestamp with time zone,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    model_id bigint,
    last_sent_at timestamp with time zone,
    prompt_tokens bigint DEFAULT '0'::bigint NOT NULL,
    completion_tokens bigint DEFAULT '0'::bigint NOT NULL,
    cost numeric,
    parked_at timestamp with time zone,
    retry_of bigint,
    trace_parent text,
    CONSTRAINT ck_agent_runs_reason CHECK (((reason IS NULL) OR (reason = ANY (ARRAY['budget_exceeded'::text, 'already_running'::text, 'iteration_cap'::text, 'error'::text, 'stale'::text, 'cancelled'::text, 'token_cap'::text, 'agent_budget_exceeded'::text])))),
    CONSTRAINT ck_agent_runs_reason_fits_state CHECK (
CASE state
    WHEN 'skipped'::text THEN COALESCE((reason = ANY (ARRAY['budget_exceeded'::text, 'already_running'::text, 'agent_budget_exceeded'::text])), false)
    WHEN 'failed'::text THEN COALESCE((reason = ANY (ARRAY['iteration_cap'::text, 'error'::text, 'stale'::text, 'cancelled'::text, 'token_cap'::text])), false)
    ELSE (reason IS NULL)
END),
    CONSTRAINT ck_agent_runs_state CHECK ((state = ANY (ARRAY['queued'::text, 'running'::text, 'succeeded'::text, 'failed'::text, 'skipped'::text]))),
    CONSTRAINT ck_agent_runs_tokens_used_non_negative CHECK ((tokens_used >= 0)),
    CONSTRAINT ck_agent_runs_trigger CHECK ((trigger = ANY (ARRAY['manual'::text, 'scheduled'::text, 'retry'::text])))
);

-- Name: agent_runs_id_seq; Type: SEQUENCE; Schema: public; Owner: -

ALTER TABLE public.agent_runs ALTER COLUMN id ADD GENERATED BY DEFAULT AS IDENTITY (
    SEQUENCE NAME public.agent_runs_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);

-- Name: agent_tools; Type: TABLE; Schema: public; Owner: -

CREATE TABLE public.agent_tools (
    id bigint NOT NULL,
    agent_id bigint NOT NULL,
    tool_id bigint NOT NULL,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    auto_approved boolean DEFAULT false NOT NULL
);

-- Name: agent_tools_id_seq; Type: SEQUENCE; Schema: public; Owner: -

ALTER TABLE public.agent_tools ALTER COLUMN id ADD GENERATED BY DEFAULT AS IDENTITY (
    SEQUENCE NAME public.agent_tools_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);

-- Name: agents; Type: TABLE; Schema: public; Owner: -

CREATE TABLE public.agents (
    id bigint NOT NULL,
    user_id bigint NOT NULL,
    name text NOT NULL,
    description text,
    prompt text NOT NULL,
    schedule jsonb,
    model_id bigint,
    enabled boolean DEFAULT true NOT NULL,
    admin_paused boolean DEFAULT false NOT NULL,
    next_run_at timestamp with time zone,
    meta jsonb,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    updated_at timestamp with time zone DEFAULT now() NOT NULL,
    deleted_at timestamp with time zone,
    admin_pause_note text,
    weekly_token_cap bigint,
    max_tokens_per_run bigint,
    CONSTRAINT ck_agents_admin_pause_note CHECK (((admin_pause_note IS NULL) OR (admin_paused AND (char_length(admin_pause_note) <= 500)))),
    CONSTRAINT ck_agents_hidden_is_switched_off CHECK (((deleted_at IS NULL) OR (NOT enabled))),
    CONSTRAINT ck_agents_max_tokens_per_run_positive CHECK (((max_tokens_per_run IS NULL) OR (max_tokens_per_run > 0))),
    CONSTRAINT ck_agents_weekly_token_cap_positive CHECK (((weekly_token_cap IS NULL) OR (weekly_token_cap > 0)))
);

-- Name: agents_id_seq; Type: SEQUENCE; Schema: public; Owner: -

ALTER TABLE public.agents ALTER COLUMN id ADD GENERATED BY DEFAULT AS IDENTITY (
    SEQUENCE NAME public.agents_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);

-- Name: audit_log; Type: TABLE; Schema: public; Owner: -

CREATE TABLE public.audit_log (
    id bigint NOT NULL,
    at timestamp with time zone DEFAULT now() NOT NULL,
    actor_id bigint,
    action text NOT NULL,
    agent_id bigint,
    user_id bigint,
    details jsonb
);

-- Name: audit_log_id_seq; Type: SEQUENCE; Schema: public; Owner: -

ALTER TABLE public.audit_log ALTER COLUMN id ADD GENERATED BY DEFAULT AS IDENTITY (
    SEQUENCE NAME public.audit_log_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);

-- Name: budget_alerts; Type: TABLE; Schema: public; Owner: -

CREATE TABLE public.budget_alerts (
    id bigint NOT NULL,
    owner_id bigint NOT NULL,
    window_start timestamp with time zone NOT NULL,
    percent integer NOT NULL,
    used_tokens bigint NOT NULL,
    cap_tokens bigint NOT NULL,
    crossed_at timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT ck_budget_alerts_percent_range CHECK (((percent >= 1) AND (percent <= 100)))
);

-- Name: budget_alerts_id_seq; Type: SEQUENCE; Schema: public; Owner: -

ALTER TABLE public.budget_alerts ALTER COLUMN id ADD GENERATED BY DEFAULT AS IDENTITY (
    SEQUENCE NAME public.budget_alerts_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);

-- Name: budget_weeks; Type: TABLE; Schema: public; Owner: -

CREATE TABLE public.budget_weeks (
    user_id bigint NOT NULL,
    window_start timestamp with time zone NOT NULL,
    window_end timestamp with time zone NOT NULL,
    tokens_used bigint NOT NULL
);

-- Name: connection_waits; Type: TABLE; Schema: public; Owner: -

CREATE TABLE public.connection_waits (
    id bigint NOT NULL,
    run_id bigint NOT NULL,
    agent_id bigint NOT NULL,
    owner_id bigint NOT NULL,
    source_id bigint,
    source_name text NOT NULL,
    step_index integer NOT NULL,
    tool_id bigint,
    tool_name text NOT NULL,
    status text DEFAULT 'pending'::text NOT NULL,
    requested_at timestamp with time zone DEFAULT now() NOT NULL,
    expires_at timestamp with time zone NOT NULL,
    resolved_at timestamp with time zone,
    taken_at timestamp with time zone,
    checkpoint jsonb,
    call_started_at timestamp with time zone,
    CONSTRAINT ck_connection_waits_status CHECK ((status = ANY (ARRAY['pending'::text, 'connected'::text, 'expired'::text, 'cancelled'::text])))
);

-- Name: connection_waits_id_seq; Type: SEQUENCE; Schema: public; Owner: -

ALTER TABLE public.connection_waits ALTER COLUMN id ADD GENERATED BY DEFAULT AS IDENTITY (
    SEQUENCE NAME public.connection_waits_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);

-- Name: delivery_targets; Type: TABLE; Schema: public; Owner: -

CREATE TABLE public.delivery_targets (
    id bigint NOT NULL,
    name text NOT NULL,
    url text NOT NULL,
    secret_env text NOT NULL,
    enabled boolean DEFAULT true NOT NULL,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    updated_at timestamp with time zone DEFAULT now() NOT NULL
);

-- Name: delivery_targets_id_seq; Type: SEQUENCE; Schema: public; Owner: -

ALTER TABLE public.delivery_targets ALTER COLUMN id ADD GENERATED BY DEFAULT AS IDENTITY (
    SEQUENCE NAME public.delivery_targets_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);

-- Name: engine_activity; Type: TABLE; Schema: public; Owner: -

CREATE TABLE public.engine_activity (
    name text NOT NULL,
    count bigint DEFAULT '0'::bigint NOT NULL,
    last_at timestamp with time zone
);

-- Name: kb_document_grants; Type: TABLE; Schema: public; Owner: -

CREATE TABLE public.kb_document_grants (
    document_id bigint NOT NULL,
    user_id bigint NOT NULL
);

-- Name: kb_document_links; Type: TABLE; Schema: public; Owner: -

CREATE TABLE public.kb_document_links (
    from_document_id bigint NOT NULL,
    to_document_id bigint NOT NULL
);

-- Name: kb_documents; Type: TABLE; Schema: public; Owner: -

CREATE TABLE public.kb_documents (
    id bigint NOT NULL,
    title text NOT NULL,
    body text NOT NULL,
    source text,
    is_public boolean DEFAULT false NOT NULL,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    updated_at timestamp with time zone DEFAULT now() NOT NULL,
    search_vector tsvector GENERATED ALWAYS AS ((setweight(to_tsvector('english'::regconfig, COALESCE(title, ''::text)), 'A'::"char") || setweight(to_tsvector('english'::regconfig, COALESCE(body, ''::text)), 'B'::"char"))) STORED NOT NULL
);

-- Name: kb_documents_id_seq; Type: SEQUENCE; Schema: public; Owner: -

ALTER TABLE public.kb_documents ALTER COLUMN id ADD GENERATED BY DEFAULT AS IDENTITY (
    SEQUENCE NAME public.kb_documents_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);

-- Name: oauth_states; Type: TABLE; Schema: public; Owner: -

CREATE TABLE public.oauth_states (
    state_hash bytea NOT NULL,
    owner_id bigint NOT NULL,
    source_id bigint NOT NULL,
    verifier_enc bytea NOT NULL,
    redirect_uri text NOT NULL,
    issuer text NOT NULL,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    expires_at timestamp with time zone NOT NULL,
    used_at timestamp with time zone
);

-- Name: platform_settings; Type: TABLE; Schema: public; Owner: -

CREATE TABLE public.platform_settings (
    key text NOT NULL,
    value jsonb,
    updated_at timestamp with time zone DEFAULT now() NOT NULL
);

-- Name: run_deliveries; Type: TABLE; Schema: public; Owner: -

CREATE TABLE public.run_deliveries (
    id bigint NOT NULL,
    run_id bigint NOT NULL,
    target_id bigint NOT NULL,
    webhook_id text NOT NULL,
    event_type text NOT NULL,
    payload jsonb NOT NULL,
    status text DEFAULT 'pending'::text NOT NULL,
    attempts integer DEFAULT 0 NOT NULL,
    next_attempt_at timestamp with time zone,
    lease_token text,
    leased_until timestamp with time zone,
    last_status_code integer,
    last_error text,
    delivered_at timestamp with time zone,
    finished_at timestamp with time zone,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT ck_run_deliveries_status CHECK ((status = ANY (ARRAY['pending'::text, 'delivered'::text, 'failed'::text])))
);

-- Name: run_deliveries_id_seq; Type: SEQUENCE; Schema: public; Owner: -

ALTER TABLE public.run_deliveries ALTER COLUMN id ADD GENERATED BY DEFAULT AS IDENTITY (
    SEQUENCE NAME public.run_deliveries_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);

-- Name: tool_approvals; Type: TABLE; Schema: public; Owner: -

CREATE TABLE public.tool_approvals (
    id bigint NOT NULL,
    run_id bigint NOT NULL,
    agent_id bigint NOT NULL,
    owner_id bigint NOT NULL,
    step_index integer NOT NULL,
    tool_id bigint,
    tool_name text NOT NULL,
    input jsonb,
    status text DEFAULT 'pending'::text NOT NULL,
    requested_at timestamp with time zone DEFAULT now() NOT NULL,
    expires_at timestamp with time zone NOT NULL,
    decided_at timestamp with time zone,
    decided_by bigint,
    note text,
    checkpoint jsonb,
    call_started_at timestamp with time zone,
    CONSTRAINT ck_tool_approvals_status CHECK ((status = ANY (ARRAY['pending'::text, 'approved'::text, 'declined'::text, 'expired'::text, 'cancelled'::text])))
);

-- Name: tool_approvals_id_seq; Type: SEQUENCE; Schema: public; Owner: -

ALTER TABLE public.tool_approvals ALTER COLUMN id ADD GENERATED BY DEFAULT AS IDENTITY (
    SEQUENCE NAME public.tool_approvals_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);

-- Name: tool_connections; Type: TABLE; Schema: public; Owner: -

CREATE TABLE public.tool_connections (
    id bigint NOT NULL,
    owner_id bigint NOT NULL,
    source_id bigint NOT NULL,
    status text DEFAULT 'connected'::text NOT NULL,
    account text,
    scopes text[] DEFAULT '{}'::text[] NOT NULL,
    access_token_enc bytea NOT NULL,
    refresh_token_enc bytea,
    expires_at timestamp with time zone,
    connected_at timestamp with time zone DEFAULT now() NOT NULL,
    last_used_at timestamp with time zone,
    refreshed_at timestamp with time zone,
    updated_at timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT ck_tool_connections_status CHECK ((status = ANY (ARRAY['connected'::text, 'expired'::text])))
);

-- Name: tool_connections_id_seq; Type: SEQUENCE; Schema: public; Owner: -

ALTER TABLE public.tool_connections ALTER COLUMN id ADD GENERATED BY DEFAULT AS IDENTITY (
    SEQUENCE NAME public.tool_connections_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);

-- Name: tool_source_oauth_clients; Type: TABLE; Schema: public; Owner: -

CREATE TABLE public.tool_source_oauth_clients (
    source_id bigint NOT NULL,
    redirect_uri text NOT NULL,
    issuer text NOT NULL,
    client_id text NOT NULL,
    client_secret_enc bytea,
    server_metadata jsonb NOT NULL,
    created_at timestamp with time zone DEFAULT now() NOT NULL
);

-- Name: tool_sources; Type: TABLE; Schema: public; Owner: -

CREATE TABLE public.tool_sources (
    id bigint NOT NULL,
    name text NOT NULL,
    url text NOT NULL,
    auth_env text,
    enabled boolean DEFAULT true NOT NULL,
    last_synced_at timestamp with time zone,
    last_error text,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    updated_at timestamp with time zone DEFAULT now() NOT NULL,
    auth text DEFAULT 'none'::text NOT NULL,
    oauth_scopes text[],
    oauth_client_id_env text,
    oauth_client_secret_env text,
    CONSTRAINT ck_tool_sources_auth CHECK ((auth = ANY (ARRAY['none'::text, 'shared'::text, 'owner_oauth'::text]))),
    CONSTRAINT ck_tool_sources_name CHECK ((name ~ '^[a-z][a-z0-9_]{0,31}$'::text)),
    CONSTRAINT ck_tool_sources_owner_oauth_no_auth_env CHECK (((auth <> 'owner_oauth'::text) OR (auth_env IS NULL)))
);

-- Name: tool_sources_id_seq; Type: SEQUENCE; Schema: public; Owner: -

ALTER TABLE public.tool_sources ALTER COLUMN id ADD GENERATED BY DEFAULT AS IDENTITY (
    SEQUENCE NAME public.tool_sources_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);

-- Name: tools; Type: TABLE; Schema: public; Owner: -

CREATE TABLE public.tools (
    id bigint NOT NULL,
    name text NOT NULL,
    description text DEFAULT ''::text NOT NULL,
    agents_allowed boolean DEFAULT false NOT NULL,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    source_id bigint,
    remote_name text,
    input_schema jsonb,
    access text DEFAULT 'read'::text NOT NULL,
    CONSTRAINT ck_tools_access CHECK ((access = ANY (ARRAY['read'::text, 'write'::text]))),
    CONSTRAINT ck_tools_source_remote_name CHECK (((source_id IS NULL) = (remote_name IS NULL)))
);

-- Name: tools_id_seq; Type: SEQUENCE; Schema: public; Owner: -

ALTER TABLE public.tools ALTER COLUMN id ADD GENERATED BY DEFAULT AS IDENTITY (
    SEQUENCE NAME public.tools_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);

-- Name: users; Type: TABLE; Schema: public; Owner: -

CREATE TABLE public.users (
    id bigint NOT NULL,
    email text,
    display_name text,
    timezone text,
    is_active boolean DEFAULT true NOT NULL,
    created_at timestamp with time zone DEFAULT now() NOT NULL
);

-- Name: users_id_seq; Type: SEQUENCE; Schema: public; Owner: -

ALTER TABLE public.users ALTER COLUMN id ADD GENERATED BY DEFAULT AS IDENTITY (
    SEQUENCE NAME public.users_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);

-- Name: agent_delivery_targets pk_agent_delivery_targets; Type: CONSTRAINT; Schema: public; Owner: -

ALTER TABLE ONLY public.agent_delivery_targets
    ADD CONSTRAINT pk_agent_delivery_targets PRIMARY KEY (agent_id, target_id);

-- Name: agent_models pk_agent_models; Type: CONSTRAINT; Schema: public; Owner: -

ALTER TABLE ONLY public.agent_models
    ADD CONSTRAINT pk_agent_models PRIMARY KEY (id);

-- Name: agent_run_steps pk_agent_run_steps; Type: CONSTRAINT; Schema: public; Owner: -

ALTER TABLE ONLY public.agent_run_steps
    ADD CONSTRAINT pk_agent_run_steps PRIMARY KEY (run_id, index);

-- Name: agent_runs pk_agent_runs; Type: CONSTRAINT; Schema: public; Owner: -

ALTER TABLE ONLY public.agent_runs
    ADD CONSTRAINT pk_agent_runs PRIMARY KEY (id);

-- Name: agent_tools pk_agent_tools; Type: CONSTRAINT; Schema: public; Owner: -

ALTER TABLE ONLY public.agent_tools
    ADD CONSTRAINT pk_agent_tools PRIMARY KEY (id);

-- Name: agents pk_agents; Type: CONSTRAINT; Schema: public; Owner: -

ALTER TABLE ONLY public.agents
    ADD CONSTRAINT pk_agents PRIMARY KEY (id);

-- Name: audit_log pk_audit_log; Type: CONSTRAINT; Schema: public; Owner: -

ALTER TABLE ONLY public.audit_log
    ADD CONSTRAINT pk_audit_log PRIMARY KEY (id);

-- Name: budget_alerts pk_budget_alerts; Type: CONSTRAINT; Schema: public; Owner: -

ALTER TABLE ONLY public.budget_alerts
    ADD CONSTRAINT pk_budget_alerts PRIMARY KEY (id);

-- Name: budget_weeks pk_budget_weeks; Type: CONSTRAINT; Schema: public; Owner: -

ALTER TABLE ONLY public.budget_weeks
    ADD CONSTRAINT pk_budget_weeks PRIMARY KEY (user_id, window_start, window_end);

-- Name: connection_waits pk_connection_waits; Type: CONSTRAINT; Schema: public; Owner: -

ALTER TABLE ONLY public.connection_waits
    ADD CONSTRAINT pk_connection_waits PRIMARY KEY (id);

-- Name: delivery_targets pk_delivery_targets; Type: CONSTRAINT; Schema: public; Owner: -

ALTER TABLE ONLY public.delivery_targets
    ADD CONSTRAINT pk_delivery_targets PRIMARY KEY (id);

-- Name: engine_activity pk_engine_activity; Type: CONSTRAINT; Schema: public; Owner: -

ALTER TABLE ONLY public.engine_activity
    ADD CONSTRAINT pk_engine_activity PRIMARY KEY (name);

-- Name: kb_document_grants pk_kb_document_grants; Type: CONSTRAINT; Schema: public; Owner: -

ALTER TABLE ONLY public.kb_document_grants
    ADD CONSTRAINT pk_kb_document_grants PRIMARY KEY (document_id, user_id);

-- Name: kb_document_links pk_kb_document_links; Type: CONSTRAINT; Schema: public; Owner: -

ALTER TABLE ONLY public.kb_document_links
    ADD CONSTRAINT pk_kb_document_links PRIMARY KEY (from_document_id, to_document_id);

-- Name: kb_documents pk_kb_documents; Type: CONSTRAINT; Schema: public; Owner: -

ALTER TABLE ONLY public.kb_documents
    ADD CONSTRAINT pk_kb_documents PRIMARY KEY (id);

-- Name: oauth_states pk_oauth_states; Type: CONSTRAINT; Schema: public; Owner: -

ALTER TABLE ONLY public.oauth_states
    ADD CONSTRAINT pk_oauth_states PRIMARY KEY (state_hash);

-- Name: platform_settings pk_platform_settings; Type: CONSTRAINT; Schema: public; Owner: -

ALTER TABLE ONLY public.platform_settings
    ADD CONSTRAINT pk_platform_settings PRIMARY KEY (key);

-- Name: run_deliveries pk_run_deliveries; Type: CONSTRAINT; Schema: public; Owner: -

ALTER TABLE ONLY public.run_deliveries
    ADD CONSTRAINT pk_run_deliveries PRIMARY KEY (id);

-- Name: tool_approvals pk_tool_approvals; Type: CONSTRAINT; Schema: public; Owner: -

ALTER TABLE ONLY public.tool_approvals
    ADD CONSTRAINT pk_tool_approvals PRIMARY KEY (id);

-- Name: tool_connections pk_tool_connections; Type: CONSTRAINT; Schema: public; Owner: -

ALTER TABLE ONLY public.tool_connections
    ADD CONSTRAINT pk_tool_connections PRIMARY KEY (id);

-- Name: tool_source_oauth_clients pk_tool_source_oauth_clients; Type: CONSTRAINT; Schema: public; Owner: -

ALTER TABLE ONLY public.tool_source_oauth_clients
    ADD CONSTRAINT pk_tool_source_oauth_clients PRIMARY KEY (source_id);

-- Name: tool_sources pk_tool_sources; Type: CONSTRAINT; Schema: public; Owner: -

ALTER TABLE ONLY public.tool_sources
    ADD CONSTRAINT pk_tool_sources PRIMARY KEY (id);

-- Name: tools pk_tools; Type: CONSTRAINT; Schema: public; Owner: -

ALTER TABLE ONLY public.tools
    ADD CONSTRAINT pk_tools PRIMARY KEY (id);

-- Name: users pk_users; Type: CONSTRAINT; Schema: public; Owner: -

ALTER TABLE ONLY public.users
    ADD CONSTRAINT pk_users PRIMARY KEY (id);

-- Name: agent_runs uq_agent_runs_retry_of; Type: CONSTRAINT; Schema: public; Owner: -

ALTER TABLE ONLY public.agent_runs
    ADD CONSTRAINT uq_agent_runs_retry_of UNIQUE (retry_of);

-- Name: agent_tools uq_agent_tools_agent_id_tool_id; Type: CONSTRAINT; Schema: public; Owner: -

ALTER TABLE ONLY public.agent_tools
    ADD CONSTRAINT uq_agent_tools_agent_id_tool_id UNIQUE (agent_id, tool_id);

-- Name: budget_alerts uq_budget_alerts_owner_id_window_start_percent; Type: CONSTRAINT; Schema: public; Owner: -

ALTER TABLE ONLY public.budget_alerts
    ADD CONSTRAINT uq_budget_alerts_owner_id_window_start_percent UNIQUE (owner_id, window_start, percent);

-- Name: kb_documents uq_kb_documents_source; Type: CONSTRAINT; Schema: public; Owner: -

ALTER TABLE ONLY public.kb_documents
    ADD CONSTRAINT uq_kb_documents_source UNIQUE (source);

-- Name: run_deliveries uq_run_deliveries_run_id_target_id; Type: CONSTRAINT; Schema: public; Owner: -

ALTER TABLE ONLY public.run_deliveries
    ADD CONSTRAINT uq_run_deliveries_run_id_target_id UNIQUE (run_id, target_id);

-- Name: run_deliveries uq_run_deliveries_webhook_id; Type: CONSTRAINT; Schema: public; Owner: -

ALTER TABLE ONLY public.run_deliveries
    ADD CONSTRAINT uq_run_deliveries_webhook_id UNIQUE (webhook_id);

-- Name: tool_connections uq_tool_connections_owner_id_source_id; Type: CONSTRAINT; Schema: public; Owner: -

ALTER TABLE ONLY public.tool_connections
    ADD CONSTRAINT uq_tool_connections_owner_id_source_id UNIQUE (owner_id, source_id);

-- Name: tool_sources uq_tool_sources_name; Type: CONSTRAINT; Schema: public; Owner: -

ALTER TABLE ONLY public.tool_sources
    ADD CONSTRAINT uq_tool_sources_name UNIQUE (name);

-- Name: tools uq_tools_name; Type: CONSTRAINT; Schema: public; Owner: -

ALTER TABLE ONLY public.tools
    ADD CONSTRAINT uq_tools_name UNIQUE (name);

-- Name: tools uq_tools_source_id_remote_name; Type: CONSTRAINT; Schema: public; Owner: -

ALTER TABLE ONLY public.tools
    ADD CONSTRAINT uq_tools_source_id_remote_name UNIQUE (source_id, remote_name);

-- Name: ix_agent_delivery_targets_target_id; Type: INDEX; Schema: public; Owner: -

CREATE INDEX ix_agent_delivery_targets_target_id ON public.agent_delivery_targets USING btree (target_id);

-- Name: ix_agent_models_fallback_model_id; Type: INDEX; Schema: public; Owner: -

CREATE INDEX ix_agent_models_fallback_model_id ON public.agent_models USING btree (fallback_model_id) WHERE (fallback_model_id IS NOT NULL);

-- Name: ix_agent_runs_agent_id; Type: INDEX; Schema: public; Owner: -

CREATE INDEX ix_agent_runs_agent_id ON public.agent_runs USING btree (agent_id);

-- Name: ix_agent_runs_budget; Type: INDEX; Schema: public; Owner: -

CREATE INDEX ix_agent_runs_budget ON public.agent_runs USING btree (agent_id, finished_at) INCLUDE (tokens_used);

-- Name: ix_agent_runs_finished_at; Type: INDEX; Schema: public; Owner: -

CREATE INDEX ix_agent_runs_finished_at ON public.agent_runs USING btree (finished_at);

-- Name: ix_agent_runs_journal; Type: INDEX; Schema: public; Owner: -

CREATE INDEX ix_agent_runs_journal ON public.agent_runs USING btree (agent_id, id DESC);

-- Name: ix_agent_runs_model_unfinished; Type: INDEX; Schema: public; Owner: -

CREATE INDEX ix_agent_runs_model_unfinished ON public.agent_runs USING btree (model_id, state, id) WHERE (state = ANY (ARRAY['queued'::text, 'running'::text]));

-- Name: ix_agent_runs_pace; Type: INDEX; Schema: public; Owner: -

CREATE INDEX ix_agent_runs_pace ON public.agent_runs USING btree (agent_id, id DESC) INCLUDE (tokens_used) WHERE (state = ANY (ARRAY['succeeded'::text, 'failed'::text]));

-- Name: ix_agent_runs_unfinished; Type: INDEX; Schema: public; Owner: -

CREATE INDEX ix_agent_runs_unfinished ON public.agent_runs USING btree (state, heartbeat_at) WHERE (state = ANY (ARRAY['queued'::text, 'running'::text]));

-- Name: ix_agent_tools_agent_id; Type: INDEX; Schema: public; Owner: -

CREATE INDEX ix_agent_tools_agent_id ON public.agent_tools USING btree (agent_id);

-- Name: ix_agent_tools_tool_id; Type: INDEX; Schema: public; Owner: -

CREATE INDEX ix_agent_tools_tool_id ON public.agent_tools USING btree (tool_id);

-- Name: ix_agents_deleted_at; Type: INDEX; Schema: public; Owner: -

CREATE INDEX ix_agents_deleted_at ON public.agents USING btree (deleted_at) WHERE (deleted_at IS NOT NULL);

-- Name: ix_agents_model_id; Type: INDEX; Schema: public; Owner: -

CREATE INDEX ix_agents_model_id ON public.agents USING btree (model_id);

-- Name: ix_agents_next_run_at; Type: INDEX; Schema: public; Owner: -

CREATE INDEX ix_agents_next_run_at ON public.agents USING btree (next_run_at) WHERE (next_run_at IS NOT NULL);

-- Name: ix_agents_user_id; Type: INDEX; Schema: public; Owner: -

CREATE INDEX ix_agents_user_id ON public.agents USING btree (user_id);

-- Name: ix_audit_log_actor_id; Type: INDEX; Schema: public; Owner: -

CREATE INDEX ix_audit_log_actor_id ON public.audit_log USING btree (actor_id, id DESC);

-- Name: ix_audit_log_agent_id; Type: INDEX; Schema: public; Owner: -

CREATE INDEX ix_audit_log_agent_id ON public.audit_log USING btree (agent_id, id DESC);

-- Name: ix_audit_log_user_id; Type: INDEX; Schema: public; Owner: -

CREATE INDEX ix_audit_log_user_id ON public.audit_log USING btree (user_id, id DESC);

-- Name: ix_connection_waits_agent_id; Type: INDEX; Schema: public; Owner: -

CREATE INDEX ix_connection_waits_agent_id ON public.connection_waits USING btree (agent_id);

-- Name: ix_connection_waits_expiry; Type: INDEX; Schema: public; Owner: -

CREATE INDEX ix_connection_waits_expiry ON public.connection_waits USING btree (expires_at) WHERE (status = 'pending'::text);

-- Name: ix_connection_waits_owner_source; Type: INDEX; Schema: public; Owner: -

CREATE INDEX ix_connection_waits_owner_source ON public.connection_waits USING btree (owner_id, source_id) WHERE (status = 'pending'::text);

-- Name: ix_connection_waits_run_id; Type: INDEX; Schema: public; Owner: -

CREATE INDEX ix_connection_waits_run_id ON public.connection_waits USING btree (run_id);

-- Name: ix_connection_waits_source_id; Type: INDEX; Schema: public; Owner: -

CREATE INDEX ix_connection_waits_source_id ON public.connection_waits USING btree (source_id);

-- Name: ix_connection_waits_tool_id; Type: INDEX; Schema: public; Owner: -

CREATE INDEX ix_connection_waits_tool_id ON public.connection_waits USING btree (tool_id);

-- Name: ix_kb_document_grants_user_id; Type: INDEX; Schema: public; Owner: -

CREATE INDEX ix_kb_document_grants_user_id ON public.kb_document_grants USING btree (user_id);

-- Name: ix_kb_document_links_to_document_id; Type: INDEX; Schema: public; Owner: -

CREATE INDEX ix_kb_document_links_to_document_id ON public.kb_document_links USING btree (to_document_id);

-- Name: ix_kb_documents_search; Type: INDEX; Schema: public; Owner: -

CREATE INDEX ix_kb_documents_search ON public.kb_documents USING gin (search_vector);

-- Name: ix_oauth_states_expires_at; Type: INDEX; Schema: public; Owner: -

CREATE INDEX ix_oauth_states_expires_at ON public.oauth_states USING btree (expires_at);

-- Name: ix_oauth_states_owner_id; Type: INDEX; Schema: public; Owner: -

CREATE INDEX ix_oauth_states_owner_id ON public.oauth_states USING btree (owner_id);

-- Name: ix_oauth_states_source_id; Type: INDEX; Schema: public; Owner: -

CREATE INDEX ix_oauth_states_source_id ON public.oauth_states USING btree (source_id);

-- Name: ix_run_deliveries_due; Type: INDEX; Schema: public; Owner: -

CREATE INDEX ix_run_deliveries_due ON public.run_deliveries USING btree (next_attempt_at) WHERE (status = 'pending'::text);

-- Name: ix_run_deliveries_finished_at; Type: INDEX; Schema: public; Owner: -

CREATE INDEX ix_run_deliveries_finished_at ON public.run_deliveries USING btree (finished_at) WHERE (finished_at IS NOT NULL);

-- Name: ix_run_deliveries_target_id; Type: INDEX; Schema: public; Owner: -

CREATE INDEX ix_run_deliveries_target_id ON public.run_deliveries USING btree (target_id);

-- Name: ix_tool_approvals_expiry; Type: INDEX; Schema: public; Owner: -

CREATE INDEX ix_tool_approvals_expiry ON public.tool_approvals USING btree (expires_at) WHERE (status = 'pending'::text);

-- Name: ix_tool_approvals_owner; Type: INDEX; Schema: public; Owner: -

CREATE INDEX ix_tool_approvals_owner ON public.tool_approvals USING btree (owner_id, id DESC);

-- Name: ix_tool_approvals_run_id; Type: INDEX; Schema: public; Owner: -

CREATE INDEX ix_tool_approvals_run_id ON public.tool_approvals USING btree (run_id);

-- Name: ix_tool_approvals_tool_id; Type: INDEX; Schema: public; Owner: -

CREATE INDEX ix_tool_approvals_tool_id ON public.tool_approvals USING btree (tool_id);

-- Name: ix_tool_connections_source_id; Type: INDEX; Schema: public; Owner: -

CREATE INDEX ix_tool_connections_source_id ON public.tool_connections USING btree (source_id);

-- Name: uq_agent_models_one_default; Type: INDEX; Schema: public; Owner: -

CREATE UNIQUE INDEX uq_agent_models_one_default ON public.agent_models USING btree (is_default) WHERE is_default;

-- Name: uq_agent_runs_one_unfinished; Type: INDEX; Schema: public; Owner: -

CREATE UNIQUE INDEX uq_agent_runs_one_unfinished ON public.agent_runs USING btree (agent_id) WHERE (state = ANY (ARRAY['queued'::text, 'running'::text]));

-- Name: uq_connection_waits_open_run; Type: INDEX; Schema: public; Owner: -

CREATE UNIQUE INDEX uq_connection_waits_open_run ON public.connection_waits USING btree (run_id) WHERE ((taken_at IS NULL) AND (status <> 'cancelled'::text));

-- Name: uq_tool_approvals_pending_run; Type: INDEX; Schema: public; Owner: -

CREATE UNIQUE INDEX uq_tool_approvals_pending_run ON public.tool_approvals USING btree (run_id) WHERE (status = 'pending'::text);

-- Name: agent_models agent_models_fallback_acyclic; Type: TRIGGER; Schema: public; Owner: -

CREATE TRIGGER agent_models_fallback_acyclic BEFORE INSERT OR UPDATE OF fallback_model_id ON public.agent_models FOR EACH ROW WHEN ((new.fallback_model_id IS NOT NULL)) EXECUTE FUNCTION public.agent_models_fallback_acyclic();

-- Name: agent_run_steps agent_run_steps_notify; Type: TRIGGER; Schema: public; Owner: -

CREATE TRIGGER agent_run_steps_notify AFTER INSERT OR UPDATE ON public.agent_run_steps FOR EACH ROW EXECUTE FUNCTION public.agent_run_steps_notify();

-- Name: agent_runs agent_runs_cost_at_finish; Type: TRIGGER; Schema: public; Owner: -

CREATE TRIGGER agent_runs_cost_at_finish BEFORE UPDATE OF state ON public.agent_runs FOR EACH ROW WHEN (((old.state = ANY (ARRAY['queued'::text, 'running'::text])) AND (new.state = ANY (ARRAY['succeeded'::text, 'failed'::text])))) EXECUTE FUNCTION public.agent_runs_cost_at_finish();

-- Name: agent_runs agent_runs_finish_insert; Type: TRIGGER; Schema: public; Owner: -

CREATE TRIGGER agent_runs_finish_insert AFTER INSERT ON public.agent_runs FOR EACH ROW WHEN ((new.state = ANY (ARRAY['succeeded'::text, 'failed'::text, 'skipped'::text]))) EXECUTE FUNCTION public.agent_runs_on_finish();

-- Name: agent_runs agent_runs_finish_state; Type: TRIGGER; Schema: public; Owner: -

CREATE TRIGGER agent_runs_finish_state AFTER UPDATE OF state ON public.agent_runs FOR EACH ROW WHEN (((old.state IS DISTINCT FROM new.state) AND (new.state = ANY (ARRAY['succeeded'::text, 'failed'::text, 'skipped'::text])))) EXECUTE FUNCTION public.agent_runs_on_finish();

-- Name: agent_runs agent_runs_notify_insert; Type: TRIGGER; Schema: public; Owner: -

CREATE TRIGGER agent_runs_notify_insert AFTER INSERT ON public.agent_runs FOR EACH ROW EXECUTE FUNCTION public.agent_runs_notify();

-- Name: agent_runs agent_runs_notify_state; Type: TRIGGER; Schema: public; Owner: -

CREATE TRIGGER agent_runs_notify_state AFTER UPDATE OF state ON public.agent_runs FOR EACH ROW WHEN ((old.state IS DISTINCT FROM new.state)) EXECUTE FUNCTION public.agent_runs_notify();

-- Name: agent_runs agent_runs_token_split; Type: TRIGGER; Schema: public; Owner: -

CREATE TRIGGER agent_runs_token_split BEFORE UPDATE ON public.agent_runs FOR EACH ROW WHEN ((((new.prompt_tokens + new.completion_tokens) <> new.tokens_used) AND (new.state = ANY (ARRAY['succeeded'::text, 'failed'::text, 'skipped'::text])))) EXECUTE FUNCTION public.agent_runs_token_split();

-- Name: agent_runs agent_runs_week_tokens; Type: TRIGGER; Schema: public; Owner: -

CREATE TRIGGER agent_runs_week_tokens BEFORE INSERT ON public.agent_runs FOR EACH ROW WHEN (((new.finished_at IS NOT NULL) AND (new.tokens_used <> 0))) EXECUTE FUNCTION public.agent_runs_week_tokens();

-- Name: agent_runs agent_runs_week_tokens_delete; Type: TRIGGER; Schema: public; Owner: -

CREATE TRIGGER agent_runs_week_tokens_delete AFTER DELETE ON public.agent_runs REFERENCING OLD TABLE AS gone FOR EACH STATEMENT EXECUTE FUNCTION public.agent_runs_week_tokens_deleted();

-- Name: agent_runs agent_runs_week_tokens_truncate; Type: TRIGGER; Schema: public; Owner: -

CREATE TRIGGER agent_runs_week_tokens_truncate AFTER TRUNCATE ON public.agent_runs FOR EACH STATEMENT EXECUTE FUNCTION public.budget_weeks_forget_all();

-- Name: agent_runs agent_runs_week_tokens_update; Type: TRIGGER; Schema: public; Owner: -

CREATE TRIGGER agent_runs_week_tokens_update BEFORE UPDATE ON public.agent_runs FOR EACH ROW WHEN ((((old.finished_at IS DISTINCT FROM new.finished_at) OR (old.tokens_used IS DISTINCT FROM new.tokens_used)) AND (((new.finished_at IS NOT NULL) AND (new.tokens_used <> 0)) OR ((old.finished_at IS NOT NULL) AND (old.tokens_used <> 0))))) EXECUTE FUNCTION public.agent_runs_week_tokens();

-- Name: agents agents_forget_budget_weeks; Type: TRIGGER; Schema: public; Owner: -

CREATE TRIGGER agents_forget_budget_weeks BEFORE DELETE OR UPDATE OF user_id ON public.agents FOR EACH ROW EXECUTE FUNCTION public.agents_forget_budget_weeks();

-- Name: agents agents_gate_clears_next_run_at; Type: TRIGGER; Schema: public; Owner: -

CREATE TRIGGER agents_gate_clears_next_run_at BEFORE INSERT OR UPDATE ON public.agents FOR EACH ROW EXECUTE FUNCTION public.agents_clear_next_run_at();

-- Name: agents agents_updated_at; Type: TRIGGER; Schema: public; Owner: -

CREATE TRIGGER agents_updated_at BEFORE UPDATE ON public.agents FOR EACH ROW EXECUTE FUNCTION public.agents_touch_updated_at();

-- Name: audit_log audit_log_append_only; Type: TRIGGER; Schema: public; Owner: -

CREATE TRIGGER audit_log_append_only BEFORE DELETE OR UPDATE ON public.audit_log FOR EACH ROW EXECUTE FUNCTION public.audit_log_append_only();

-- Name: audit_log audit_log_no_truncate; Type: TRIGGER; Schema: public; Owner: -

CREATE TRIGGER audit_log_no_truncate BEFORE TRUNCATE ON public.audit_log FOR EACH STATEMENT EXECUTE FUNCTION public.audit_log_append_only();

-- Name: budget_alerts budget_alerts_notify; Type: TRIGGER; Schema: public; Owner: -

CREATE TRIGGER budget_alerts_notify AFTER INSERT ON public.budget_alerts FOR EACH ROW EXECUTE FUNCTION public.budget_alerts_notify();

-- Name: agent_delivery_targets fk_agent_delivery_targets_agent_id_agents; Type: FK CONSTRAINT; Schema: public; Owner: -

ALTER TABLE ONLY public.agent_delivery_targets
    ADD CONSTRAINT fk_agent_delivery_targets_agent_id_agents FOREIGN KEY (agent_id) REFERENCES public.agents(id) ON DELETE CASCADE;

-- Name: agent_delivery_targets fk_agent_delivery_targets_target_id_delivery_targets; Type: FK CONSTRAINT; Schema: public; Owner: -

ALTER TABLE ONLY public.agent_delivery_targets
    ADD CONSTRAINT fk_agent_delivery_targets_target_id_delivery_targets FOREIGN KEY (target_id) REFERENCES public.delivery_targets(id) ON DELETE CASCADE;

-- Name: agent_models fk_agent_models_fallback_model_id_agent_models; Type: FK CONSTRAINT; Schema: public; Owner: -

ALTER TABLE ONLY public.agent_models
    ADD CONSTRAINT fk_agent_models_fallback_model_id_agent_models FOREIGN KEY (fallback_model_id) REFERENCES public.agent_models(id) ON DELETE SET NULL;

-- Name: agent_run_steps fk_agent_run_steps_run_id_agent_runs; Type: FK CONSTRAINT; Schema: public; Owner: -

ALTER TABLE ONLY public.agent_run_steps
    ADD CONSTRAINT fk_agent_run_steps_run_id_agent_runs FOREIGN KEY (run_id) REFERENCES public.agent_runs(id) ON DELETE CASCADE;

-- Name: agent_runs fk_agent_runs_agent_id_agents; Type: FK CONSTRAINT; Schema: public; Owner: -

ALTER TABLE ONLY public.agent_runs
    ADD CONSTRAINT fk_agent_runs_agent_id_agents FOREIGN KEY (agent_id) REFERENCES public.agents(id) ON DELETE CASCADE;

-- Name: agent_runs fk_agent_runs_retry_of_agent_runs; Type: FK CONSTRAINT; Schema: public; Owner: -

ALTER TABLE ONLY public.agent_runs
    ADD CONSTRAINT fk_agent_runs_retry_of_agent_runs FOREIGN KEY (retry_of) REFERENCES public.agent_runs(id) ON DELETE SET NULL;

-- Name: agent_tools fk_agent_tools_agent_id_agents; Type: FK CONSTRAINT; Schema: public; Owner: -

ALTER TABLE ONLY public.agent_tools
    ADD CONSTRAINT fk_agent_tools_agent_id_agents FOREIGN KEY (agent_id) REFERENCES public.agents(id) ON DELETE CASCADE;

-- Name: agent_tools fk_agent_tools_tool_id_tools; Type: FK CONSTRAINT; Schema: public; Owner: -

ALTER TABLE ONLY public.agent_tools
    ADD CONSTRAINT fk_agent_tools_tool_id_tools FOREIGN KEY (tool_id) REFERENCES public.tools(id) ON DELETE CASCADE;

-- Name: agents fk_agents_model_id_agent_models; Type: FK CONSTRAINT; Schema: public; Owner: -

ALTER TABLE ONLY public.agents
    ADD CONSTRAINT fk_agents_model_id_agent_models FOREIGN KEY (model_id) REFERENCES public.agent_models(id) ON DELETE SET NULL;

-- Name: agents fk_agents_user_id_users; Type: FK CONSTRAINT; Schema: public; Owner: -

ALTER TABLE ONLY public.agents
    ADD CONSTRAINT fk_agents_user_id_users FOREIGN KEY (user_id) REFERENCES public.users(id) ON DELETE CASCADE;

-- Name: budget_alerts fk_budget_alerts_owner_id_users; Type: FK CONSTRAINT; Schema: public; Owner: -

ALTER TABLE ONLY public.budget_alerts
    ADD CONSTRAINT fk_budget_alerts_owner_id_users FOREIGN KEY (owner_id) REFERENCES public.users(id) ON DELETE CASCADE;

-- Name: budget_weeks fk_budget_weeks_user_id_users; Type: FK CONSTRAINT; Schema: public; Owner: -

ALTER TABLE ONLY public.budget_weeks
    ADD CONSTRAINT fk_budget_weeks_user_id_users FOREIGN KEY (user_id) REFERENCES public.users(id) ON DELETE CASCADE;

-- Name: connection_waits fk_connection_waits_agent_id_agents; Type: FK CONSTRAINT; Schema: public; Owner: -

ALTER TABLE ONLY public.connection_waits
    ADD CONSTRAINT fk_connection_waits_agent_id_agents FOREIGN KEY (agent_id) REFERENCES public.agents(id) ON DELETE CASCADE;

-- Name: connection_waits fk_connection_waits_owner_id_users; Type: FK CONSTRAINT; Schema: public; Owner: -

ALTER TABLE ONLY public.connection_waits
    ADD CONSTRAINT fk_connection_waits_owner_id_users FOREIGN KEY (owner_id) REFERENCES public.users(id) ON DELETE CASCADE;

-- Name: connection_waits fk_connection_waits_run_id_agent_runs; Type: FK CONSTRAINT; Schema: public; Owner: -

ALTER TABLE ONLY public.connection_waits
    ADD CONSTRAINT fk_connection_waits_run_id_agent_runs FOREIGN KEY (run_id) REFERENCES public.agent_runs(id) ON DELETE CASCADE;

-- Name: connection_waits fk_connection_waits_source_id_tool_sources; Type: FK CONSTRAINT; Schema: public; Owner: -

ALTER TABLE ONLY public.connection_waits
    ADD CONSTRAINT fk_connection_waits_source_id_tool_sources FOREIGN KEY (source_id) REFERENCES public.tool_sources(id) ON DELETE SET NULL;

-- Name: connection_waits fk_connection_waits_tool_id_tools; Type: FK CONSTRAINT; Schema: public; Owner: -

ALTER TABLE ONLY public.connection_waits
    ADD CONSTRAINT fk_connection_waits_tool_id_tools FOREIGN KEY (tool_id) REFERENCES public.tools(id) ON DELETE SET NULL;

-- Name: kb_document_grants fk_kb_document_grants_document_id_kb_documents; Type: FK CONSTRAINT; Schema: public; Owner: -

ALTER TABLE ONLY public.kb_document_grants
    ADD CONSTRAINT fk_kb_document_grants_document_id_kb_documents FOREIGN KEY (document_id) REFERENCES public.kb_documents(id) ON DELETE CASCADE;

-- Name: kb_document_grants fk_kb_document_grants_user_id_users; Type: FK CONSTRAINT; Schema: public; Owner: -

ALTER TABLE ONLY public.kb_document_grants
    ADD CONSTRAINT fk_kb_document_grants_user_id_users FOREIGN KEY (user_id) REFERENCES public.users(id) ON DELETE CASCADE;

-- Name: kb_document_links fk_kb_document_links_from_document_id_kb_documents; Type: FK CONSTRAINT; Schema: public; Owner: -

ALTER TABLE ONLY public.kb_document_links
    ADD CONSTRAINT fk_kb_document_links_from_document_id_kb_documents FOREIGN KEY (from_document_id) REFERENCES public.kb_documents(id) ON DELETE CASCADE;

-- Name: kb_document_links fk_kb_document_links_to_document_id_kb_documents; Type: FK CONSTRAINT; Schema: public; Owner: -

ALTER TABLE ONLY public.kb_document_links
    ADD CONSTRAINT fk_kb_document_links_to_document_id_kb_documents FOREIGN KEY (to_document_id) REFERENCES public.kb_documents(id) ON DELETE CASCADE;

-- Name: oauth_states fk_oauth_states_owner_id_users; Type: FK CONSTRAINT; Schema: public; Owner: -

ALTER TABLE ONLY public.oauth_states
    ADD CONSTRAINT fk_oauth_states_owner_id_users FOREIGN KEY (owner_id) REFERENCES public.users(id) ON DELETE CASCADE;

-- Name: oauth_states fk_oauth_states_source_id_tool_sources; Type: FK CONSTRAINT; Schema: public; Owner: -

ALTER TABLE ONLY public.oauth_states
    ADD CONSTRAINT fk_oauth_states_source_id_tool_sources FOREIGN KEY (source_id) REFERENCES public.tool_sources(id) ON DELETE CASCADE;

-- Name: run_deliveries fk_run_deliveries_run_id_agent_runs; Type: FK CONSTRAINT; Schema: public; Owner: -

ALTER TABLE ONLY public.run_deliveries
    ADD CONSTRAINT fk_run_deliveries_run_id_agent_runs FOREIGN KEY (run_id) REFERENCES public.agent_runs(id) ON DELETE CASCADE;

-- Name: run_deliveries fk_run_deliveries_target_id_delivery_targets; Type: FK CONSTRAINT; Schema: public; Owner: -

ALTER TABLE ONLY public.run_deliveries
    ADD CONSTRAINT fk_run_deliveries_target_id_delivery_targets FOREIGN KEY (target_id) REFERENCES public.delivery_targets(id) ON DELETE CASCADE;

-- Name: tool_approvals fk_tool_approvals_agent_id_agents; Type: FK CONSTRAINT; Schema: public; Owner: -

ALTER TABLE ONLY public.tool_approvals
    ADD CONSTRAINT fk_tool_approvals_agent_id_agents FOREIGN KEY (agent_id) REFERENCES public.agents(id) ON DELETE CASCADE;

-- Name: tool_approvals fk_tool_approvals_owner_id_users; Type: FK CONSTRAINT; Schema: public; Owner: -

ALTER TABLE ONLY public.tool_approvals
    ADD CONSTRAINT fk_tool_approvals_owner_id_users FOREIGN KEY (owner_id) REFERENCES public.users(id) ON DELETE CASCADE;

-- Name: tool_approvals fk_tool_approvals_run_id_agent_runs; Type: FK CONSTRAINT; Schema: public; Owner: -

ALTER TABLE ONLY public.tool_approvals
    ADD CONSTRAINT fk_tool_approvals_run_id_agent_runs FOREIGN KEY (run_id) REFERENCES public.agent_runs(id) ON DELETE CASCADE;

-- Name: tool_approvals fk_tool_approvals_tool_id_tools; Type: FK CONSTRAINT; Schema: public; Owner: -

ALTER TABLE ONLY public.tool_approvals
    ADD CONSTRAINT fk_tool_approvals_tool_id_tools FOREIGN KEY (tool_id) REFERENCES public.tools(id) ON DELETE SET NULL;

-- Name: tool_connections fk_tool_connections_owner_id_users; Type: FK CONSTRAINT; Schema: public; Owner: -

ALTER TABLE ONLY public.tool_connections
    ADD CONSTRAINT fk_tool_connections_owner_id_users FOREIGN KEY (owner_id) REFERENCES public.users(id) ON DELETE CASCADE;

-- Name: tool_connections fk_tool_connections_source_id_tool_sources; Type: FK CONSTRAINT; Schema: public; Owner: -

ALTER TABLE ONLY public.tool_connections
    ADD CONSTRAINT fk_tool_connections_source_id_tool_sources FOREIGN KEY (source_id) REFERENCES public.tool_sources(id) ON DELETE CASCADE;

-- Name: tool_source_oauth_clients fk_tool_source_oauth_clients_source_id_tool_sources; Type: FK CONSTRAINT; Schema: public; Owner: -

ALTER TABLE ONLY public.tool_source_oauth_clients
    ADD CONSTRAINT fk_tool_source_oauth_clients_source_id_tool_sources FOREIGN KEY (source_id) REFERENCES public.tool_sources(id) ON DELETE CASCADE;

-- Name: tools fk_tools_source_id_tool_sources; Type: FK CONSTRAINT; Schema: public; Owner: -

ALTER TABLE ONLY public.tools
    ADD CONSTRAINT fk_tools_source_id_tool_sources FOREIGN KEY (source_id) REFERENCES public.tool_sources(id) ON DELETE CASCADE;
