// The identities view (issue 36): who several keys are for, by externalId. Lists them,
// creates one, edits its credits (set, or unlimited) and its named rate limits (as
// JSON), and shows the keys that belong to it.

import { call, can, orgPath } from "./api.js";
import { renderList, saveDialog } from "./listpage.js";
import { field, h, openDialog, showError, table } from "./ui.js";

function creditsText(credits) {
  return credits === null ? "unlimited" : String(credits.remaining);
}

function limitsText(limits) {
  return limits.length === 0 ? "none" : limits.map((l) => `${l.name}: ${l.limit}/${l.windowSeconds}s`).join(", ");
}

// The credits field: a number, or empty for unlimited.
function creditsInput(identity) {
  const value = identity && identity.credits !== null ? String(identity.credits.remaining) : "";
  return h("input", { name: "credits", type: "number", min: 0, step: 1, value, inputMode: "numeric" });
}

function limitsInput(identity) {
  const value = JSON.stringify(identity ? identity.ratelimits : [], null, 1);
  return h("textarea", { name: "ratelimits", rows: 4, spellcheck: false, value });
}

const LIMITS_HELP = 'A JSON array, such as [{"name": "tokens", "limit": 1000, "windowSeconds": 60}].';

function parsedLimits(form) {
  const text = form.elements.ratelimits.value.trim();
  if (text === "") return [];
  try {
    return JSON.parse(text);
  } catch {
    throw new Error("Rate limits: not JSON. " + LIMITS_HELP);
  }
}

function createIdentity(refresh) {
  const externalId = h("input", { name: "externalId", required: true, maxLength: 255, autofocus: true });
  const fields = [
    field("External ID", externalId, "Your own ID for the customer; keys with this externalId share its credits and limits."),
    field("Credits", creditsInput(null), "Empty: unlimited."),
    field("Rate limits", limitsInput(null), LIMITS_HELP),
  ];
  saveDialog(
    "New identity",
    fields,
    "Create identity",
    async (form) => {
      const body = { externalId: form.elements.externalId.value.trim(), ratelimits: parsedLimits(form) };
      const credits = form.elements.credits.value.trim();
      if (credits !== "") body.credits = { remaining: Number(credits) };
      await call("POST", orgPath("/identities"), { body });
      return "Identity created.";
    },
    refresh,
  );
}

function editIdentity(identity, refresh) {
  const fields = [field("Credits", creditsInput(identity), "Empty: unlimited."), field("Rate limits", limitsInput(identity), LIMITS_HELP)];
  saveDialog(
    `Edit identity ${identity.externalId}`,
    fields,
    "Save",
    async (form) => {
      const credits = form.elements.credits.value.trim();
      await call("POST", orgPath(`/identities/${identity.id}/credits`), { body: { set: credits === "" ? null : Number(credits) } });
      await call("PATCH", orgPath(`/identities/${identity.id}`), { body: { ratelimits: parsedLimits(form) } });
      return `Identity ${identity.externalId} saved.`;
    },
    refresh,
  );
}

async function showKeys(identity) {
  let answer;
  try {
    answer = await call("GET", orgPath("/keys"), { query: { limit: 100, externalId: identity.externalId } });
  } catch (error) {
    showError(error);
    return;
  }
  const rows = answer.result.map((key) => [key.name, key.state, key.keySuffix]);
  openDialog(
    `Keys of ${identity.externalId}`,
    h("div", {}, h("p", { className: "count", text: `${answer.totalCount} keys.` }), table(["Name", "State", "Key ID ends"], rows, "Keys of the identity")),
  );
}

function actions(identity, refresh) {
  const buttons = [];
  if (can("keys:read")) buttons.push(h("button", { type: "button", text: "Keys", "data-identity-action": "keys", onclick: () => showKeys(identity) }));
  if (can("identities:write")) buttons.push(h("button", { type: "button", text: "Edit", "data-identity-action": "edit", onclick: () => editIdentity(identity, refresh) }));
  return h("div", { className: "row-actions" }, buttons);
}

function render(container) {
  return renderList(container, {
    title: "Identities",
    path: "/identities",
    noun: "identities",
    columns: ["External ID", "Credits", "Rate limits", "Actions"],
    row: (identity, reload) => [
      h("span", { text: identity.externalId, "data-identity": identity.externalId }),
      creditsText(identity.credits),
      limitsText(identity.ratelimits),
      actions(identity, reload),
    ],
    create: { label: "New identity", needs: "identities:write", open: createIdentity },
  });
}

export default { id: "identities", title: "Identities", needs: "identities:read", render };
