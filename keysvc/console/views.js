// The console's views, in the order of the navigation. A view is a module whose
// default export is {id, title, needs, render(container)}: "needs" is the permission
// that shows it (null: every key, the API's answer saying who may use it), and
// render fills the container through the API client (api.js). A new view is a
// module and a line here; a new action on a key is an entry of KEY_ACTIONS in keys.js.

import activities from "./activities.js";
import identities from "./identities.js";
import keys from "./keys.js";
import roles from "./roles.js";

export const VIEWS = [keys, roles, identities, activities];
