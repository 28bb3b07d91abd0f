// The one client of keysvc's public API, and the only holder of the signed-in
// credentials: a module-scoped variable, never written to storage or to a cookie.
// Every call sends them as Basic auth; the console has no endpoint of its own.

let authorization = null;
let caller = null;

// An API error: the envelope's message and requestId, as the server sent them.
export class ApiError extends Error {
  constructor(status, message, requestId) {
    super(message);
    this.status = status;
    this.requestId = requestId;
  }
}

function basic(keyId, secret) {
  const bytes = new TextEncoder().encode(`${keyId}:${secret}`);
  let binary = "";
  for (const byte of bytes) binary += String.fromCharCode(byte);
  return `Basic ${btoa(binary)}`;
}

// Relative to the page, so the console works under a proxy's path prefix too.
function url(path, query) {
  const target = new URL(path.replace(/^\//, ""), document.baseURI);
  for (const [name, value] of Object.entries(query || {})) {
    if (value !== undefined && value !== null) target.searchParams.set(name, value);
  }
  return target;
}

async function send(header, method, path, { body, query, ifMatch } = {}) {
  const headers = { Accept: "application/json", Authorization: header };
  if (body !== undefined) headers["Content-Type"] = "application/json";
  if (ifMatch) headers["If-Match"] = ifMatch;
  let response;
  try {
    // credentials "omit": no cookie, and no browser login prompt on a 401.
    response = await fetch(url(path, query), {
      method,
      headers,
      body: body === undefined ? undefined : JSON.stringify(body),
      credentials: "omit",
      cache: "no-store",
    });
  } catch (error) {
    throw new ApiError(0, `keysvc did not answer: ${error.message}`, null);
  }
  let envelope = null;
  try {
    envelope = await response.json();
  } catch {
    envelope = null;
  }
  const requestId = (envelope && envelope.requestId) || response.headers.get("X-Request-Id");
  if (!response.ok || envelope === null) {
    const message = (envelope && envelope.error) || `HTTP ${response.status} with no JSON body`;
    throw new ApiError(response.status, message, requestId);
  }
  return { ...envelope, etag: response.headers.get("ETag") };
}

// Checks the pair with /v1/whoami and keeps it only if it is accepted.
export async function signIn(keyId, secret) {
  const header = basic(keyId, secret);
  const answer = await send(header, "GET", "/v1/whoami");
  authorization = header;
  caller = answer.result;
  return caller;
}

// After the signed-in key rotated itself: its new pair replaces the old one, in the
// same variable, and the old one is forgotten.
export function switchCredentials(keyId, secret) {
  if (!caller) throw new ApiError(401, "signed out: sign in again", null);
  authorization = basic(keyId, secret);
}

export function signOut() {
  authorization = null;
  caller = null;
}

// The signed-in key: {id, name, organizationId, assignedRoles, permissions}.
export function me() {
  return caller;
}

// keysvc's rule (keysvc/permissions.py): the permission, "*", or its namespace's "ns:*".
export function can(permission) {
  if (!caller) return false;
  const held = caller.permissions;
  const namespace = permission.split(":")[0];
  return held.includes(permission) || held.includes("*") || held.includes(`${namespace}:*`);
}

export function orgPath(rest) {
  return `/v1/organizations/${caller.organizationId}${rest}`;
}

export async function call(method, path, options) {
  if (!authorization) throw new ApiError(401, "signed out: sign in again", null);
  return send(authorization, method, path, options);
}
