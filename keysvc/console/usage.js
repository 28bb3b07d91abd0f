// A key's usage by outcome over time (GET .../keys/{keyId}/usage), for its details:
// stacked bars drawn as plain SVG, a legend naming the outcomes, and the same
// numbers as a table for screen readers and for anyone who wants the counts.

import { call, orgPath } from "./api.js";
import { errorNode, field, h, time } from "./ui.js";

// The API's outcomes, in the order they are stacked (success at the bottom).
export const OUTCOMES = [
  ["success", "Admitted"],
  ["disabled", "Disabled"],
  ["expired", "Expired"],
  ["ipDenied", "IP denied"],
  ["forbidden", "Forbidden"],
  ["rateLimited", "Rate limited"],
  ["creditsExhausted", "Credits exhausted"],
];
// How far back each granularity looks: a readable number of bars, within the
// API's 1,440 buckets.
const SPANS = {
  minute: { label: "minute (last hour)", ms: 3600 * 1000 },
  hour: { label: "hour (last 24 hours)", ms: 24 * 3600 * 1000 },
  day: { label: "day (last 30 days)", ms: 30 * 24 * 3600 * 1000 },
};
const SVG = "http://www.w3.org/2000/svg";
const WIDTH = 600;
const HEIGHT = 180;
const AXIS = 40;

function svg(tag, attributes = {}, ...children) {
  const element = document.createElementNS(SVG, tag);
  for (const [name, value] of Object.entries(attributes)) element.setAttribute(name, String(value));
  for (const child of children) element.append(child);
  return element;
}

// Whole seconds, as the API's examples write them.
const iso = (date) => date.toISOString().replace(/\.\d+Z$/, "Z");
const total = (bucket) => OUTCOMES.reduce((sum, [name]) => sum + bucket[name], 0);

function chart(series, titleId) {
  const peak = Math.max(1, ...series.map(total));
  const plot = HEIGHT - 28;
  const step = (WIDTH - AXIS) / Math.max(1, series.length);
  const bars = [];
  series.forEach((bucket, index) => {
    let top = plot;
    for (const [name] of OUTCOMES) {
      if (bucket[name] === 0) continue;
      const height = (bucket[name] / peak) * (plot - 10);
      top -= height;
      bars.push(svg("rect", { x: AXIS + index * step + step * 0.1, y: top, width: step * 0.8, height, class: `outcome-${name}` }));
    }
  });
  return svg(
    "svg",
    { viewBox: `0 0 ${WIDTH} ${HEIGHT}`, role: "img", "aria-labelledby": titleId, class: "usage-chart" },
    svg("line", { x1: AXIS, y1: plot, x2: WIDTH, y2: plot, class: "axis" }),
    svg("text", { x: AXIS - 6, y: 18, "text-anchor": "end", class: "tick" }, String(peak)),
    svg("text", { x: AXIS - 6, y: plot, "text-anchor": "end", class: "tick" }, "0"),
    svg("text", { x: AXIS, y: HEIGHT - 4, class: "tick" }, time(series[0].start)),
    svg("text", { x: WIDTH, y: HEIGHT - 4, "text-anchor": "end", class: "tick" }, time(series[series.length - 1].start)),
    ...bars,
  );
}

function legend() {
  return h(
    "ul",
    { className: "legend", "aria-hidden": "true" },
    OUTCOMES.map(([name, label]) => h("li", {}, h("span", { className: `swatch outcome-${name}` }), ` ${label}`)),
  );
}

// The buckets with any authentication, and the totals: the numbers the bars draw.
function countsTable(series, caption) {
  const used = series.filter((bucket) => total(bucket) > 0);
  const sums = Object.fromEntries(OUTCOMES.map(([name]) => [name, series.reduce((sum, bucket) => sum + bucket[name], 0)]));
  const columns = ["Bucket start", ...OUTCOMES.map(([, label]) => label), "Total"];
  const row = (first, counts, cell = "td") =>
    h("tr", {}, h("th", { scope: "row", text: first }), OUTCOMES.map(([name]) => h(cell, { text: String(counts[name]), "data-outcome": name })), h(cell, { text: String(total(counts)), "data-outcome": "total" }));
  return h(
    "details",
    { className: "usage-table" },
    h("summary", { text: "The counts as a table" }),
    h(
      "div",
      { className: "table-wrap" },
      h(
        "table",
        {},
        h("caption", { text: caption }),
        h("thead", {}, h("tr", {}, columns.map((column) => h("th", { scope: "col", text: column })))),
        h("tbody", {}, used.map((bucket) => row(time(bucket.start), bucket))),
        h("tfoot", {}, row("Total", sums)),
      ),
    ),
  );
}

function drawn(answer, granularity) {
  const series = answer.series;
  const sums = OUTCOMES.map(([name, label]) => `${label} ${series.reduce((sum, bucket) => sum + bucket[name], 0)}`);
  const all = series.reduce((sum, bucket) => sum + total(bucket), 0);
  const titleId = `usage-title-${crypto.randomUUID()}`;
  const summary = `${all} authentications by ${granularity} from ${time(answer.from)} to ${time(answer.to)}: ${sums.join(", ")}.`;
  const empty = "Buckets without any authentication are left out.";
  return [
    h("p", { id: titleId, className: "usage-summary", text: summary }),
    chart(series, titleId),
    legend(),
    countsTable(series, `Authentications by ${granularity} and outcome. ${empty}`),
  ];
}

// A section that loads the key's usage, and again when the granularity changes.
export function usagePanel(key) {
  const choice = h(
    "select",
    { name: "granularity" },
    Object.entries(SPANS).map(([value, span]) => h("option", { value, text: span.label })),
  );
  choice.value = "hour";
  const area = h("div", { className: "usage-area", "aria-live": "polite" });
  let latest = 0;
  const load = async () => {
    // Only the last choice's answer is drawn, whichever arrives last.
    latest += 1;
    const mine = latest;
    const granularity = choice.value;
    // No "to": the server's now, rounded up to a whole bucket, holds the latest requests
    // (this clock's, cut to whole seconds, could end just before them).
    const query = { granularity, from: iso(new Date(Date.now() - SPANS[granularity].ms)) };
    area.setAttribute("aria-busy", "true");
    let shown;
    try {
      const answer = await call("GET", orgPath(`/keys/${key.id}/usage`), { query });
      shown = drawn(answer.result, granularity);
    } catch (error) {
      shown = [errorNode(error)];
    }
    if (mine !== latest) return;
    area.replaceChildren(...shown);
    area.removeAttribute("aria-busy");
  };
  choice.addEventListener("change", load);
  const refresh = h("button", { type: "button", text: "Refresh usage", onclick: load });
  load();
  return h(
    "section",
    { className: "usage", "aria-label": "Usage" },
    h("h3", { text: "Usage" }),
    h("div", { className: "usage-controls" }, field("Granularity", choice), refresh),
    h("p", { className: "help", text: "Counts are written every few seconds; Refresh shows the latest." }),
    area,
  );
}
