package event

import "time"

// DeadDelivery is a dead-lettered delivery of an event to a client: every attempt failed.
// The notifier keeps them; the admin API lists and redrives them through its DeadLetters.
type DeadDelivery struct {
	ID         int64 // the delivery's row id: lists page by it
	EventID    string
	ClientID   string
	SensorID   string
	Revision   int64
	Attempts   int
	LastStatus int
	LastError  string
	CreatedAt  time.Time
	DeadAt     time.Time
	Event      Event // zero when the stored event cannot be decoded
}
