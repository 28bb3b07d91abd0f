// A key's externalId, meta and credits (issue 29) in the keys view: their rows in a
// key's details, their fields in the create and edit forms, and the body those send.

import { field, h, time } from "./ui.js";

export function creditsText(credits) {
  if (!credits) return "unlimited";
  let text = `${credits.remaining} remaining`;
  const refill = credits.refill;
  if (refill) {
    const when = refill.interval === "daily" ? "daily" : `monthly on day ${refill.refillDay}`;
    text += `; refilled to ${refill.amount} ${when}, next ${time(credits.nextRefillAt)}`;
  }
  return text;
}

export function extraRows(key) {
  return [
    ["External ID", key.externalId || "none"],
    ["Meta", key.meta ? JSON.stringify(key.meta) : "none"],
    ["Credits", creditsText(key.credits)],
  ];
}

export function extraFields(key, disabled) {
  const credits = key && key.credits;
  const refill = credits && credits.refill;
  const externalId = h("input", { name: "externalId", maxLength: 255, value: (key && key.externalId) || "", disabled });
  const meta = h("textarea", { name: "meta", rows: 3, spellcheck: false, value: key && key.meta ? JSON.stringify(key.meta, null, 2) : "", disabled });
  const remaining = h("input", { name: "creditsRemaining", type: "number", min: 0, step: 1, value: credits ? String(credits.remaining) : "", disabled });
  const interval = h("select", { name: "refillInterval", disabled }, h("option", { value: "", text: "never" }), h("option", { value: "daily", text: "daily" }), h("option", { value: "monthly", text: "monthly" }));
  interval.value = refill ? refill.interval : "";
  const amount = h("input", { name: "refillAmount", type: "number", min: 1, step: 1, value: refill ? String(refill.amount) : "", disabled });
  const day = h("input", { name: "refillDay", type: "number", min: 1, max: 31, step: 1, value: refill && refill.refillDay ? String(refill.refillDay) : "1", disabled });
  return [
    field("External ID", externalId, "Your own ID for who the key is for (a customer, tenant or user). Empty: none."),
    field("Meta", meta, "A JSON object for your own use, at most 4 KiB. Empty: none."),
    field("Credits", remaining, "What verify may spend. Empty: unlimited."),
    field("Refill", interval, "At 00:00 UTC, credits are set to the amount."),
    field("Refill amount", amount),
    field("Refill day (monthly)", day, "Past the month's end: its last day."),
  ];
}

function whole(text, what) {
  const value = Number(text);
  if (!Number.isInteger(value)) throw new Error(`${what}: must be a whole number`);
  return value;
}

// The fields' values as the API takes them: null for each one left empty.
export function extraBody(form) {
  const els = form.elements;
  let meta = null;
  if (els.meta.value.trim()) {
    try {
      meta = JSON.parse(els.meta.value);
    } catch {
      throw new Error("Meta: must be a JSON object");
    }
    if (meta === null || typeof meta !== "object" || Array.isArray(meta)) throw new Error("Meta: must be a JSON object");
  }
  let credits = null;
  if (els.creditsRemaining.value.trim()) {
    credits = { remaining: whole(els.creditsRemaining.value, "Credits"), refill: null };
    if (els.refillInterval.value) {
      credits.refill = { interval: els.refillInterval.value, amount: whole(els.refillAmount.value, "Refill amount") };
      if (els.refillInterval.value === "monthly") credits.refill.refillDay = whole(els.refillDay.value, "Refill day");
    }
  }
  return { externalId: els.externalId.value.trim() || null, meta, credits };
}
