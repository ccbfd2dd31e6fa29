// The GraphQL-over-HTTP spec's own audit suite (graphql-http's `auditServer`) against a running
// api. Usage: node graphql_http_audit.mjs URL  (the bearer token in AGENT_ENGINE_AUDIT_TOKEN).
// Prints one JSON object: how many audits passed, warned and failed, and the ones that did not
// pass with their reasons. Run by tests/e2e/test_graphql_http_audit.py.
import { auditServer } from 'graphql-http';

const [url] = process.argv.slice(2);
const token = process.env.AGENT_ENGINE_AUDIT_TOKEN;
if (!url || !token) {
  console.error('usage: AGENT_ENGINE_AUDIT_TOKEN=… node graphql_http_audit.mjs URL');
  process.exit(2);
}

// Every audit request carries the token, as any client of this API does.
function fetchWithToken(input, init = {}) {
  const headers = new Headers(init.headers);
  headers.set('authorization', `Bearer ${token}`);
  return fetch(input, { ...init, headers });
}

const results = await auditServer({ url, fetchFn: fetchWithToken });
const summary = { ok: 0, warn: 0, error: 0, notOk: [] };
for (const result of results) {
  summary[result.status] += 1;
  if (result.status !== 'ok') {
    summary.notOk.push({ id: result.id, name: result.name, status: result.status, reason: result.reason });
  }
}
console.log(JSON.stringify(summary, null, 2));
