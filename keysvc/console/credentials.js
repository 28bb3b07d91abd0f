// Credentials made in the browser for hashData: keysvc's formats
// (keysvc/credentials.py), from crypto.getRandomValues, and their SHA-256 in
// base64, the form hashData carries. WebCrypto needs a secure context: https,
// or http on localhost / 127.0.0.1.

const BASE62 = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";
const KEY_ID_LENGTH = 20;
const SECRET_PREFIX = "keysvc_";
const SECRET_RANDOM_LENGTH = 36;
const CHECKSUM_LENGTH = 6;
export const SUFFIX_LENGTH = 4;

// Uniform: bytes below 248 (4 x 62) map evenly onto the 62 characters.
function randomBase62(length) {
  let out = "";
  while (out.length < length) {
    for (const byte of crypto.getRandomValues(new Uint8Array(length + 8))) {
      if (byte < 248 && out.length < length) out += BASE62[byte % 62];
    }
  }
  return out;
}

const CRC_TABLE = Array.from({ length: 256 }, (_, n) => {
  let c = n;
  for (let k = 0; k < 8; k += 1) c = c & 1 ? 0xedb88320 ^ (c >>> 1) : c >>> 1;
  return c >>> 0;
});

function crc32(text) {
  let crc = 0xffffffff;
  for (const byte of new TextEncoder().encode(text)) {
    crc = CRC_TABLE[(crc ^ byte) & 0xff] ^ (crc >>> 8);
  }
  return (crc ^ 0xffffffff) >>> 0;
}

function base62(number, width) {
  let digits = "";
  let rest = number;
  while (rest > 0) {
    digits = BASE62[rest % 62] + digits;
    rest = Math.floor(rest / 62);
  }
  return digits.padStart(width, BASE62[0]);
}

export function newKeyId() {
  return randomBase62(KEY_ID_LENGTH);
}

// keysvc_ + 36 random base62 characters + their base62 CRC32: what keysvc makes.
export function newSecret() {
  const body = randomBase62(SECRET_RANDOM_LENGTH);
  return SECRET_PREFIX + body + base62(crc32(body), CHECKSUM_LENGTH);
}

export async function sha256Base64(value) {
  if (!window.isSecureContext || !crypto.subtle) {
    throw new Error("hashData needs a secure context: open the console over https or on localhost");
  }
  const digest = await crypto.subtle.digest("SHA-256", new TextEncoder().encode(value));
  let binary = "";
  for (const byte of new Uint8Array(digest)) binary += String.fromCharCode(byte);
  return btoa(binary);
}

// A new pair and the hashData that registers it.
export async function hashedPair() {
  const keyId = newKeyId();
  const secret = newSecret();
  const hashData = {
    keyIdHash: await sha256Base64(keyId),
    keyIdSuffix: keyId.slice(-SUFFIX_LENGTH),
    keySecretHash: await sha256Base64(secret),
  };
  return { keyId, secret, hashData };
}
