// njs helper for docs/nginx-auth-request.conf (nginx's njs module, 0.7 or later:
// Debian's libnginx-mod-http-js), read through one js_set variable. A request that
// calls njs pays for an njs VM of its own and then for each call: one call does both
// jobs (docs/PERFORMANCE.md).

var crypto = require('crypto');

// Headers only keysvc's answer may give the upstream: any X-Key-*, any X-Credits-*,
// X-Organization-Id, under any spelling.
var KEYSVC_HEADER = /^x-(key-|credits-|organization-id$)/i;
var LOWER_X = 120;
var UPPER_X = 88;

// The credentials' part of the cache key: the SHA-256 digest (hex) of the Authorization
// header nginx forwards ($http_authorization), "-" without one. nginx writes the cache
// key into each cache file: with the digest there, no secret is ever written to disk.
// "" for a request that carries a header only keysvc's answer may give: the config
// refuses it (400), as it refuses "" when njs fails. Only a name that starts with an x
// goes through the regex.
function credentials(r) {
    for (var name in r.headersIn) {
        var first = name.charCodeAt(0);
        if ((first === LOWER_X || first === UPPER_X) && KEYSVC_HEADER.test(name)) {
            return '';
        }
    }
    var sent = r.rawVariables.http_authorization;
    if (sent === undefined) {
        return '-';
    }
    return crypto.createHash('sha256').update(sent).digest('hex');
}

export default {credentials};
