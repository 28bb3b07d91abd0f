// njs helper for docs/nginx-auth-request.conf (nginx's njs module, 0.7 or later:
// Debian's libnginx-mod-http-js), read through one js_set variable. A request that
// calls njs pays for an njs VM of its own and then for the call (docs/PERFORMANCE.md).

var crypto = require('crypto');

// The credentials' part of the cache key: the SHA-256 digest (hex) of the Authorization
// header nginx forwards ($http_authorization), "-" without one. nginx writes the cache
// key into each cache file: with the digest there, no secret is ever written to disk.
// Never "": the config refuses "" (400), which is what nginx makes of the variable when
// njs fails, so an error here refuses the request rather than share a cache entry.
function credentials(r) {
    var sent = r.rawVariables.http_authorization;
    if (sent === undefined) {
        return '-';
    }
    return crypto.createHash('sha256').update(sent).digest('hex');
}

export default {credentials};
