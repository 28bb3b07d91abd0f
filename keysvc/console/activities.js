// The activities view: the organization's activity log (GET .../activities), a page
// at a time in the API's order (oldest first), filtered by dates, each activity's
// before and after values in a dialog. It asks for every record (include=keysvc), role
// and webhook events included. The view is listed for every key: one without
// activities:read sees the API's 403 (message and requestId) in the view itself.

import { call, me, orgPath } from "./api.js";
import { Pages, clearMessages, errorNode, field, fromLocalInput, h, openDialog, pager, table, time } from "./ui.js";

const PAGE_SIZE = 50;

function typeText(activity) {
  return activity.keyUpdateType ? `${activity.type}: ${activity.keyUpdateType}` : activity.type;
}

function actorText(activity, names) {
  if (activity.actorType !== "api") return `${activity.actorType}${activity.actorDetails ? ` (${activity.actorDetails})` : ""}`;
  const self = activity.actorId === me().id ? " (you)" : "";
  const name = names.get(activity.actorId);
  return `key ${name ? `"${name}" ` : ""}${activity.actorId}${self}`;
}

function targetText(activity, names) {
  if (activity.targetKeyId) {
    const name = names.get(activity.targetKeyId);
    return `key ${name ? `"${name}" ` : ""}${activity.targetKeyId}`;
  }
  if (activity.targetRoleId) {
    const name = names.get(activity.targetRoleId);
    return `role ${name ? `"${name}" ` : ""}${activity.targetRoleId}`;
  }
  const webhook = (activity.after || activity.before || {}).webhookId;
  if (webhook) return `webhook ${webhook}`;
  return "";
}

// Names the page's own values reveal (a create's or a rename's), for its IDs.
function namesOf(activities) {
  const names = new Map();
  for (const activity of activities) {
    const target = activity.targetKeyId || activity.targetRoleId;
    for (const values of [activity.before, activity.after]) {
      if (target && values && typeof values.name === "string") names.set(target, values.name);
    }
  }
  const caller = me();
  names.set(caller.id, caller.name);
  return names;
}

const shown = (value) => (value === undefined ? "" : JSON.stringify(value, null, 1));

function showChanges(activity) {
  const before = activity.before || {};
  const after = activity.after || {};
  const fields = [...new Set([...Object.keys(before), ...Object.keys(after)])];
  const rows = fields.map((name) => [name, h("code", { text: shown(before[name]) }), h("code", { text: shown(after[name]) })]);
  const facts = [
    ["Time", time(activity.createdAt)],
    ["Type", typeText(activity)],
    ["Actor address", activity.actorIpAddress || ""],
    ["User agent", activity.userAgent || ""],
    ["Activity ID", activity.id],
  ];
  openDialog(
    `Activity ${typeText(activity)}`,
    h(
      "div",
      {},
      h("dl", { className: "details" }, facts.map(([name, value]) => [h("dt", { text: name }), h("dd", { text: value })])),
      fields.length > 0 ? table(["Field", "Before", "After"], rows, "Values before and after") : h("p", { text: "No values recorded." }),
    ),
  );
}

async function render(container) {
  const pages = new Pages();
  const dates = { from_date: null, to_date: null };
  const listArea = h("div", {});

  async function load() {
    let answer;
    try {
      answer = await call("GET", orgPath("/activities"), { query: { limit: PAGE_SIZE, cursor: pages.cursor, include: "keysvc", ...dates } });
    } catch (error) {
      if (error.status === 403) error.hint = "Reading activities needs the activities:read permission: sign in with a key whose role grants it (admin does).";
      listArea.replaceChildren(errorNode(error));
      return;
    }
    const names = namesOf(answer.result);
    const rows = answer.result.map((activity) => [
      time(activity.createdAt),
      h("span", { text: typeText(activity), "data-type": activity.type }),
      actorText(activity, names),
      h("span", { text: targetText(activity, names), "data-target": activity.targetKeyId || activity.targetRoleId || "" }),
      h("button", { type: "button", text: "Before and after", onclick: () => showChanges(activity), "data-activity": activity.id }),
    ]);
    listArea.replaceChildren(
      h("p", { className: "count", text: `${answer.totalCount} activities${dates.from_date || dates.to_date ? " between these dates" : ""}, oldest first.` }),
      table(["Time", "Type", "Actor", "Target", "Values"], rows, "Activities"),
      pager(pages, answer.nextCursor, load),
    );
  }

  const from = h("input", { type: "datetime-local", name: "from" });
  const to = h("input", { type: "datetime-local", name: "to" });
  const filters = h(
    "form",
    { className: "filters dates", role: "search" },
    field("From", from, "Local time, included."),
    field("To", to, "Local time, included."),
    h("div", { className: "actions" }, h("button", { type: "submit", text: "Show" })),
  );
  filters.addEventListener("submit", (event) => {
    event.preventDefault();
    dates.from_date = fromLocalInput(from.value);
    dates.to_date = fromLocalInput(to.value);
    pages.reset();
    load();
  });
  container.replaceChildren(h("div", { className: "toolbar" }, h("h2", { text: "Activities" })), filters, listArea);
  clearMessages();
  await load();
}

// needs null: listed for every key, so that one without activities:read learns why.
export default { id: "activities", title: "Activities", needs: null, render };
