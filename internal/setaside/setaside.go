// Package setaside records the log messages a consumer refuses (invariant 9: one bad message
// stops nothing else). A consumer that meets a message it can never apply (a forged or
// malformed envelope: see event.CheckLog and event.CheckEvent) records it in the SET_ASIDE
// stream with its reason before it acks or commits past it, counts it, logs it once, and
// moves on; operators list the records through the admin API (GET /v1/set-aside).
//
// Every part already has NATS, so no part needs a new database for this; the stream's
// limits (natsx.SetAside*) keep a flood from filling the disk.
package setaside

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/lock-sensors/lock-sensors/internal/backoff"
	"github.com/lock-sensors/lock-sensors/internal/event"
	"github.com/lock-sensors/lock-sensors/internal/natsx"
	"github.com/lock-sensors/lock-sensors/internal/part"
)

// MaxPayload is the prefix of a refused message kept in its record: enough to see what it
// was, and bounded so that 5,000-character ids or a megabyte of garbage cost little.
const MaxPayload = 1024

// Record is one set-aside message.
type Record struct {
	// Seq is the record's sequence in SET_ASIDE (filled when listed).
	Seq uint64 `json:"-"`
	// Consumer is the part that refused it: state, history, watchdog or notifier.
	Consumer string `json:"consumer"`
	// Stream, StreamSeq and Subject locate the message in the log.
	Stream    string `json:"stream"`
	StreamSeq uint64 `json:"stream_seq"`
	Subject   string `json:"subject"`
	// Reason is one of event.Reason*; Detail says more.
	Reason string `json:"reason"`
	Detail string `json:"detail"`
	// Time is when it was set aside.
	Time time.Time `json:"time"`
	// Size is the message's size; Payload its first MaxPayload bytes.
	Size    int    `json:"size"`
	Payload []byte `json:"payload"`
}

// MsgID is the Nats-Msg-Id of a record, so that a consumer that sets the same message aside
// again (it crashed before its ack) records it once.
func MsgID(consumer, stream string, seq uint64) string {
	return consumer + "/" + stream + "/" + strconv.FormatUint(seq, 10)
}

// Recorder sets messages aside for one consumer.
type Recorder struct {
	consumer string
	js       jetstream.JetStream
	log      *slog.Logger
	total    *prometheus.CounterVec
}

// retry is the delay between tries of a record while NATS is away.
var retry = backoff.Policy{Min: 200 * time.Millisecond, Max: 5 * time.Second}

// NewRecorder returns the recorder of consumer (a part's name). The counter
// locks_set_aside_total{consumer,reason} is shared by every part of a process: a second
// registration reuses the first.
func NewRecorder(consumer string, js jetstream.JetStream, log *slog.Logger, reg prometheus.Registerer) (*Recorder, error) {
	if consumer == "" {
		return nil, errors.New("setaside: the consumer's name is required")
	}
	if err := part.Require("setaside "+consumer, part.Dep{Name: "JS", Value: js}, part.Dep{Name: "Logger", Value: log},
		part.Dep{Name: "Registerer", Value: reg}); err != nil {
		return nil, err
	}
	total := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "locks_set_aside_total",
		Help: "Log messages a consumer refused and set aside in SET_ASIDE, by consumer and reason."},
		[]string{"consumer", "reason"})
	if err := reg.Register(total); err != nil {
		var are prometheus.AlreadyRegisteredError
		if !errors.As(err, &are) {
			return nil, fmt.Errorf("setaside metrics: %w", err)
		}
		existing, ok := are.ExistingCollector.(*prometheus.CounterVec)
		if !ok {
			return nil, fmt.Errorf("setaside metrics: %w", err)
		}
		total = existing
	}
	return &Recorder{consumer: consumer, js: js, log: log, total: total}, nil
}

// SetAside records the message at seq of stream (its subject and data) with the reason of
// why (an error wrapping event.ErrInvalid; any other is recorded as "other"). It retries
// until the record is stored or ctx is done, so the caller may ack past the message only
// when it returns nil: the message is then kept, as a record, and not lost.
func (r *Recorder) SetAside(ctx context.Context, stream string, seq uint64, subject string, data []byte, why error) error {
	reason := event.ReasonOf(why)
	if reason == "" {
		reason = "other"
	}
	rec := Record{Consumer: r.consumer, Stream: stream, StreamSeq: seq, Subject: subject, Reason: reason,
		Time: time.Now().UTC(), Size: len(data), Payload: data[:min(len(data), MaxPayload)]}
	if why != nil {
		rec.Detail = why.Error()
	}
	if len(rec.Subject) > MaxPayload {
		rec.Subject = rec.Subject[:MaxPayload]
	}
	body, err := json.Marshal(rec)
	if err != nil {
		return fmt.Errorf("encode set-aside record: %w", err)
	}
	msg := &nats.Msg{Subject: natsx.SetAsideSubject(r.consumer), Data: body}
	for attempt := 1; ; attempt++ {
		pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		_, err = r.js.PublishMsg(pctx, msg, jetstream.WithMsgID(MsgID(r.consumer, stream, seq)))
		cancel()
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			return fmt.Errorf("set aside %s seq %d: %w", stream, seq, ctx.Err())
		}
		// NATS restarting: the message waits for its record, and its partition with it.
		if attempt%10 == 1 {
			r.log.Warn("record a set-aside message; retrying", "stream", stream, "seq", seq, "attempt", attempt, "err", err)
		}
		if !backoff.Sleep(ctx, retry.Next(attempt)) {
			return fmt.Errorf("set aside %s seq %d: %w", stream, seq, ctx.Err())
		}
	}
	r.total.WithLabelValues(r.consumer, reason).Inc()
	r.log.Error("log message set aside: it can never be applied; its partition moves on (GET /v1/set-aside lists it)",
		"consumer", r.consumer, "stream", stream, "seq", seq, "subject", rec.Subject, "reason", reason, "err", why)
	return nil
}

// List returns up to limit records after SET_ASIDE sequence after (0: from the oldest),
// oldest first, and the sequence to continue after (0 when there is no more).
func List(ctx context.Context, js jetstream.JetStream, after uint64, limit int) ([]Record, uint64, error) {
	if limit < 1 {
		limit = 100
	}
	st, err := js.Stream(ctx, natsx.SetAsideStream)
	if err != nil {
		return nil, 0, fmt.Errorf("look up %s: %w", natsx.SetAsideStream, err)
	}
	info := st.CachedInfo()
	if info.State.Msgs == 0 || after >= info.State.LastSeq {
		return nil, 0, nil
	}
	start := max(after+1, info.State.FirstSeq)
	// An ordered consumer reads the page without leaving a durable behind.
	oc, err := st.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{
		DeliverPolicy: jetstream.DeliverByStartSequencePolicy, OptStartSeq: start})
	if err != nil {
		return nil, 0, fmt.Errorf("read %s: %w", natsx.SetAsideStream, err)
	}
	// Records leave only from the front (age, count), so the page's size is known and the
	// fetch need not wait out its timeout for messages that do not exist.
	want := int(min(uint64(limit), info.State.LastSeq-start+1))
	batch, err := oc.Fetch(want, jetstream.FetchMaxWait(5*time.Second))
	if err != nil {
		return nil, 0, fmt.Errorf("read %s: %w", natsx.SetAsideStream, err)
	}
	var out []Record
	var last uint64
	for m := range batch.Messages() {
		md, err := m.Metadata()
		if err != nil {
			continue
		}
		last = md.Sequence.Stream
		var rec Record
		if err := json.Unmarshal(m.Data(), &rec); err != nil {
			rec = Record{Reason: "unreadable record", Detail: err.Error()}
		}
		rec.Seq = md.Sequence.Stream
		out = append(out, rec)
	}
	if err := batch.Error(); err != nil && !errors.Is(err, jetstream.ErrNoMessages) && !errors.Is(err, context.DeadlineExceeded) {
		return nil, 0, fmt.Errorf("read %s: %w", natsx.SetAsideStream, err)
	}
	next := uint64(0)
	if last > 0 && last < info.State.LastSeq && len(out) == limit {
		next = last
	}
	return out, next, nil
}
