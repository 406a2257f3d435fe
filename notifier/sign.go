package notifier

import "github.com/lock-sensors/lock-sensors/internal/whsign"

// The signing code lives in internal/whsign, shared with the alerter's operator webhook.
var (
	// ErrSecret says a client's signing secret is not `whsec_<base64>`.
	ErrSecret = whsign.ErrSecret
	// Signature is whsign.Signature: the webhook-signature header of docs/contract.md section 2.
	Signature = whsign.Signature
)
