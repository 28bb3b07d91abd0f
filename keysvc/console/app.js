// The console's entry point: signing in and out, and the navigation between views.
// The secret is read from its field once and the field cleared at once; after that
// only api.js holds it, in memory, until sign-out or the tab closes.

import * as api from "./api.js";
import { clearMessages, closeAllDialogs, h, showError } from "./ui.js";
import { VIEWS } from "./views.js";

const form = document.getElementById("sign-in");
const keyIdInput = document.getElementById("key-id");
const secretInput = document.getElementById("key-secret");
const nav = document.getElementById("nav");
const view = document.getElementById("view");
const who = document.getElementById("who");
const whoName = document.getElementById("who-name");

function show(chosen) {
  for (const button of nav.querySelectorAll("button")) {
    if (button.dataset.view === chosen.id) button.setAttribute("aria-current", "page");
    else button.removeAttribute("aria-current");
  }
  chosen.render(view);
}

function signedIn(caller) {
  form.hidden = true;
  whoName.textContent = `${caller.name} (${caller.permissions.join(", ")})`;
  who.hidden = false;
  const allowed = VIEWS.filter((v) => v.needs === null || api.can(v.needs));
  nav.replaceChildren(...allowed.map((v) => h("button", { type: "button", text: v.title, "data-view": v.id, onclick: () => show(v) })));
  nav.hidden = false;
  view.hidden = false;
  // Never empty: a view with needs null is listed for every key.
  show(allowed[0]);
  const first = nav.querySelector("button");
  if (first) first.focus();
}

function signedOut() {
  api.signOut();
  closeAllDialogs();
  clearMessages();
  nav.replaceChildren();
  view.replaceChildren();
  whoName.textContent = "";
  nav.hidden = true;
  view.hidden = true;
  who.hidden = true;
  form.hidden = false;
  keyIdInput.value = "";
  secretInput.value = "";
  keyIdInput.focus();
}

form.addEventListener("submit", async (event) => {
  event.preventDefault();
  const keyId = keyIdInput.value.trim();
  let secret = secretInput.value;
  // Out of the page at once: no field keeps the secret.
  secretInput.value = "";
  keyIdInput.value = "";
  const button = form.querySelector("button[type=submit]");
  button.disabled = true;
  try {
    const caller = await api.signIn(keyId, secret);
    secret = null;
    clearMessages();
    signedIn(caller);
  } catch (error) {
    secret = null;
    keyIdInput.value = keyId;
    showError(error);
    secretInput.focus();
  } finally {
    button.disabled = false;
  }
});

document.getElementById("sign-out").addEventListener("click", signedOut);
// Leaving the page forgets the key; a page restored from the back-forward cache
// starts signed out.
window.addEventListener("pagehide", () => api.signOut());
window.addEventListener("pageshow", (event) => {
  if (event.persisted) signedOut();
});
keyIdInput.focus();
