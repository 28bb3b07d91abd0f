// What the roles and identities views share: a list page (its heading, a create
// button for a caller who may write, the count, the table and the pager), and a form
// dialog that saves through the API, then closes, says so and loads the list again.

import { call, can, orgPath } from "./api.js";
import { Pages, clearMessages, formDialog, h, pager, showError, showNotice, table } from "./ui.js";

const PAGE_SIZE = 50;

// The list at ``path`` (an organization's), a page at a time, in ``container``:
// ``noun`` counts it, ``columns`` head the table (captioned ``title``), ``row`` makes
// an item's cells (given the reload, for the item's actions); ``create`` (label,
// needs, open) is the create button, shown to a caller with its ``needs``.
export async function renderList(container, { title, path, noun, columns, row, create }) {
  const pages = new Pages();
  const listArea = h("div", {});

  async function load() {
    let answer;
    try {
      answer = await call("GET", orgPath(path), { query: { limit: PAGE_SIZE, cursor: pages.cursor } });
    } catch (error) {
      showError(error);
      return;
    }
    const rows = answer.result.map((item) => row(item, load));
    listArea.replaceChildren(
      h("p", { className: "count", text: `${answer.totalCount} ${noun}.` }),
      table(columns, rows, title),
      pager(pages, answer.nextCursor, load),
    );
  }

  const button = can(create.needs) ? h("button", { type: "button", className: "primary", text: create.label, onclick: () => create.open(load) }) : null;
  container.replaceChildren(h("div", { className: "toolbar" }, h("h2", { text: title }), button), listArea);
  clearMessages();
  await load();
}

// A form dialog whose ``save`` sends the form and returns the notice to show: once it
// is done, the dialog closes, the notice shows and ``refresh`` loads the list again.
// An API error ``save`` throws is shown in the dialog, which stays open (formDialog).
export function saveDialog(title, fields, submitLabel, save, refresh) {
  return formDialog(title, fields, submitLabel, async (form, dialog) => {
    const notice = await save(form);
    dialog.close();
    showNotice(notice);
    refresh();
  });
}
