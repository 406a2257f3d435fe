// Check one lock-sensors webhook the way a receiver should, with Node.js's standard library
// only: docs/receiving-webhooks.md explains it, and e2e/receivers_test.go runs it against real
// deliveries.
//
//   node verify.js SECRET WEBHOOK_ID WEBHOOK_TIMESTAMP WEBHOOK_SIGNATURE < body
//
// exits 0 and prints the event's type and id when the signature is good, 1 otherwise.
'use strict';

const crypto = require('node:crypto');

// How far a webhook-timestamp may be from now: older deliveries are refused, so that a
// captured request cannot be replayed later.
const TOLERANCE_SECONDS = 5 * 60;

// verify returns the event if body (a Buffer, exactly as received), with headers (an object
// with the lower-case keys webhook-id, webhook-timestamp and webhook-signature, as Node's
// req.headers has them), was signed with secret (the client's signing_secret,
// whsec_<base64>) within TOLERANCE_SECONDS of now; it throws otherwise. During a secret
// rotation the header holds two signatures; one matching is enough.
function verify(secret, headers, body, now = Date.now() / 1000) {
  if (!secret.startsWith('whsec_')) throw new Error('secret is not whsec_<base64>');
  const key = Buffer.from(secret.slice('whsec_'.length), 'base64');
  const id = String(headers['webhook-id'] ?? '');
  const timestamp = String(headers['webhook-timestamp'] ?? '');
  if (!/^\d+$/.test(timestamp)) throw new Error('webhook-timestamp is not unix seconds');
  if (Math.abs(now - Number(timestamp)) > TOLERANCE_SECONDS) {
    throw new Error('webhook-timestamp is too far from now');
  }
  const expected = crypto.createHmac('sha256', key).update(`${id}.${timestamp}.`).update(body).digest();
  for (const signature of String(headers['webhook-signature'] ?? '').split(' ')) {
    const comma = signature.indexOf(',');
    if (comma < 0 || signature.slice(0, comma) !== 'v1') continue;
    const got = Buffer.from(signature.slice(comma + 1), 'base64');
    if (got.length === expected.length && crypto.timingSafeEqual(got, expected)) {
      return JSON.parse(body.toString('utf8'));
    }
  }
  throw new Error('no valid signature');
}

module.exports = { verify };

if (require.main === module) {
  const args = process.argv.slice(2);
  if (args.length !== 4) {
    console.error('usage: node verify.js SECRET WEBHOOK_ID WEBHOOK_TIMESTAMP WEBHOOK_SIGNATURE < body');
    process.exit(2);
  }
  const chunks = [];
  process.stdin.on('data', (c) => chunks.push(c));
  process.stdin.on('end', () => {
    const headers = { 'webhook-id': args[1], 'webhook-timestamp': args[2], 'webhook-signature': args[3] };
    try {
      const event = verify(args[0], headers, Buffer.concat(chunks));
      console.log('verified', event.type, event.id);
    } catch (e) {
      console.error('rejected:', e.message);
      process.exit(1);
    }
  });
}
