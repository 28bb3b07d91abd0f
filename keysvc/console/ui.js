// DOM helpers every view shares: building elements, showing an API error, modal
// dialogs (focus kept inside, Escape closes, removed from the page when closed),
// confirmation, times, and a list's pages by cursor. No innerHTML: every text the
// API sends is set as text.

export function h(tag, props = {}, ...children) {
  const element = document.createElement(tag);
  for (const [name, value] of Object.entries(props)) {
    if (value === undefined || value === null || value === false) continue;
    if (name.startsWith("on")) element.addEventListener(name.slice(2), value);
    else if (name === "text") element.textContent = value;
    else if (name in element && name !== "list") element[name] = value;
    else element.setAttribute(name, value === true ? "" : value);
  }
  for (const child of children.flat(Infinity)) {
    if (child === null || child === undefined || child === false) continue;
    element.append(child instanceof Node ? child : String(child));
  }
  return element;
}

// An error as the API answered it: status, message and requestId.
export function errorNode(error) {
  const status = error.status ? `HTTP ${error.status}` : "Error";
  return h(
    "div",
    { className: "error" },
    h("strong", { text: `${status}: ` }),
    h("span", { className: "error-message", text: error.message }),
    error.requestId ? h("small", { className: "request-id", text: `requestId ${error.requestId}` }) : null,
    error.hint ? h("p", { className: "hint", text: error.hint }) : null,
  );
}

const messages = () => document.getElementById("messages");

export function showError(error, where = messages()) {
  where.replaceChildren(errorNode(error));
}

export function showNotice(text) {
  messages().replaceChildren(h("div", { className: "notice", text }));
}

export function clearMessages() {
  messages().replaceChildren();
}

const FOCUSABLE = "button:not([disabled]), input:not([disabled]), select:not([disabled]), textarea:not([disabled]), a[href], [tabindex]:not([tabindex='-1'])";

// A modal dialog holding ``content``. showModal makes the page behind it inert;
// Tab and Shift+Tab also wrap inside it, and Escape closes it. Once closed it is
// removed from the page, with whatever it showed.
export function openDialog(title, content, { onClose, className } = {}) {
  const heading = h("h2", { id: `dialog-title-${crypto.randomUUID()}`, text: title });
  const close = h("button", { type: "button", className: "close", text: "Close", ariaLabel: "Close dialog" });
  const dialog = h("dialog", { className: className || "" }, h("div", { className: "dialog-head" }, heading, close), content);
  dialog.setAttribute("aria-labelledby", heading.id);
  close.addEventListener("click", () => dialog.close());
  dialog.addEventListener("keydown", (event) => {
    if (event.key !== "Tab") return;
    const focusable = [...dialog.querySelectorAll(FOCUSABLE)];
    if (focusable.length === 0) return;
    const first = focusable[0];
    const last = focusable[focusable.length - 1];
    if (event.shiftKey && document.activeElement === first) {
      last.focus();
      event.preventDefault();
    } else if (!event.shiftKey && document.activeElement === last) {
      first.focus();
      event.preventDefault();
    }
  });
  const opener = document.activeElement;
  dialog.addEventListener("close", () => {
    dialog.remove();
    if (onClose) onClose();
    if (opener && opener.isConnected) opener.focus();
  });
  document.body.append(dialog);
  dialog.showModal();
  const first = content.querySelector("[autofocus]") || content.querySelector(FOCUSABLE);
  if (first) first.focus();
  return dialog;
}

export function closeAllDialogs() {
  for (const dialog of document.querySelectorAll("dialog")) {
    dialog.close();
    dialog.remove();
  }
}

// Resolves true when the user confirms, false when they cancel or press Escape.
export function confirmDialog(title, text, confirmLabel) {
  return new Promise((resolve) => {
    let confirmed = false;
    const cancel = h("button", { type: "button", text: "Cancel", autofocus: true });
    const confirm = h("button", { type: "button", className: "danger", text: confirmLabel });
    const body = h("div", {}, h("p", { text }), h("div", { className: "actions" }, cancel, confirm));
    const dialog = openDialog(title, body, { onClose: () => resolve(confirmed) });
    cancel.addEventListener("click", () => dialog.close());
    confirm.addEventListener("click", () => {
      confirmed = true;
      dialog.close();
    });
  });
}

// A form in a dialog: ``submit`` gets the form and returns once done; an API
// error it throws is shown inside the dialog, which stays open.
export function formDialog(title, fields, submitLabel, submit) {
  const errors = h("div", { className: "dialog-errors", role: "alert" });
  const button = h("button", { type: "submit", className: "primary", text: submitLabel });
  const form = h("form", { className: "form", noValidate: false }, fields, errors, h("div", { className: "actions" }, button));
  const dialog = openDialog(title, form);
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    button.disabled = true;
    errors.replaceChildren();
    try {
      await submit(form, dialog);
    } catch (error) {
      showError(error, errors);
    } finally {
      button.disabled = false;
    }
  });
  return dialog;
}

export function field(label, input, help) {
  const id = input.id || `field-${crypto.randomUUID()}`;
  input.id = id;
  const helpNode = help ? h("small", { className: "help", id: `${id}-help`, text: help }) : null;
  if (helpNode) input.setAttribute("aria-describedby", helpNode.id);
  return h("div", { className: "field" }, h("label", { htmlFor: id, text: label }), input, helpNode);
}

export function time(iso) {
  if (!iso) return "never";
  return new Date(iso).toLocaleString(undefined, { dateStyle: "medium", timeStyle: "short" });
}

// ISO (UTC) to an <input type="datetime-local"> value in local time, and back.
export function toLocalInput(iso) {
  if (!iso) return "";
  const date = new Date(iso);
  const pad = (n) => String(n).padStart(2, "0");
  return `${date.getFullYear()}-${pad(date.getMonth() + 1)}-${pad(date.getDate())}T${pad(date.getHours())}:${pad(date.getMinutes())}`;
}

export function fromLocalInput(value) {
  return value ? new Date(value).toISOString() : null;
}

// A table whose rows become labelled blocks on a narrow screen (console.css).
export function table(columns, rows, caption) {
  return h(
    "div",
    { className: "table-wrap" },
    h(
      "table",
      {},
      h("caption", { className: "visually-hidden", text: caption }),
      h("thead", {}, h("tr", {}, columns.map((column) => h("th", { scope: "col", text: column })))),
      h(
        "tbody",
        {},
        rows.map((cells) =>
          h(
            "tr",
            {},
            cells.map((cell, index) => h("td", { "data-label": columns[index] }, cell)),
          ),
        ),
      ),
    ),
  );
}

// The pages of a list the API answers by cursor: where we are, and the way back.
export class Pages {
  constructor() {
    this.cursors = [null];
  }

  get cursor() {
    return this.cursors[this.cursors.length - 1];
  }

  get number() {
    return this.cursors.length;
  }

  forward(nextCursor) {
    this.cursors.push(nextCursor);
  }

  back() {
    if (this.cursors.length > 1) this.cursors.pop();
  }

  reset() {
    this.cursors = [null];
  }
}

export function pager(pages, nextCursor, reload) {
  const previous = h("button", { type: "button", text: "Previous page", disabled: pages.number === 1 });
  const next = h("button", { type: "button", text: "Next page", disabled: !nextCursor });
  previous.addEventListener("click", () => {
    pages.back();
    reload();
  });
  next.addEventListener("click", () => {
    pages.forward(nextCursor);
    reload();
  });
  return h("div", { className: "pager" }, previous, h("span", { text: `Page ${pages.number}` }), next);
}
