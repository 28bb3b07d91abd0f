// The keys view: a page of keys with a filter, a key's details (with its usage chart,
// usage.js), create (the secret shown once), edit, rotate (the new secret shown once),
// disable/enable and delete. What can be done to a key is the list KEY_ACTIONS.

import { call, can, me, orgPath, switchCredentials } from "./api.js";
import { hashedPair } from "./credentials.js";
import { extraBody, extraFields, extraRows } from "./keyextras.js";
import { allRoles } from "./roles.js";
import {
  Pages,
  clearMessages,
  confirmDialog,
  field,
  formDialog,
  fromLocalInput,
  h,
  openDialog,
  pager,
  showError,
  showNotice,
  table,
  time,
  toLocalInput,
} from "./ui.js";
import { usagePanel } from "./usage.js";

const PAGE_SIZE = 25;
const MAX_GRACE_SECONDS = 30 * 24 * 3600;
const isSelf = (key) => key.id === me().id;
const roleNames = (key) => key.assignedRoles.map((role) => role.roleName);

// One entry per thing that can be done to a key, shown in its details in this order.
// needs: the permission; refusal(key): why it cannot be done to this key, or null;
// run(key, etag, refresh): does it, then calls refresh() to reload the list.
export const KEY_ACTIONS = [
  {
    id: "edit",
    label: () => "Edit",
    needs: "keys:update",
    refusal: () => null,
    run: (key, etag, refresh) => editKey(key, etag, refresh),
  },
  {
    id: "rotate",
    label: () => "Rotate",
    needs: "keys:update",
    refusal: (key) => (key.state === "disabled" ? "A disabled key cannot be rotated: enable it first." : null),
    run: (key, etag, refresh) => rotateKey(key, refresh),
  },
  {
    id: "state",
    label: (key) => (key.state === "enabled" ? "Disable" : "Enable"),
    needs: "keys:update",
    refusal: (key) =>
      isSelf(key) ? "This is the key you signed in with: a key cannot disable itself. Sign in with another key to do it." : null,
    run: async (key, etag, refresh) => {
      const state = key.state === "enabled" ? "disabled" : "enabled";
      await call("PATCH", orgPath(`/keys/${key.id}`), { body: { state }, ifMatch: etag });
      showNotice(`Key ${key.name} is ${state}.`);
      refresh();
    },
  },
  {
    id: "delete",
    label: () => "Delete",
    needs: "keys:delete",
    danger: true,
    refusal: (key) =>
      isSelf(key) ? "This is the key you signed in with: a key cannot delete itself. Sign in with another key to delete it." : null,
    run: async (key, etag, refresh) => {
      const sure = await confirmDialog(
        "Delete key",
        `Delete the key "${key.name}"? Every program using it is refused from its next request. This cannot be undone.`,
        "Delete key",
      );
      if (!sure) return;
      await call("DELETE", orgPath(`/keys/${key.id}`), { ifMatch: etag });
      showNotice(`Key ${key.name} deleted.`);
      refresh();
    },
  },
];

function matches(key, filter) {
  if (filter.name && !key.name.toLowerCase().includes(filter.name.toLowerCase())) return false;
  if (filter.state && key.state !== filter.state) return false;
  if (filter.role && !roleNames(key).includes(filter.role)) return false;
  return true;
}

function ipText(list) {
  if (!list || list.length === 0) return "any address";
  return list.map((entry) => (entry.description ? `${entry.source} (${entry.description})` : entry.source)).join(", ");
}

function details(key) {
  const rows = [
    ["Name", key.name],
    ["State", key.state],
    ["UUID", key.id],
    ["Key ID ends with", key.keySuffix],
    ["Roles", roleNames(key).join(", ") || "none"],
    ["IP access list", ipText(key.ipAccessList)],
    ["Expires", time(key.expireAt)],
    ["Last used", key.usedAt ? time(key.usedAt) : "not yet"],
    ["Rate limit", key.rateLimit ? `${key.rateLimit.limit} requests per ${key.rateLimit.windowSeconds} s` : "the server's"],
    ["Created", time(key.createdAt)],
    ...extraRows(key),
  ];
  if (key.previousCredentialExpiresAt) {
    rows.push(["Previous key ID and secret work until", time(key.previousCredentialExpiresAt)]);
  }
  return h("dl", { className: "details" }, rows.map(([name, value]) => [h("dt", { text: name }), h("dd", { text: value })]));
}

async function showKey(key, refresh) {
  let answer;
  try {
    answer = await call("GET", orgPath(`/keys/${key.id}`));
  } catch (error) {
    showError(error);
    return;
  }
  const fresh = answer.result;
  const buttons = [];
  const reasons = [];
  let dialog = null;
  for (const action of KEY_ACTIONS.filter((a) => can(a.needs))) {
    const refusal = action.refusal(fresh);
    const button = h("button", {
      type: "button",
      className: action.danger ? "danger" : "",
      text: action.label(fresh),
      disabled: refusal !== null,
      "data-action": action.id,
    });
    if (refusal !== null) {
      const reason = h("p", { className: "refusal", id: `why-${action.id}`, text: refusal });
      button.setAttribute("aria-describedby", reason.id);
      reasons.push(reason);
    }
    button.addEventListener("click", async () => {
      try {
        // The dialog closes first: the action may open its own.
        dialog.close();
        await action.run(fresh, answer.etag, refresh);
      } catch (error) {
        showError(error);
      }
    });
    buttons.push(button);
  }
  if (isSelf(fresh)) reasons.unshift(h("p", { className: "notice", text: "You are signed in with this key." }));
  const body = h("div", {}, details(fresh), reasons, h("div", { className: "actions" }, buttons), usagePanel(fresh));
  dialog = openDialog(`Key ${fresh.name}`, body);
}

function roleChoices(roles, chosen, disabled) {
  return h(
    "fieldset",
    { className: "choices", disabled },
    h("legend", { text: "Roles" }),
    roles.map((role) =>
      h(
        "label",
        { className: "choice" },
        h("input", { type: "checkbox", name: "role", value: role.id, checked: chosen.includes(role.id) }),
        ` ${role.name}`,
        h("small", { text: ` ${role.type}: ${role.permissions.join(", ")}` }),
      ),
    ),
  );
}

function ipInput(list) {
  const lines = (list || []).map((entry) => (entry.description ? `${entry.source} ${entry.description}` : entry.source));
  return h("textarea", { name: "ip", rows: 3, spellcheck: false, value: lines.join("\n") });
}

function ipList(text) {
  return text
    .split("\n")
    .map((line) => line.trim())
    .filter((line) => line)
    .map((line) => {
      const [source, ...rest] = line.split(/\s+/);
      const description = rest.join(" ");
      return description ? { source, description } : { source };
    });
}

function keyFields(key, roles, { self = false, creating = false } = {}) {
  const chosen = key ? key.assignedRoles.map((role) => role.roleId) : [];
  const name = h("input", { name: "name", required: true, maxLength: 255, value: key ? key.name : "", autofocus: true });
  const state = h("select", { name: "state", disabled: self }, h("option", { value: "enabled", text: "enabled" }), h("option", { value: "disabled", text: "disabled" }));
  state.value = key ? key.state : "enabled";
  const expire = h("input", { name: "expireAt", type: "datetime-local", value: key ? toLocalInput(key.expireAt) : "", disabled: self });
  const ip = ipInput(key ? key.ipAccessList : []);
  ip.disabled = self;
  return [
    self ? h("p", { className: "notice", text: "You are signed in with this key: a key may change its own name only." }) : null,
    field("Name", name),
    roleChoices(roles, chosen, self),
    field("State", state),
    field("Expires", expire, "Local time. Empty: never expires."),
    field("IP access list", ip, "One address or CIDR per line, optionally followed by a description. Empty: any address."),
    extraFields(key, self),
    creating
      ? h(
          "label",
          { className: "choice" },
          h("input", { type: "checkbox", name: "hashData" }),
          " Make the key ID and secret in this browser (hashData): keysvc receives only their SHA-256 hashes",
        )
      : null,
  ];
}

function formBody(form) {
  return {
    name: form.elements.name.value.trim(),
    assignedRoleIds: [...form.querySelectorAll("input[name=role]:checked")].map((input) => input.value),
    state: form.elements.state.value,
    expireAt: fromLocalInput(form.elements.expireAt.value),
    ipAccessList: ipList(form.elements.ip.value),
    ...extraBody(form),
  };
}

// The roles a key can be given, or null (the error shown) when they cannot be read.
async function rolesOrNull() {
  try {
    return can("roles:read") ? await allRoles() : [];
  } catch (error) {
    showError(error);
    return null;
  }
}

async function createKey(refresh) {
  const roles = await rolesOrNull();
  if (roles === null) return;
  formDialog("New key", keyFields(null, roles, { creating: true }), "Create key", async (form, dialog) => {
    const body = formBody(form);
    for (const name of ["expireAt", "externalId", "meta", "credits"]) if (body[name] === null) delete body[name];
    let pair = null;
    if (form.elements.hashData.checked) {
      pair = await hashedPair();
      body.hashData = pair.hashData;
    }
    const answer = await call("POST", orgPath("/keys"), { body });
    dialog.close();
    const keyId = pair ? pair.keyId : answer.result.keyId;
    const secret = pair ? pair.secret : answer.result.keySecret;
    pair = null;
    showSecret(answer.result.key, keyId, secret, "Key created");
    refresh();
  });
}

function rotateFields(key, self) {
  const grace = h("input", { name: "grace", type: "number", min: 0, max: MAX_GRACE_SECONDS, step: 1, value: "0", required: true, autofocus: true });
  return [
    h("p", {
      text: `The key gets a new key ID and secret; its name, roles, IP access list, rate limit and expiry stay. Programs using "${key.name}" need the new pair.`,
    }),
    self
      ? h("p", {
          className: "notice",
          text: "You are signed in with this key: the console switches to its new key ID and secret (kept in this tab's memory only) and shows them once.",
        })
      : null,
    field(
      "Grace period (seconds)",
      grace,
      "How long the current key ID and secret keep working: 0 (they stop at once) to 2592000 (30 days). 3600 is an hour, 86400 a day.",
    ),
    h(
      "label",
      { className: "choice" },
      h("input", { type: "checkbox", name: "hashData" }),
      " Make the new key ID and secret in this browser (hashData): keysvc receives only their SHA-256 hashes",
    ),
  ];
}

async function rotateKey(key, refresh) {
  const self = isSelf(key);
  formDialog(`Rotate key ${key.name}`, rotateFields(key, self), "Rotate key", async (form, dialog) => {
    const body = { gracePeriodSeconds: Number(form.elements.grace.value) };
    let pair = null;
    if (form.elements.hashData.checked) {
      pair = await hashedPair();
      body.hashData = pair.hashData;
    }
    const answer = await call("POST", orgPath(`/keys/${key.id}/rotate`), { body });
    const keyId = pair ? pair.keyId : answer.result.keyId;
    const secret = pair ? pair.secret : answer.result.keySecret;
    pair = null;
    // Its old pair may stop at once: the console's next call must use the new one.
    if (self) switchCredentials(keyId, secret);
    dialog.close();
    const until = answer.result.key.previousCredentialExpiresAt;
    const notes = [
      until ? `The previous key ID and secret work until ${time(until)}.` : "The previous key ID and secret no longer work.",
      self ? "This is the key you are signed in with: the console now uses the new key ID and secret, in this tab's memory only." : null,
    ];
    showSecret(answer.result.key, keyId, secret, "Key rotated", notes);
    if (self) showNotice("You rotated the key you are signed in with: the console now uses its new key ID and secret.");
    refresh();
  });
}

function copyButton(label, target) {
  const button = h("button", { type: "button", text: label });
  button.addEventListener("click", async () => {
    try {
      await navigator.clipboard.writeText(target.textContent);
      button.textContent = "Copied";
    } catch {
      // No clipboard (an insecure context): select the text for Ctrl+C instead.
      window.getSelection().selectAllChildren(target);
      button.textContent = "Selected: press Ctrl+C";
    }
  });
  return button;
}

// The new credentials, this once, with any notes. Closing the dialog removes them
// from the page.
function showSecret(key, keyId, secret, title, notes = []) {
  const idNode = h("code", { id: "new-key-id", text: keyId });
  const secretNode = h("code", { id: "new-key-secret", text: secret });
  const done = h("button", { type: "button", className: "primary", text: "I have stored the secret" });
  const body = h(
    "div",
    {},
    h("p", { className: "warning", text: "Copy the secret now: it is shown this once. keysvc keeps only a hash of it and cannot show it again. Anyone holding the key ID and secret can act as this key." }),
    notes.filter((note) => note).map((note) => h("p", { className: "notice", text: note })),
    h("dl", { className: "details" }, h("dt", { text: "Key" }), h("dd", { text: key.name }), h("dt", { text: "Key ID" }), h("dd", {}, idNode, " ", copyButton("Copy key ID", idNode)), h("dt", { text: "Secret" }), h("dd", {}, secretNode, " ", copyButton("Copy secret", secretNode))),
    h("div", { className: "actions" }, done),
  );
  const dialog = openDialog(title, body, {
    className: "secret",
    onClose: () => {
      idNode.textContent = "";
      secretNode.textContent = "";
    },
  });
  done.addEventListener("click", () => dialog.close());
}

async function editKey(key, etag, refresh) {
  const self = isSelf(key);
  const roles = await rolesOrNull();
  if (roles === null) return;
  formDialog(`Edit key ${key.name}`, keyFields(key, roles, { self }), "Save", async (form, dialog) => {
    const wanted = formBody(form);
    const was = formBody(h("form", {}, keyFields(key, roles)));
    // Only what changed: a key may rename itself and nothing else.
    const body = {};
    for (const [name, value] of Object.entries(wanted)) {
      if (JSON.stringify(value) !== JSON.stringify(was[name]) && !(self && name !== "name")) body[name] = value;
    }
    if (Object.keys(body).length > 0) {
      await call("PATCH", orgPath(`/keys/${key.id}`), { body, ifMatch: etag });
      showNotice(`Key ${wanted.name} saved.`);
    }
    dialog.close();
    refresh();
  });
}

function filterBar(keys, filter, apply, byExternalId) {
  const name = h("input", { type: "search", value: filter.name, placeholder: "part of a name" });
  const external = h("input", { type: "search", value: filter.externalId, placeholder: "exactly", "data-filter": "externalId" });
  external.addEventListener("change", () => byExternalId(external.value.trim()));
  const state = h("select", {}, h("option", { value: "", text: "any" }), h("option", { value: "enabled", text: "enabled" }), h("option", { value: "disabled", text: "disabled" }));
  state.value = filter.state;
  const roleSet = [...new Set(keys.flatMap(roleNames))].sort();
  const role = h("select", {}, h("option", { value: "", text: "any" }), roleSet.map((r) => h("option", { value: r, text: r })));
  role.value = filter.role;
  name.addEventListener("input", () => apply({ name: name.value }));
  state.addEventListener("change", () => apply({ state: state.value }));
  role.addEventListener("change", () => apply({ role: role.value }));
  return h(
    "div",
    { className: "filters", role: "search" },
    field("Name", name),
    field("State", state),
    field("Role", role),
    field("External ID", external, "Every page: only the keys with this externalId."),
  );
}

async function render(container) {
  const pages = new Pages();
  const filter = { name: "", state: "", role: "", externalId: "" };
  const listArea = h("div", {});
  let keys = [];
  let answer = null;

  const draw = () => {
    const shown = keys.filter((key) => matches(key, filter));
    const rows = shown.map((key) => [
      h("button", { type: "button", className: "link", text: key.name, onclick: () => showKey(key, load), "data-key": key.id }),
      h("span", { className: `state ${key.state}`, text: key.state }),
      roleNames(key).join(", "),
      `…${key.keySuffix}`,
      key.usedAt ? time(key.usedAt) : "not yet",
      time(key.expireAt),
    ]);
    listArea.replaceChildren(
      h("p", { className: "count", text: `${shown.length} of ${keys.length} keys on this page; ${answer.totalCount} in the organization. The filter applies to this page.` }),
      table(["Name", "State", "Roles", "Key ID", "Last used", "Expires"], rows, "Keys"),
      pager(pages, answer.nextCursor, load),
    );
  };
  const apply = (change) => {
    Object.assign(filter, change);
    draw();
  };
  const filters = h("div", {});

  async function load() {
    try {
      const query = { limit: PAGE_SIZE, cursor: pages.cursor };
      if (filter.externalId) query.externalId = filter.externalId;
      answer = await call("GET", orgPath("/keys"), { query });
    } catch (error) {
      showError(error);
      return;
    }
    keys = answer.result;
    const byExternalId = (value) => {
      filter.externalId = value;
      pages.reset();
      load();
    };
    filters.replaceChildren(filterBar(keys, filter, apply, byExternalId));
    draw();
  }

  const create = can("keys:create") ? h("button", { type: "button", className: "primary", text: "New key", onclick: () => createKey(load) }) : null;
  container.replaceChildren(h("div", { className: "toolbar" }, h("h2", { text: "Keys" }), create), filters, listArea);
  clearMessages();
  await load();
}

export default { id: "keys", title: "Keys", needs: "keys:read", render };
