// The console's views, in the order of the navigation. A view is a module whose
// default export is {id, title, needs, render(container)}: "needs" is the permission
// that shows it, and render fills the container through the API client (api.js).
// A new view (an activity log, a usage chart) is a module and a line here; a new
// action on a key (rotate) is an entry of KEY_ACTIONS in keys.js.

import keys from "./keys.js";
import roles from "./roles.js";

export const VIEWS = [keys, roles];
