// The roles view: system and custom roles, and a custom role's create, edit and
// delete. A role that keys still hold cannot be deleted (409): the view says so.

import { call, can, orgPath } from "./api.js";
import { renderList, saveDialog } from "./listpage.js";
import { confirmDialog, field, h, showError, showNotice } from "./ui.js";

// The management API's own permissions, offered as boxes; any other goes in the text field.
const MANAGEMENT = [
  "keys:read",
  "keys:create",
  "keys:update",
  "keys:delete",
  "roles:read",
  "roles:write",
  "activities:read",
  "webhooks:read",
  "webhooks:write",
  "identities:read",
  "identities:write",
];

// Every role of the organization, page after page (for the key form's choices).
export async function allRoles() {
  const roles = [];
  let cursor = null;
  do {
    const answer = await call("GET", orgPath("/roles"), { query: { limit: 250, cursor } });
    roles.push(...answer.result);
    cursor = answer.nextCursor;
  } while (cursor);
  return roles;
}

function roleFields(role) {
  const held = role ? role.permissions : [];
  const name = h("input", { name: "name", required: true, maxLength: 255, value: role ? role.name : "", autofocus: true });
  const others = h("textarea", {
    name: "other",
    rows: 3,
    spellcheck: false,
    value: held.filter((p) => !MANAGEMENT.includes(p)).join("\n"),
  });
  return [
    field("Name", name),
    h(
      "fieldset",
      { className: "choices" },
      h("legend", { text: "Permissions" }),
      MANAGEMENT.map((permission) =>
        h("label", { className: "choice" }, h("input", { type: "checkbox", name: "permission", value: permission, checked: held.includes(permission) }), ` ${permission}`),
      ),
    ),
    field("Other permissions", others, "One per line, as namespace:action (reports:read) or namespace:* for all of a namespace."),
  ];
}

function roleBody(form) {
  const boxes = [...form.querySelectorAll("input[name=permission]:checked")].map((input) => input.value);
  const others = form.elements.other.value
    .split(/[\s,]+/)
    .map((p) => p.trim())
    .filter((p) => p);
  return { name: form.elements.name.value.trim(), permissions: [...boxes, ...others] };
}

function createRole(refresh) {
  saveDialog(
    "New role",
    roleFields(null),
    "Create role",
    async (form) => {
      await call("POST", orgPath("/roles"), { body: roleBody(form) });
      return "Role created.";
    },
    refresh,
  );
}

function editRole(role, refresh) {
  saveDialog(
    `Edit role ${role.name}`,
    roleFields(role),
    "Save",
    async (form) => {
      const wanted = roleBody(form);
      const body = {};
      if (wanted.name !== role.name) body.name = wanted.name;
      if (JSON.stringify([...wanted.permissions].sort()) !== JSON.stringify([...role.permissions].sort())) {
        body.permissions = wanted.permissions;
      }
      if (Object.keys(body).length > 0) await call("PATCH", orgPath(`/roles/${role.id}`), { body });
      return `Role ${wanted.name} saved.`;
    },
    refresh,
  );
}

async function deleteRole(role, refresh) {
  const sure = await confirmDialog("Delete role", `Delete the role "${role.name}"?`, "Delete role");
  if (!sure) return;
  try {
    await call("DELETE", orgPath(`/roles/${role.id}`));
  } catch (error) {
    if (error.status === 409) {
      error.hint = "Keys still hold this role. Take it off those keys first (Keys, then Edit on each), then delete it.";
    }
    showError(error);
    return;
  }
  showNotice(`Role ${role.name} deleted.`);
  refresh();
}

function roleActions(role, refresh) {
  if (role.type !== "custom" || !can("roles:write")) return role.type === "system" ? "built in" : "";
  return h(
    "div",
    { className: "row-actions" },
    h("button", { type: "button", text: "Edit", "data-role-action": "edit", onclick: () => editRole(role, refresh) }),
    h("button", { type: "button", className: "danger", text: "Delete", "data-role-action": "delete", onclick: () => deleteRole(role, refresh) }),
  );
}

function render(container) {
  return renderList(container, {
    title: "Roles",
    path: "/roles",
    noun: "roles",
    columns: ["Name", "Type", "Permissions", "Keys holding it", "Actions"],
    row: (role, reload) => [
      h("span", { text: role.name, "data-role": role.name }),
      role.type,
      role.permissions.join(", "),
      String(role.actors.length),
      roleActions(role, reload),
    ],
    create: { label: "New role", needs: "roles:write", open: createRole },
  });
}

export default { id: "roles", title: "Roles", needs: "roles:read", render };
