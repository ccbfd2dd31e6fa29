// A real OpenID provider (npm `oidc-provider`, OpenID-certified) on 127.0.0.1, for
// tests/e2e/test_oidc_provider.py. It issues RFC 9068 JWT access tokens (`typ: at+jwt`) for one
// resource -- the api's audience -- and ID tokens to a web client, signing with an RSA key
// published without `alg` (RS*/PS*), a P-384 key and an Ed25519 key:
//
//   - service clients (client_credentials), one per algorithm: `ps256-service`, `es384-service`,
//     `eddsa-service`, whose tokens carry the employee id 42, 43, 44;
//   - `web-app` (authorization code with PKCE), signed in as employee 41 without a login page:
//     the interaction is finished at once with a grant for `openid email employee` and the
//     resource's `api:read`.
//
// Usage: node provider.mjs <audience>. Prints one JSON line {"issuer": ...} once it listens.
import { generateKeyPairSync } from 'node:crypto';
import { createServer } from 'node:http';
import Provider from 'oidc-provider';

const AUDIENCE = process.argv[2];
if (!AUDIENCE) {
  console.error('usage: node provider.mjs <audience>');
  process.exit(2);
}

const SERVICES = {
  'ps256-service': { alg: 'PS256', employee: '42' },
  'es384-service': { alg: 'ES384', employee: '43' },
  'eddsa-service': { alg: 'EdDSA', employee: '44' },
};
const WEB_APP = 'web-app';
const WEB_ALG = 'PS256';
const USER = '41';
const REDIRECT_URI = 'http://127.0.0.1/callback';

function privateJwk(type, kid, options) {
  const { privateKey } = generateKeyPairSync(type, options);
  // No `alg` on the keys: the provider picks a key by its type, as many publish them.
  return { ...privateKey.export({ format: 'jwk' }), kid, use: 'sig' };
}

const keys = [
  privateJwk('rsa', 'rsa-1', { modulusLength: 2048 }),
  privateJwk('ec', 'p384-1', { namedCurve: 'P-384' }),
  privateJwk('ed25519', 'ed25519-1'),
];

const server = createServer();
await new Promise((resolve) => { server.listen(0, '127.0.0.1', resolve); });
const issuer = `http://127.0.0.1:${server.address().port}`;

const provider = new Provider(issuer, {
  clients: [
    ...Object.keys(SERVICES).map((clientId) => ({
      client_id: clientId,
      client_secret: `${clientId}-secret`,
      grant_types: ['client_credentials'],
      response_types: [],
      redirect_uris: [],
    })),
    {
      client_id: WEB_APP,
      client_secret: `${WEB_APP}-secret`,
      grant_types: ['authorization_code'],
      response_types: ['code'],
      redirect_uris: [REDIRECT_URI],
      id_token_signed_response_alg: WEB_ALG,
    },
  ],
  jwks: { keys },
  enabledJWA: {
    idTokenSigningAlgValues: ['RS256', 'PS256', 'ES384', 'EdDSA'],
  },
  cookies: { keys: ['a-test-cookie-key-of-no-value'] },
  claims: { openid: ['sub'], email: ['email'], employee: ['employee_id'] },
  scopes: ['openid', 'email', 'employee'],
  // ID tokens carry the scopes' claims (employee_id included): refused for what they are, not
  // for a missing user id.
  conformIdTokenClaims: false,
  async findAccount(ctx, id) {
    return {
      accountId: id,
      async claims() {
        return { sub: id, email: `employee-${id}@example.com`, employee_id: id };
      },
    };
  },
  features: {
    devInteractions: { enabled: false },
    clientCredentials: { enabled: true },
    resourceIndicators: {
      enabled: true,
      defaultResource: () => AUDIENCE,
      useGrantedResource: () => true,
      getResourceServerInfo(ctx, resourceIndicator, client) {
        if (resourceIndicator !== AUDIENCE) {
          throw new Error(`unknown resource ${resourceIndicator}`);
        }
        const alg = SERVICES[client.clientId]?.alg ?? WEB_ALG;
        return {
          scope: 'api:read',
          audience: AUDIENCE,
          accessTokenFormat: 'jwt',
          accessTokenTTL: 600,
          jwt: { sign: { alg } },
        };
      },
    },
  },
  formats: {
    customizers: {
      // The api reads the user id from `employee_id` (a service's `sub` is its client id).
      async jwt(ctx, token, jwt) {
        jwt.payload.employee_id = token.accountId ?? SERVICES[token.clientId]?.employee;
      },
    },
  },
  interactions: { url: (ctx, interaction) => `/interaction/${interaction.uid}` },
  ttl: { IdToken: 600, AccessToken: 600, AuthorizationCode: 60, Interaction: 600 },
});

// Sign employee 41 in and consent at once: the tests drive the code flow without a browser.
provider.use(async (ctx, next) => {
  if (!ctx.path.startsWith('/interaction/')) {
    await next();
    return;
  }
  const details = await provider.interactionDetails(ctx.req, ctx.res);
  const grant = details.grantId
    ? await provider.Grant.find(details.grantId)
    : new provider.Grant({ accountId: USER, clientId: details.params.client_id });
  grant.addOIDCScope('openid email employee');
  grant.addResourceScope(AUDIENCE, 'api:read');
  const grantId = await grant.save();
  const result = { login: { accountId: USER }, consent: { grantId } };
  ctx.redirect(await provider.interactionResult(ctx.req, ctx.res, result, {
    mergeWithLastSubmission: false,
  }));
});

provider.on('server_error', (ctx, error) => { console.error('server_error', error); });

server.on('request', provider.callback());
process.stdout.write(`${JSON.stringify({ issuer })}\n`);
process.on('SIGTERM', () => { server.close(); process.exit(0); });
