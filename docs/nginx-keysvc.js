// njs helpers for docs/nginx-auth-request.conf (nginx's njs module, 0.7 or later:
// Debian's libnginx-mod-http-js). Each is read through a js_set variable.

var crypto = require('crypto');

// The credentials' part of the cache key: the SHA-256 digest (hex) of the Authorization
// header as sent, "-" without one. nginx writes the cache key into each cache file: with
// the digest there, no secret is ever written to disk.
function credentials(r) {
    var sent = r.rawVariables.http_authorization;
    if (sent === undefined) {
        return '-';
    }
    return crypto.createHash('sha256').update(sent).digest('hex');
}

// "1" when the request carries a header only keysvc's answer may give the upstream
// (any X-Key-*, any X-Credits-*, X-Organization-Id), under any spelling, or an
// Authorization header with a "|" (no valid credentials have one): such a request is
// refused before the auth subrequest. "" otherwise.
var KEYSVC_HEADER = /^x-(key-|credits-|organization-id$)/i;

function refused(r) {
    var sent = r.rawHeadersIn;
    for (var i = 0; i < sent.length; i++) {
        if (KEYSVC_HEADER.test(sent[i][0])) {
            return '1';
        }
        if (sent[i][0].toLowerCase() === 'authorization' && sent[i][1].indexOf('|') !== -1) {
            return '1';
        }
    }
    return '';
}

export default {credentials, refused};
