"""Each owner's budget week kept as a running total (`budget_weeks`), so the budget gate reads one
row instead of summing the week.

The gate (a request, a claim, the alert check after a finish) used to sum the owner's week agent by
agent: one index probe per agent of the owner plus every finished run of the week, on every run's
request and claim. A finished run now adds its tokens to its owner's week as it is written: the
`agent_runs_week_tokens` BEFORE trigger (last of the BEFORE triggers by name, so it sees the tokens
`agent_runs_token_split` settled). The readers (`db.spend.owner_week_tokens`) take the row of the
exact window they computed (`window_start`, `window_end`) and sum the week as before when there is
none, so a row is a cache of the sum that can only be missing, never wrong:

- A week's row is created by the first counted finish in it, from the sum of the week's other runs
  plus its own (a BEFORE trigger does not see its own row). Concurrent first finishes meet on the
  primary key: the later one adds its tokens to the row the earlier one created
  (ON CONFLICT DO UPDATE), whose sum could not see it.
- A changed run (a finished run's tokens or finish time edited, a run deleted) takes its old tokens
  out of every row whose window held it; the rows are keyed by their window, so a row made under an
  earlier organisation zone stays exact for its own window.
- The window is the platform zone's Sunday-to-Sunday week (`budget_week_of`, as
  `domain.budget.week_window`); a zone PostgreSQL does not know counts as UTC, as in Python. Where
  the two would disagree on a window the reader finds no row and sums: slower, not wrong.
- TRUNCATE of the runs forgets every row; deleting an agent, or moving it to another owner,
  forgets its owners' rows (they are made again from the sum at the next finish).

Revision ID: e0008_budget_weeks
Revises: e0007_mcp_tools
Create Date: 2026-12-03
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "e0008_budget_weeks"
down_revision: str | None = "e0007_mcp_tools"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

MIDNIGHT_FUNCTION = """
CREATE FUNCTION budget_local_midnight(day date, zone text) RETURNS timestamptz
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
END $$
"""

WEEK_FUNCTION = """
CREATE FUNCTION budget_week_of(at timestamptz, OUT window_start timestamptz,
                               OUT window_end timestamptz)
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
END $$
"""

COUNT_FUNCTION = """
CREATE FUNCTION agent_runs_week_tokens() RETURNS trigger
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
END $$
"""

UNCOUNT_FUNCTION = """
CREATE FUNCTION agent_runs_week_tokens_deleted() RETURNS trigger
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
END $$
"""

FORGET_ALL_FUNCTION = """
CREATE FUNCTION budget_weeks_forget_all() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
BEGIN
    DELETE FROM budget_weeks;
    RETURN NULL;
END $$
"""

FORGET_OWNERS_FUNCTION = """
CREATE FUNCTION agents_forget_budget_weeks() RETURNS trigger
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
END $$
"""

# Whether a write changes what a run counts in its owner's week.
_COUNTS_NEW = "NEW.finished_at IS NOT NULL AND NEW.tokens_used <> 0"
_COUNTED_OLD = "OLD.finished_at IS NOT NULL AND OLD.tokens_used <> 0"


def upgrade() -> None:
    op.create_table(
        "budget_weeks",
        sa.Column("user_id", sa.BigInteger(), nullable=False),
        sa.Column("window_start", sa.DateTime(timezone=True), nullable=False),
        sa.Column("window_end", sa.DateTime(timezone=True), nullable=False),
        sa.Column("tokens_used", sa.BigInteger(), nullable=False),
        sa.ForeignKeyConstraint(
            ["user_id"],
            ["users.id"],
            name=op.f("fk_budget_weeks_user_id_users"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint(
            "user_id", "window_start", "window_end", name=op.f("pk_budget_weeks")
        ),
    )
    op.execute(MIDNIGHT_FUNCTION)
    op.execute(WEEK_FUNCTION)
    op.execute(COUNT_FUNCTION)
    op.execute(
        "CREATE TRIGGER agent_runs_week_tokens BEFORE INSERT ON agent_runs"
        f" FOR EACH ROW WHEN ({_COUNTS_NEW}) EXECUTE FUNCTION agent_runs_week_tokens()"
    )
    op.execute(
        "CREATE TRIGGER agent_runs_week_tokens_update BEFORE UPDATE ON agent_runs"
        " FOR EACH ROW WHEN ((OLD.finished_at IS DISTINCT FROM NEW.finished_at"
        " OR OLD.tokens_used IS DISTINCT FROM NEW.tokens_used)"
        f" AND (({_COUNTS_NEW}) OR ({_COUNTED_OLD})))"
        " EXECUTE FUNCTION agent_runs_week_tokens()"
    )
    op.execute(UNCOUNT_FUNCTION)
    op.execute(
        "CREATE TRIGGER agent_runs_week_tokens_delete AFTER DELETE ON agent_runs"
        " REFERENCING OLD TABLE AS gone FOR EACH STATEMENT"
        " EXECUTE FUNCTION agent_runs_week_tokens_deleted()"
    )
    op.execute(FORGET_ALL_FUNCTION)
    op.execute(
        "CREATE TRIGGER agent_runs_week_tokens_truncate AFTER TRUNCATE ON agent_runs"
        " FOR EACH STATEMENT EXECUTE FUNCTION budget_weeks_forget_all()"
    )
    op.execute(FORGET_OWNERS_FUNCTION)
    op.execute(
        "CREATE TRIGGER agents_forget_budget_weeks BEFORE DELETE OR UPDATE OF user_id ON agents"
        " FOR EACH ROW EXECUTE FUNCTION agents_forget_budget_weeks()"
    )


def downgrade() -> None:
    op.execute("DROP TRIGGER agents_forget_budget_weeks ON agents")
    op.execute("DROP FUNCTION agents_forget_budget_weeks()")
    op.execute("DROP TRIGGER agent_runs_week_tokens_truncate ON agent_runs")
    op.execute("DROP FUNCTION budget_weeks_forget_all()")
    op.execute("DROP TRIGGER agent_runs_week_tokens_delete ON agent_runs")
    op.execute("DROP FUNCTION agent_runs_week_tokens_deleted()")
    op.execute("DROP TRIGGER agent_runs_week_tokens_update ON agent_runs")
    op.execute("DROP TRIGGER agent_runs_week_tokens ON agent_runs")
    op.execute("DROP FUNCTION agent_runs_week_tokens()")
    op.execute("DROP FUNCTION budget_week_of(timestamptz)")
    op.execute("DROP FUNCTION budget_local_midnight(date, text)")
    op.drop_table("budget_weeks")
