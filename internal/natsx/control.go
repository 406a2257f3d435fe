package natsx

// NotifierResetPrefix starts the core NATS subjects (not a stream) on which the API tells
// every notifier process that an operator fixed a client's endpoint (a redrive, a resend or a
// re-enable): each resets that client's circuit breaker and sends at once.
const NotifierResetPrefix = "locks.control.notifier.reset."

// NotifierResetSubject is the reset subject of one client; NotifierResetSubject("*") is what
// the notifier subscribes to.
func NotifierResetSubject(clientID string) string { return NotifierResetPrefix + clientID }

// NotifierChangedPrefix starts the core NATS subjects on which the API tells every notifier
// process that a client's registry entry changed (its URL, secret, filters, subscriptions, or
// the client deleted): rows it had claimed ahead for that client are claimed again and read
// afresh instead of being sent with what their claim read.
const NotifierChangedPrefix = "locks.control.notifier.changed."

// NotifierChangedSubject is the changed subject of one client; ("*") is the subscription.
func NotifierChangedSubject(clientID string) string { return NotifierChangedPrefix + clientID }
