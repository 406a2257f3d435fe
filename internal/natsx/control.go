package natsx

// NotifierResetPrefix starts the core NATS subjects (not a stream) on which the API tells
// every notifier process that an operator fixed a client's endpoint (a redrive, a resend or a
// re-enable): each resets that client's circuit breaker and sends at once.
const NotifierResetPrefix = "locks.control.notifier.reset."

// NotifierResetSubject is the reset subject of one client; NotifierResetSubject("*") is what
// the notifier subscribes to.
func NotifierResetSubject(clientID string) string { return NotifierResetPrefix + clientID }
