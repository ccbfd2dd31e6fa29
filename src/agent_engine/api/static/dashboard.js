// Agent Engine dashboard: one static page, no build step, no external assets.
//
// Queries go to POST /graphql with the bearer token; live run events come over a WebSocket
// speaking graphql-transport-ws (the small client below). The token lives in this tab's
// sessionStorage only, never in the URL. Everything from the API is rendered with textContent,
// never as HTML. Fields that only newer servers have (Budget.forecast, Query.adminSpend) are
// detected by introspection and shown only when present.
(() => {
  "use strict";

  const TOKEN_KEY = "agent-engine.dashboard.token";
  const FEED_MAX_ITEMS = 60;
  const REFRESH_DEBOUNCE_MS = 400;
  const FLEET_REFRESH_MS = 30000;
  const RECONNECT_MIN_MS = 1000;
  const RECONNECT_MAX_MS = 30000;
  const HOUR_MS = 3600 * 1000;
  const TERMINAL = new Set(["SUCCEEDED", "FAILED", "SKIPPED"]);

  const $ = (selector) => document.querySelector(selector);

  // --- small DOM helpers (text only) ------------------------------------------------------------

  function el(tag, props, ...children) {
    const node = document.createElement(tag);
    for (const [key, value] of Object.entries(props || {})) {
      if (value === undefined || value === null) continue;
      if (key === "class") node.className = value;
      else if (key === "text") node.textContent = value;
      else if (key.startsWith("data-")) node.setAttribute(key, value);
      else if (key === "title") node.title = value;
      else if (key === "onclick") node.addEventListener("click", value);
      else node.setAttribute(key, value);
    }
    for (const child of children) {
      if (child === null || child === undefined) continue;
      node.append(child instanceof Node ? child : document.createTextNode(String(child)));
    }
    return node;
  }

  function pill(state) {
    return el("span", { class: "pill", "data-state": state, text: state.replace("_", " ") });
  }

  const relative = new Intl.RelativeTimeFormat(undefined, { numeric: "auto" });

  function ago(iso) {
    if (!iso) return "–";
    const seconds = Math.round((new Date(iso).getTime() - Date.now()) / 1000);
    const steps = [
      ["day", 86400],
      ["hour", 3600],
      ["minute", 60],
    ];
    for (const [unit, size] of steps) {
      if (Math.abs(seconds) >= size) return relative.format(Math.round(seconds / size), unit);
    }
    return relative.format(seconds, "second");
  }

  function when(iso) {
    return el("span", { title: iso ? new Date(iso).toLocaleString() : "", text: ago(iso) });
  }

  function number(value) {
    return value === null || value === undefined ? "–" : Number(value).toLocaleString();
  }

  function replaceRows(tbody, rows) {
    tbody.replaceChildren(...rows);
  }

  function debounce(fn, ms) {
    let timer = null;
    return () => {
      clearTimeout(timer);
      timer = setTimeout(fn, ms);
    };
  }

  // --- GraphQL over HTTP ------------------------------------------------------------------------

  class GraphQLError extends Error {
    constructor(error) {
      super(error.message);
      this.code = (error.extensions || {}).code;
      this.extensions = error.extensions || {};
    }
  }

  async function gql(query, variables) {
    const response = await fetch("/graphql", {
      method: "POST",
      headers: { "Content-Type": "application/json", Authorization: `Bearer ${state.token}` },
      body: JSON.stringify({ query, variables: variables || {} }),
    });
    let body;
    try {
      body = await response.json();
    } catch (_) {
      throw new GraphQLError({ message: `HTTP ${response.status}`, extensions: {} });
    }
    if (body.errors && body.errors.length) throw new GraphQLError(body.errors[0]);
    return body.data;
  }

  // --- graphql-transport-ws: a minimal client ---------------------------------------------------
  //
  // connection_init with the token → connection_ack → subscribe per operation; next / error /
  // complete per id; ping ↔ pong. On a dropped connection it reconnects with backoff and calls
  // onReady again, so the page re-queries what it may have missed (the stream is live only).

  class TransportWs {
    constructor(url, token, { onReady, onDown, onRejected }) {
      this.url = url;
      this.token = token;
      this.onReady = onReady;
      this.onDown = onDown;
      this.onRejected = onRejected;
      this.operations = new Map();
      this.nextId = 1;
      this.delay = RECONNECT_MIN_MS;
      this.closed = false;
      this.acked = false;
      this.connect();
    }

    connect() {
      const socket = new WebSocket(this.url, "graphql-transport-ws");
      this.socket = socket;
      socket.addEventListener("open", () => {
        this.send({ type: "connection_init", payload: { Authorization: `Bearer ${this.token}` } });
      });
      socket.addEventListener("message", (event) => this.receive(JSON.parse(event.data)));
      socket.addEventListener("close", (event) => {
        this.acked = false;
        if (this.closed) return;
        // 4401/4403: the server refused the token; retrying would not help.
        if (event.code === 4401 || event.code === 4403) {
          this.closed = true;
          this.onRejected(event.reason || "the token was refused");
          return;
        }
        this.onDown();
        setTimeout(() => this.closed || this.connect(), this.delay);
        this.delay = Math.min(this.delay * 2, RECONNECT_MAX_MS);
      });
    }

    send(message) {
      if (this.socket && this.socket.readyState === WebSocket.OPEN) {
        this.socket.send(JSON.stringify(message));
      }
    }

    receive(message) {
      const operation = this.operations.get(message.id);
      switch (message.type) {
        case "connection_ack":
          this.acked = true;
          this.delay = RECONNECT_MIN_MS;
          for (const [id, op] of this.operations) this.start(id, op);
          this.onReady();
          break;
        case "ping":
          this.send({ type: "pong" });
          break;
        case "next":
          if (operation) operation.next(message.payload);
          break;
        case "error":
          if (operation) operation.error(message.payload);
          break;
        case "complete":
          if (operation) operation.complete();
          break;
        default:
          break;
      }
    }

    start(id, op) {
      this.send({ id, type: "subscribe", payload: { query: op.query, variables: op.variables } });
    }

    subscribe(query, variables, handlers) {
      const id = String(this.nextId++);
      const op = {
        query,
        variables: variables || {},
        next: handlers.next,
        error: handlers.error || (() => {}),
        // The server ended the stream (e.g. SUBSCRIBER_TOO_SLOW): start it again.
        complete: () => this.acked && this.start(id, op),
      };
      this.operations.set(id, op);
      if (this.acked) this.start(id, op);
      return id;
    }

    close() {
      this.closed = true;
      if (this.socket) this.socket.close(1000, "signed out");
    }
  }

  // --- state ------------------------------------------------------------------------------------

  const state = {
    token: null,
    viewer: null,
    features: {
      forecast: false,
      adminSpend: false,
      approvals: false,
      caps: false,
      retry: false,
      fallback: false,
      connections: false,
    },
    agents: new Map(), // id → agent
    feed: new Map(), // run id → { run, node }
    socket: null,
    fleetTimer: null,
    connectUrls: new Map(), // source id → the authorization URL last given for it
  };

  const FEATURES_QUERY = `query DashboardFeatures {
    query: __type(name: "Query") { fields { name } }
    budget: __type(name: "Budget") { fields { name } }
    agent: __type(name: "Agent") { fields { name } }
    run: __type(name: "Run") { fields { name } }
    runStep: __type(name: "RunStep") { fields { name } }
  }`;

  const VIEWER_QUERY = `query DashboardViewer {
    viewer { isAdmin user { id displayName email } }
  }`;

  const RUN_FIELDS = `id state reason trigger tokensUsed createdAt startedAt finishedAt`;

  function ownerQuery() {
    const forecast = state.features.forecast
      ? "forecast { projectedTokens exhaustsAt agentsWithoutHistory }"
      : "";
    const waiting = waitingFields();
    const caps = state.features.caps ? "usedTokensThisWeek weeklyTokenCap maxTokensPerRun" : "";
    // Which model answered each model call of the last run (a fallback's steps are marked).
    const fallbackSteps = state.features.fallback ? "steps { kind name fallback }" : "";
    const approvals = state.features.approvals
      ? `approvals: toolApprovals(first: 50, status: PENDING) {
          edges { node { id input expiresAt tool { name } run { id }
                         agent { id name owner { id } } } }
        }`
      : "";
    return `query DashboardOwner {
      viewer {
        agents {
          id name status nextRunAt adminPauseNote ${caps}
          activeRun { ${RUN_FIELDS} ${waiting} }
          lastRun { ${RUN_FIELDS} ${fallbackSteps} }
        }
        budget { usedTokens capTokens remainingTokens exceeded windowStart windowEnd ${forecast} }
      }
      ${approvals}
    }`;
  }

  // What a parked run waits for: its owner's approval, or their connection at a tool source.
  function waitingFields() {
    const approval = state.features.approvals ? "pendingApproval { id }" : "";
    const connection = state.features.connections
      ? "waitingFor pendingConnection { sourceId sourceName status }"
      : "";
    return `${approval} ${connection}`;
  }

  function adminQuery() {
    const spend = state.features.adminSpend
      ? "adminSpend { owner { id displayName email } tokens cost runs }"
      : "";
    return `query DashboardFleet {
      recent: adminRuns(first: 20) { edges { node { ${RUN_FIELDS} agent { id name } } } }
      inFlight: adminRuns(first: 100, states: [QUEUED, RUNNING]) {
        edges { node { ${RUN_FIELDS} agent { id name owner { id displayName email } } } }
        pageInfo { hasNextPage }
      }
      problems: adminRuns(first: 100, states: [FAILED, SKIPPED]) {
        edges { node { ${RUN_FIELDS} agent { id name } } }
        pageInfo { hasNextPage }
      }
      adminAuditLog(first: 20) {
        edges { node { id at action agentId userId details actor { id displayName email } } }
      }
      ${spend}
    }`;
  }

  function runEventsQuery() {
    // A parked run (a tool call waiting for its owner) comes as RUNNING → RUNNING with it set.
    const waiting = waitingFields();
    // The run's trace (tracing on): shown in the feed, linked when the server has a template.
    const trace = state.features.traceId ? "traceId" : "";
    return `subscription DashboardRunEvents {
      runEvents { previousState run { ${RUN_FIELDS} ${waiting} ${trace}
        agent { id name owner { id displayName email } } } }
    }`;
  }

  // --- sign in / out ----------------------------------------------------------------------------

  function showSignIn(message) {
    $("#signin").hidden = false;
    $("#app").hidden = true;
    $("#signout").hidden = true;
    $("#who").textContent = "";
    $("#signin-error").textContent = message || "";
    setLive("off", "offline");
  }

  function signOut(message) {
    sessionStorage.removeItem(TOKEN_KEY);
    state.token = null;
    if (state.socket) state.socket.close();
    state.socket = null;
    clearInterval(state.fleetTimer);
    state.agents.clear();
    state.feed.clear();
    state.connectUrls.clear();
    $("#feed").replaceChildren();
    showSignIn(message);
  }

  async function start(token) {
    state.token = token;
    try {
      const [features, viewer] = [await gql(FEATURES_QUERY), await gql(VIEWER_QUERY)];
      state.features.forecast = hasField(features.budget, "forecast");
      state.features.adminSpend = hasField(features.query, "adminSpend");
      state.features.approvals = hasField(features.query, "toolApprovals");
      state.features.caps = hasField(features.agent, "usedTokensThisWeek");
      state.features.retry = hasField(features.run, "retryOf");
      state.features.fallback = hasField(features.runStep, "fallback");
      state.features.traceId = hasField(features.run, "traceId");
      state.features.connections =
        hasField(features.run, "pendingConnection") && hasField(features.query, "toolConnections");
      state.viewer = viewer.viewer;
    } catch (error) {
      signOut(
        error.code === "UNAUTHENTICATED" || error.code === "FORBIDDEN"
          ? `Sign-in refused: ${error.message}`
          : `Could not reach the API: ${error.message}`,
      );
      return;
    }
    sessionStorage.setItem(TOKEN_KEY, token);
    const user = state.viewer.user;
    $("#who").textContent =
      `${user.displayName || user.email || "user " + user.id}` +
      (state.viewer.isAdmin ? " · admin" : "");
    $("#signin").hidden = true;
    $("#app").hidden = false;
    $("#signout").hidden = false;
    $("#admin").hidden = !state.viewer.isAdmin;
    $("#spend-panel").hidden = !(state.viewer.isAdmin && state.features.adminSpend);
    $("#feed-scope").textContent = state.viewer.isAdmin ? "(every agent)" : "(your agents)";
    await refreshAll();
    connectLive();
    if (state.viewer.isAdmin) {
      state.fleetTimer = setInterval(() => refreshFleet().catch(showError), FLEET_REFRESH_MS);
    }
  }

  function hasField(type, name) {
    return !!(type && type.fields && type.fields.some((field) => field.name === name));
  }

  // --- live events ------------------------------------------------------------------------------

  function setLive(kind, label) {
    const badge = $("#live");
    badge.dataset.state = kind;
    badge.textContent = label;
  }

  const refreshSoon = debounce(() => refreshAll().catch(showError), REFRESH_DEBOUNCE_MS);

  function connectLive() {
    const scheme = location.protocol === "https:" ? "wss:" : "ws:";
    state.socket = new TransportWs(`${scheme}//${location.host}/graphql`, state.token, {
      onReady: () => {
        setLive("live", "live");
        refreshSoon(); // events missed while disconnected are not replayed: re-query
      },
      onDown: () => setLive("reconnecting", "reconnecting…"),
      onRejected: (reason) => signOut(`The live connection was refused: ${reason}`),
    });
    state.socket.subscribe(runEventsQuery(), {}, {
      next: (payload) => {
        if (payload.errors && payload.errors.length) {
          showError(new GraphQLError(payload.errors[0]));
          return;
        }
        const event = payload.data.runEvents;
        upsertFeed(event.run, event.run.agent);
        if (state.viewer.isAdmin) trackInFlight(event.run);
        if (TERMINAL.has(event.run.state) || event.previousState === null) refreshSoon();
      },
      error: (errors) => showError(new GraphQLError(errors[0] || { message: "subscription error" })),
    });
    if (state.features.approvals) {
      // A run parks (or an approval is decided, expires or is cancelled): re-query.
      state.socket.subscribe(TOOL_APPROVALS, {}, {
        next: () => refreshSoon(),
        error: (errors) =>
          showError(new GraphQLError(errors[0] || { message: "subscription error" })),
      });
    }
  }

  const TOOL_APPROVALS = `subscription DashboardApprovals { toolApprovals { id status } }`;

  // The viewer's own waiting calls (an admin sees every owner's, but decides only their own).
  function renderApprovals(approvals) {
    const mine = approvals.filter(
      (approval) => approval.agent.owner.id === state.viewer.user.id,
    );
    const rows = mine.map((approval) => {
      const note = el("input", {
        type: "text",
        placeholder: "optional note",
        "aria-label": "note",
        maxlength: "1000",
      });
      return el(
        "tr",
        { "data-approval-id": approval.id, "data-run-id": approval.run.id },
        el("td", { text: `#${approval.run.id}` }),
        el("td", { text: approval.agent.name }),
        el("td", { text: approval.tool.name }),
        el("td", {}, el("code", { text: JSON.stringify(approval.input) })),
        el("td", {}, when(approval.expiresAt)),
        el("td", {}, note),
        el(
          "td",
          {},
          el("button", {
            type: "button",
            text: "Approve",
            "data-action": "approve",
            onclick: () => decide(approval, true, note.value),
          }),
          " ",
          el("button", {
            type: "button",
            text: "Decline",
            "data-action": "decline",
            onclick: () => decide(approval, false, note.value),
          }),
        ),
      );
    });
    replaceRows($("#approvals tbody"), rows);
    $("#approvals-panel").hidden = mine.length === 0;
  }

  async function decide(approval, approve, note) {
    try {
      await gql(
        `mutation DashboardDecide($id: ID!, $approve: Boolean!, $note: String) {
          decideToolCall(approvalId: $id, approve: $approve, note: $note) { id status }
        }`,
        { id: approval.id, approve, note: note.trim() || null },
      );
    } catch (error) {
      showError(new Error(`${approval.tool.name}: ${error.message}`));
    }
    refreshSoon();
  }

  // AGENT_ENGINE_TRACE_URL_TEMPLATE, put on the page by the server (validated there: http(s),
  // with {trace_id}); a trace id is 32 hex digits, checked again before it goes into a URL.
  const TRACE_URL_TEMPLATE = document.body.dataset.traceUrlTemplate || "";
  const TRACE_ID = /^[0-9a-f]{32}$/;

  function traceLink(traceId) {
    if (!traceId || !TRACE_ID.test(traceId)) return null;
    const label = `trace ${traceId}`;
    if (!TRACE_URL_TEMPLATE) return el("span", { class: "meta trace", text: label });
    const href = TRACE_URL_TEMPLATE.split("{trace_id}").join(traceId);
    return el("a", {
      class: "meta trace",
      href,
      target: "_blank",
      rel: "noopener noreferrer",
      "data-trace-id": traceId,
      text: label,
    });
  }

  // A run waiting for its owner's account at an OWNER_OAUTH source: the owner gets the link
  // (connectToolSource gives a single-use authorization URL; it opens in a new tab).
  function waitingForConnection(run, agent) {
    const pending = run.pendingConnection;
    const expired = pending.status === "EXPIRED" ? " (expired)" : "";
    const owner = agent && agent.owner ? agent.owner.id : state.viewer.user.id;
    if (owner !== state.viewer.user.id) {
      return el("span", {
        class: "meta",
        text: `waiting for its owner's connection to ${pending.sourceName}${expired}`,
      });
    }
    const link = el("a", {
      href: "#",
      class: "connect",
      "data-source-id": pending.sourceId,
      text: `connect your account at ${pending.sourceName}`,
    });
    const known = state.connectUrls.get(pending.sourceId);
    if (known) showConnectUrl(link, known);
    link.onclick = (event) => {
      event.preventDefault();
      connectSource(pending);
    };
    return el(
      "span",
      { class: "meta waiting-connection" },
      `waiting for your connection${expired}: `,
      link,
    );
  }

  function showConnectUrl(link, url) {
    link.href = url;
    link.target = "_blank";
    link.rel = "noopener";
    link.dataset.authorizationUrl = url;
  }

  async function connectSource(pending) {
    // The tab is opened while the click is still a user gesture; the URL follows.
    const tab = window.open("", "_blank");
    try {
      const data = await gql(
        `mutation DashboardConnect($id: ID!) {
          connectToolSource(sourceId: $id) { authorizationUrl expiresAt }
        }`,
        { id: pending.sourceId },
      );
      const url = data.connectToolSource.authorizationUrl;
      // The feed may have re-rendered the run meanwhile: every link to this source gets it.
      state.connectUrls.set(pending.sourceId, url);
      for (const link of document.querySelectorAll("a.connect")) {
        if (link.dataset.sourceId === pending.sourceId) showConnectUrl(link, url);
      }
      if (tab) tab.location.href = url;
    } catch (error) {
      if (tab) tab.close();
      showError(new Error(`${pending.sourceName}: ${error.message}`));
    }
  }

  function upsertFeed(run, agent) {
    const known = state.feed.get(run.id);
    if (known && order(known.run) > order(run)) return; // an older state arriving late
    const node = el(
      "li",
      { "data-run-id": run.id, "data-state": run.state },
      el("span", { class: "run-id", text: `#${run.id}` }),
      el("span", { class: "agent", text: agent ? agent.name : "" }),
      run.pendingApproval || run.pendingConnection ? pill("WAITING") : pill(run.state),
      run.pendingApproval ? el("span", { class: "meta", text: "waiting for your approval" }) : null,
      run.pendingConnection ? waitingForConnection(run, agent) : null,
      run.reason ? el("span", { class: "meta", text: run.reason.toLowerCase() }) : null,
      el("span", { class: "meta", text: `${number(run.tokensUsed)} tokens` }),
      el("span", { class: "meta" }, when(run.finishedAt || run.startedAt || run.createdAt)),
      traceLink(run.traceId),
    );
    const feed = $("#feed");
    if (known) {
      known.node.replaceWith(node);
    } else {
      // Newest run first: insert before the first item with a smaller id.
      const before = [...feed.children].find((item) => Number(item.dataset.runId) < Number(run.id));
      feed.insertBefore(node, before || null);
    }
    state.feed.set(run.id, { run, node });
    while (feed.children.length > FEED_MAX_ITEMS) {
      const last = feed.lastElementChild;
      state.feed.delete(last.dataset.runId);
      last.remove();
    }
    $("#feed-empty").hidden = feed.children.length > 0;
  }

  // The fleet's in-flight table follows the events between its refreshes.
  function trackInFlight(run) {
    const body = $("#in-flight tbody");
    const row = body.querySelector(`tr[data-run-id="${CSS.escape(run.id)}"]`);
    if (TERMINAL.has(run.state)) {
      if (row) row.remove();
    } else if (row) {
      row.replaceWith(inFlightRow(run, row.dataset.owner));
    } else {
      body.prepend(inFlightRow(run, run.agent ? person(run.agent.owner) : ""));
    }
    const more = $("#stat-in-flight").textContent.endsWith("+") ? "+" : "";
    $("#stat-in-flight").textContent = String(body.children.length) + more;
  }

  function inFlightRow(run, owner) {
    return el(
      "tr",
      { "data-run-id": run.id, "data-owner": owner },
      el("td", { text: `#${run.id}` }),
      el("td", { text: run.agent ? run.agent.name : "" }),
      el("td", { text: owner }),
      el("td", {}, pill(run.state)),
      el("td", {}, when(run.startedAt || run.createdAt)),
    );
  }

  function order(run) {
    return { QUEUED: 0, RUNNING: 1 }[run.state] ?? 2;
  }

  // --- panels -----------------------------------------------------------------------------------

  async function refreshAll() {
    const work = [refreshOwner()];
    if (state.viewer && state.viewer.isAdmin) work.push(refreshFleet());
    await Promise.all(work);
  }

  async function refreshOwner() {
    const data = await gql(ownerQuery());
    renderAgents(data.viewer.agents);
    renderBudget(data.viewer.budget);
    if (data.approvals) renderApprovals(data.approvals.edges.map((edge) => edge.node));
    for (const agent of data.viewer.agents) {
      for (const run of [agent.lastRun, agent.activeRun]) if (run) upsertFeed(run, agent);
    }
  }

  function renderAgents(agents) {
    state.agents = new Map(agents.map((agent) => [agent.id, agent]));
    const rows = agents.map((agent) => {
      const last = agent.activeRun || agent.lastRun;
      return el(
        "tr",
        { "data-agent-id": agent.id },
        el(
          "td",
          {},
          agent.name,
          agent.adminPauseNote
            ? el("span", { class: "note", text: `paused by an admin: ${agent.adminPauseNote}` })
            : null,
          capsNote(agent),
        ),
        el("td", {}, pill(agent.status)),
        el("td", {}, agent.nextRunAt ? when(agent.nextRunAt) : "–"),
        el(
          "td",
          {},
          last ? pill(last.state) : "–",
          " ",
          last ? when(last.finishedAt || last.createdAt) : "",
          fallbackNote(last),
        ),
        el(
          "td",
          {},
          el("button", {
            type: "button",
            text: "Run now",
            "data-action": "start",
            onclick: () => startRun(agent),
          }),
          retryable(agent)
            ? el("button", {
                type: "button",
                text: "Retry",
                title: "Continue the failed run from its last completed step",
                "data-action": "retry",
                onclick: () => retryRun(agent, agent.lastRun),
              })
            : null,
        ),
      );
    });
    replaceRows($("#agents tbody"), rows);
    $("#agents-empty").hidden = agents.length > 0;
  }

  // The model calls of a run that a fallback model answered (its model was down).
  function fallbackNote(run) {
    if (!run || !run.steps) return null;
    const answered = run.steps.filter((step) => step.kind === "MODEL_CALL" && step.fallback);
    if (answered.length === 0) return null;
    const models = [...new Set(answered.map((step) => step.name))].join(", ");
    const calls = answered.length === 1 ? "1 model call" : `${answered.length} model calls`;
    return el("span", {
      class: "note",
      "data-fallback": "true",
      text: `${calls} answered by the fallback ${models} (its model was down)`,
    });
  }

  // The agent's own caps: its tokens this budget week against its weekly cap, its cap per run.
  function capsNote(agent) {
    if (!state.features.caps) return null;
    const week =
      agent.weeklyTokenCap === null || agent.weeklyTokenCap === undefined
        ? `${number(agent.usedTokensThisWeek)} tokens this week`
        : `${number(agent.usedTokensThisWeek)} of ${number(agent.weeklyTokenCap)} tokens this week`;
    const perRun =
      agent.maxTokensPerRun === null || agent.maxTokensPerRun === undefined
        ? ""
        : `; at most ${number(agent.maxTokensPerRun)} per run`;
    const spent =
      agent.weeklyTokenCap !== null &&
      agent.weeklyTokenCap !== undefined &&
      agent.usedTokensThisWeek >= agent.weeklyTokenCap;
    return el("span", {
      class: "note",
      "data-caps": spent ? "spent" : "open",
      text: week + perRun + (spent ? " (cap reached: starts are skipped)" : ""),
    });
  }

  // A failed run that broke (ERROR or STALE), while nothing else of the agent is unfinished.
  function retryable(agent) {
    const last = agent.lastRun;
    return (
      state.features.retry &&
      !agent.activeRun &&
      last &&
      last.state === "FAILED" &&
      (last.reason === "ERROR" || last.reason === "STALE")
    );
  }

  async function retryRun(agent, run) {
    try {
      const data = await gql(
        `mutation DashboardRetry($id: ID!) { retryRun(runId: $id) { ${RUN_FIELDS} } }`,
        { id: run.id },
      );
      upsertFeed(data.retryRun, agent);
    } catch (error) {
      showError(new Error(`${agent.name}: ${error.message}`));
    }
  }

  async function startRun(agent) {
    try {
      const data = await gql(
        `mutation DashboardStart($id: ID!) { startRun(agentId: $id) { ${RUN_FIELDS} } }`,
        { id: agent.id },
      );
      upsertFeed(data.startRun, agent);
    } catch (error) {
      const lock = error.extensions.lock ? ` (${error.extensions.lock})` : "";
      showError(new Error(`${agent.name}: ${error.message}${lock}`));
    }
  }

  function renderBudget(budget) {
    const bar = $("#budget-bar");
    const used = $("#budget-used");
    const forecast = $("#budget-forecast");
    const cap = budget.capTokens;
    bar.dataset.exceeded = String(!!budget.exceeded);
    if (cap === null || cap === undefined) {
      used.style.width = "0%";
      $("#budget-text").textContent =
        `${number(budget.usedTokens)} tokens used this week (no cap). ` +
        `The week ends ${ago(budget.windowEnd)}.`;
    } else {
      const pct = cap > 0 ? Math.min(100, (budget.usedTokens / cap) * 100) : 100;
      used.style.width = `${pct}%`;
      $("#budget-text").textContent =
        `${number(budget.usedTokens)} of ${number(cap)} tokens used ` +
        `(${number(budget.remainingTokens)} left); the week ends ${ago(budget.windowEnd)}.`;
    }
    const projection = budget.forecast;
    forecast.hidden = !projection;
    $("#budget-forecast-text").hidden = !projection;
    if (projection) {
      const scale = cap ? cap : Math.max(projection.projectedTokens, 1);
      forecast.style.width = `${Math.min(100, (projection.projectedTokens / scale) * 100)}%`;
      const parts = [`Forecast: ${number(projection.projectedTokens)} tokens by the end of the week`];
      if (projection.exhaustsAt) parts.push(`the cap is reached ${ago(projection.exhaustsAt)}`);
      if (projection.agentsWithoutHistory) {
        parts.push(`${projection.agentsWithoutHistory} agent(s) without history left out`);
      }
      $("#budget-forecast-text").textContent = parts.join("; ") + ".";
    }
  }

  async function refreshFleet() {
    const data = await gql(adminQuery());
    for (const { node } of [...data.recent.edges].reverse()) upsertFeed(node, node.agent);
    const inFlight = data.inFlight.edges.map((edge) => edge.node);
    $("#stat-in-flight").textContent =
      String(inFlight.length) + (data.inFlight.pageInfo.hasNextPage ? "+" : "");
    replaceRows(
      $("#in-flight tbody"),
      inFlight.map((run) => inFlightRow(run, person(run.agent.owner))),
    );

    const since = Date.now() - HOUR_MS;
    const recent = data.problems.edges
      .map((edge) => edge.node)
      .filter((run) => run.finishedAt && new Date(run.finishedAt).getTime() >= since);
    const more = data.problems.pageInfo.hasNextPage && recent.length === data.problems.edges.length;
    for (const [stateName, id] of [["FAILED", "#stat-failed"], ["SKIPPED", "#stat-skipped"]]) {
      const count = recent.filter((run) => run.state === stateName).length;
      $(id).textContent = String(count) + (more ? "+" : "");
    }
    replaceRows(
      $("#problems tbody"),
      recent.slice(0, 20).map((run) =>
        el(
          "tr",
          { "data-run-id": run.id },
          el("td", { text: `#${run.id}` }),
          el("td", { text: run.agent.name }),
          el("td", {}, pill(run.state)),
          el("td", { text: run.reason ? run.reason.toLowerCase() : "" }),
          el("td", {}, when(run.finishedAt)),
        ),
      ),
    );

    replaceRows(
      $("#audit tbody"),
      data.adminAuditLog.edges.map(({ node }) =>
        el(
          "tr",
          { "data-audit-id": node.id, "data-action": node.action },
          el("td", {}, when(node.at)),
          el("td", { text: node.actor ? person(node.actor) : "the engine" }),
          el("td", { text: node.action }),
          el("td", { text: node.agentId ? `#${node.agentId}` : "" }),
          el("td", { text: node.userId ? `#${node.userId}` : "" }),
          el("td", { class: "details", text: describe(node.details) }),
        ),
      ),
    );

    if (data.adminSpend) {
      replaceRows(
        $("#spend tbody"),
        data.adminSpend.map((row) =>
          el(
            "tr",
            {},
            el("td", { text: person(row.owner) }),
            el("td", { class: "num", text: number(row.tokens) }),
            el("td", { class: "num", text: row.cost === null ? "–" : row.cost }),
            el("td", { class: "num", text: number(row.runs) }),
          ),
        ),
      );
    }
  }

  // Audit details for people: "note: ticket 42 · weeklyTokenCap: 1000 → 5000".
  function describe(details) {
    if (details === null || details === undefined) return "";
    if (typeof details !== "object") return String(details);
    return Object.entries(details)
      .filter(([, value]) => value !== null && value !== undefined)
      .map(([key, value]) => {
        if (value && typeof value === "object" && "old" in value && "new" in value) {
          return `${key}: ${short(value.old)} → ${short(value.new)}`;
        }
        return `${key}: ${short(value)}`;
      })
      .join(" · ");
  }

  function short(value) {
    const text = typeof value === "string" ? value : JSON.stringify(value);
    return text.length > 80 ? `${text.slice(0, 77)}…` : text;
  }

  function person(user) {
    if (!user) return "";
    return user.displayName || user.email || `user ${user.id}`;
  }

  function showError(error) {
    if (error.code === "UNAUTHENTICATED") {
      // The token expired (or was revoked) while the page was open.
      signOut(`Signed out: ${error.message}`);
      return;
    }
    const notice = $("#notice");
    notice.textContent = error.message;
    notice.hidden = false;
    clearTimeout(showError.timer);
    showError.timer = setTimeout(() => (notice.hidden = true), 8000);
  }

  // A bare token, "Bearer <token>", or the {"Authorization": "Bearer <token>"} header line that
  // `make run` prints for GraphiQL.
  function pastedToken(text) {
    let value = text.trim();
    if (value.startsWith("{")) {
      try {
        const header = JSON.parse(value);
        value = String(header.Authorization || header.authorization || "");
      } catch (_) {
        return "";
      }
    }
    value = value.replace(/^Bearer\s+/i, "").trim();
    return /^[A-Za-z0-9_\-]+\.[A-Za-z0-9_\-]+\.[A-Za-z0-9_\-]*$/.test(value) ? value : "";
  }

  // --- boot -------------------------------------------------------------------------------------

  document.addEventListener("DOMContentLoaded", () => {
    $("#signin-form").addEventListener("submit", (event) => {
      event.preventDefault();
      const input = $("#token");
      const token = pastedToken(input.value);
      input.value = "";
      if (token) start(token);
      else showSignIn("That does not look like a token.");
    });
    $("#signout").addEventListener("click", () => signOut(""));
    const saved = sessionStorage.getItem(TOKEN_KEY);
    if (saved) start(saved);
    else showSignIn("");
  });
})();
